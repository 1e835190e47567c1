// SessionTable: the client sessions attached to heaps. A session starts at
// Attach with a one-time token for heapd.fd.sock; redeeming the token there
// "connects" it, and it ends with Detach, when its fd-socket connection
// closes (the client exited or died), or when its token expires unredeemed.
// Whoever ends a session takes it out of the table with Take(); exactly one
// caller gets it, then ends it on its heap.
//
// A session's calls run under its mutex and first check `ended`, so nothing
// is leased to a session after it was reclaimed.
// Thread-safe.
#ifndef HEAPD_DAEMON_SESSION_TABLE_H_
#define HEAPD_DAEMON_SESSION_TABLE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/lease_types.h"
#include "daemon/caller.h"
#include "daemon/heap_registry.h"

namespace heapd {

struct Session {
  Session(ClientId id, std::shared_ptr<ServedHeap> heap, Caller caller, bool read_only)
      : id(id), heap(std::move(heap)), caller(caller), read_only(read_only) {}

  const ClientId id;
  const std::shared_ptr<ServedHeap> heap;
  const Caller caller;  // the attaching process
  const bool read_only;
  const absl::Time attached = absl::Now();
  // When its last sync succeeded (0: never); snapshots wait for it.
  std::atomic<int64_t> last_sync_unix_ns{0};

  absl::Mutex mu;
  bool ended ABSL_GUARDED_BY(mu) = false;
};

class SessionTable {
 public:
  // `token_lifetime`: how long an Attach's token stays redeemable;
  // `max_per_user`: sessions one uid may have at once (root: no limit).
  SessionTable(absl::Duration token_lifetime, uint32_t max_per_user)
      : token_lifetime_(token_lifetime), max_per_user_(max_per_user) {}

  struct Started {
    std::shared_ptr<Session> session;
    std::string token;
  };
  // RESOURCE_EXHAUSTED if the caller's uid has max_per_user sessions.
  absl::StatusOr<Started> Start(std::shared_ptr<ServedHeap> heap, const Caller& caller,
                                bool read_only);

  // The session `id` for a call by `caller`. NOT_FOUND if there is none;
  // PERMISSION_DENIED if another user attached it.
  absl::StatusOr<std::shared_ptr<Session>> Get(ClientId id, const Caller& caller) const;

  // The session `id`, for its own fd-socket connection; null if it ended.
  std::shared_ptr<Session> Find(ClientId id) const;

  // Redeems a token on the fd socket. NOT_FOUND if unknown, used or
  // expired; PERMISSION_DENIED if `caller` is not the attaching user (the
  // token stays valid for its owner).
  absl::StatusOr<std::shared_ptr<Session>> Redeem(const std::string& token, const Caller& caller);

  // Takes session `id` out of the table; null if already taken.
  std::shared_ptr<Session> Take(ClientId id);

  // Takes the sessions whose token expired before they connected.
  std::vector<std::shared_ptr<Session>> TakeExpired(absl::Time now);

  std::vector<std::shared_ptr<Session>> List() const;
  // Sessions on heap `heap_name`, and whether they connected.
  size_t CountOn(absl::string_view heap_name) const;
  bool Connected(ClientId id) const;

 private:
  void Forget(uint32_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Entry {
    std::shared_ptr<Session> session;
    std::string token;  // empty once redeemed
    absl::Time token_deadline;
  };

  const absl::Duration token_lifetime_;
  const uint32_t max_per_user_;
  mutable absl::Mutex mu_;
  std::map<ClientId, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ClientId> tokens_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint32_t> per_user_ ABSL_GUARDED_BY(mu_);  // sessions by uid
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_SESSION_TABLE_H_
