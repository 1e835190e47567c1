// Sessions: the lifecycle of every client session, in one place.
//
//   Start       an Attach: a session on a heap, its first leases, a one-time
//               token for heapd.fd.sock;
//   Redeem      the token presented on heapd.fd.sock: the heap's data fd;
//               the connection is the session's lifeline from then on;
//   Lease, AllocateLarge, Free, Sync (and its parts), Bind, Unbind
//               the session's calls, each under the session's lock after
//               checking it is the caller's and has not ended;
//   Lookup      a name lookup on the session's fd-socket connection;
//   Detach      the end a client asks for: leases returned, persisted;
//   ends heapd notices — the fd-socket connection closed (the client exited
//   or died), the token expired unredeemed — reclaim the session: its leases
//   return at their last reported state, its uncommitted large objects are
//   freed, frees queued for it are resolved (allocator/chunk_directory.h).
//
// The fd server's thread must never wait: it only queues the ends it
// notices (ConnectionClosed, ExpireTokens) for the reapers, which may wait
// for a session busy in a sync. Ends are reaped per heap: one heap's at a
// time, in the order they came, on a few threads, so that a long rollback
// of one heap's dead session (every page it wrote put back) does not hold
// up the ends on other heaps. Redeem and Lookup take only brief,
// I/O-free locks (the session table, the heap's state lock).
//
// Lock order: Session::mu, then the heap's locks (heap/heap.h); the session
// table's lock is a leaf. Session::mu is held across one call of that
// session, its sync's flush included: only that session's calls and its end
// wait for it.
// Thread-safe.
#ifndef HEAPD_DAEMON_SESSIONS_H_
#define HEAPD_DAEMON_SESSIONS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/caller.h"
#include "daemon/heap_registry.h"
#include "daemon/metrics.h"
#include "daemon/session_table.h"

namespace heapd {

class Sessions {
 public:
  // Threads that end sessions heapd noticed (at most one per heap at once).
  static constexpr int kReapers = 4;

  Sessions(absl::Duration token_lifetime, uint32_t max_per_user, Metrics* metrics);
  // Ends the sessions queued for the reapers, then stops them.
  ~Sessions();
  Sessions(const Sessions&) = delete;
  Sessions& operator=(const Sessions&) = delete;

  // Starts a session of `caller` on `heap` (no I/O: callers may hold a lock
  // across it). REQUIRES: the caller may attach the heap so.
  // RESOURCE_EXHAUSTED at the caller's session limit.
  absl::StatusOr<SessionTable::Started> Start(std::shared_ptr<ServedHeap> heap,
                                              const Caller& caller, bool read_only);
  // The first leases of a session Start made (all or none; the heap may
  // grow). When they fail the session ends.
  absl::StatusOr<std::vector<LeaseGrant>> LeaseAtStart(const std::shared_ptr<Session>& session,
                                                       absl::Span<const LeaseWant> wants);

  // The session's calls. Each checks that session `id` is the caller's, has
  // not ended, and (for all of these) is read-write.
  struct Leased {
    std::vector<LeaseGrant> grants;
    uint64_t capacity_bytes = 0;
  };
  absl::StatusOr<Leased> Lease(uint64_t id, const Caller& caller,
                               absl::Span<const LeaseWant> wants);
  // An earlier part of a sync or detach (PersistentHeap::StageReports).
  absl::Status StageSyncPart(uint64_t id, const Caller& caller,
                             absl::Span<const LeaseReport> reports,
                             const ReserveReport& reserve = {});
  struct Allocated {
    uint64_t offset = 0;
    uint64_t size = 0;  // whole chunks
    uint64_t capacity_bytes = 0;
  };
  // With `reserve`: chunks the session carves large objects from, between
  // `min_size` (0: `size`) and `size` bytes (PersistentHeap::ReserveLarge).
  absl::StatusOr<Allocated> AllocateLarge(uint64_t id, const Caller& caller, uint64_t size,
                                          bool reserve = false, uint64_t min_size = 0);
  absl::Status Free(uint64_t id, const Caller& caller, absl::Span<const ObjectRef> objects);
  struct Synced {
    SyncResult result;
    uint64_t capacity_bytes = 0;
  };
  // `generation`: the session's content generations committed with it.
  absl::StatusOr<Synced> Sync(uint64_t id, const Caller& caller,
                              absl::Span<const LeaseReport> reports, uint64_t generation = 0,
                              const ReserveReport& reserve = {});
  // The session's client stored without pre-images
  // (PersistentHeap::StoresUnseen); told before its sync or detach.
  absl::Status StoresUnseen(uint64_t id, const Caller& caller);
  // Binds `entry` (its owner and time are set here).
  absl::Status Bind(uint64_t id, const Caller& caller, NameEntry entry);
  absl::StatusOr<NameEntry> Unbind(uint64_t id, const Caller& caller, const std::string& name);

  // Ends session `id` of `caller` as it asks: its leases go back with
  // `reports`, and the heap persists. Returns the heap's epoch. Even when
  // that fails, the session has ended as a crash would end it (its
  // leases and contents as at its last commit: see PersistentHeap::Reclaim).
  absl::StatusOr<uint64_t> Detach(uint64_t id, const Caller& caller,
                                  absl::Span<const LeaseReport> reports, uint64_t generation = 0,
                                  const ReserveReport& reserve = {});

  // heapd.fd.sock. Redeem: the session of `token` for `caller` and a new fd
  // of its heap's data file (read-only for a read-only session). Lookup:
  // the answer to one request on session `id`'s connection. Never block.
  struct Redeemed {
    ClientId session = 0;
    int fd = -1;  // the caller owns it
    // The session's content undo journal (heap/content_undo.h), opened for
    // appending; -1 for a read-only session or an untracked heap. Owned by
    // the caller.
    int journal_fd = -1;
  };
  absl::StatusOr<Redeemed> Redeem(const std::string& token, const Caller& caller);
  std::string AnswerFdRequest(ClientId id, absl::string_view request);
  // The connection of session `id` closed; queues its end. Never blocks.
  void ConnectionClosed(ClientId id);
  // Queues the end of sessions whose token expired unredeemed. Never blocks.
  void ExpireTokens();

  // Every session, for listings and waits.
  std::vector<std::shared_ptr<Session>> List() const { return table_.List(); }
  const SessionTable& table() const { return table_; }
  // The clients of heap `heap_name`: its sessions in the table and those
  // whose end is queued or under way. 0 means every session that was on it
  // has been reclaimed (its leases returned), so a removal or a check of the
  // heap's leases after a client died sees no session in between.
  size_t CountOn(absl::string_view heap_name) const;

 private:
  // A session's end queued for the reapers.
  struct Ending {
    std::shared_ptr<Session> session;
    const char* reason = nullptr;
    const char* why = nullptr;
  };
  // Runs `body` on session `id` of `caller` under the session's lock, and
  // logs a data file repair it caused.
  absl::Status OnSession(uint64_t id, const Caller& caller,
                         const std::function<absl::Status(Session&)>& body);
  // Ends `session` (reclaims it); `reason` is one of kReclaimReasons.
  void End(const std::shared_ptr<Session>& session, const char* reason, const char* why);
  // A reaper's loop: ends the next queued session of a heap no other
  // reaper is ending one of, until stopping with none left.
  void Reap();
  // Queues `ending` behind the others of its heap.
  void QueueEndLocked(Ending ending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(reaper_mu_);
  // Ends what is queued, then stops and joins the reapers.
  void StopReapers() ABSL_LOCKS_EXCLUDED(reaper_mu_);
  // Takes session `id` out of the table (null if already taken) to end it:
  // it counts among its heap's clients (CountOn) until Ended.
  std::shared_ptr<Session> TakeToEnd(ClientId id) ABSL_LOCKS_EXCLUDED(reaper_mu_);
  void Ended(const std::string& heap_name) ABSL_LOCKS_EXCLUDED(reaper_mu_);
  // Takes session `id` out of the table (if still there) and queues its
  // end for the reapers. Never waits for the session.
  void QueueEnd(ClientId id, const char* reason, const char* why) ABSL_LOCKS_EXCLUDED(reaper_mu_);

  SessionTable table_;
  Metrics* const metrics_;

  // Lock order: reaper_mu_, then the session table's lock. A session that
  // leaves the table enters `ending_on_` under reaper_mu_ (TakeToEnd) and
  // leaves it only after its end (Ended), so CountOn never misses it.
  mutable absl::Mutex reaper_mu_;
  // Queued ends by heap, in order; `ready_`: the heaps with queued ends
  // and no reaper on them (each at most once); `queued_`: all queued ends.
  absl::flat_hash_map<std::string, std::deque<Ending>> to_end_ ABSL_GUARDED_BY(reaper_mu_);
  std::deque<std::string> ready_ ABSL_GUARDED_BY(reaper_mu_);
  size_t queued_ ABSL_GUARDED_BY(reaper_mu_) = 0;
  // Heap name -> sessions on it being ended (queued for the reapers, or
  // ending in a call).
  absl::flat_hash_map<std::string, size_t> ending_on_ ABSL_GUARDED_BY(reaper_mu_);
  // Heaps a reaper is ending a session of now.
  absl::flat_hash_set<std::string> reaping_ ABSL_GUARDED_BY(reaper_mu_);
  bool stopping_ ABSL_GUARDED_BY(reaper_mu_) = false;
  std::vector<std::thread> reapers_;
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_SESSIONS_H_
