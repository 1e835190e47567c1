// ChunkDirectory: the daemon's record of every chunk of one heap — free,
// small-object (with its slot bitmap and the client leasing it) or part of a
// large run — and of the objects pinned by names. It is the only writer of
// allocator metadata; nothing of it lives in the data file.
//
// What is persisted (the "persisted view", see Persisted()):
//   - a small chunk: its class and the bitmap last reported by its lessee,
//     minus slots other clients freed since that were live in that report;
//   - a large run: its head and length, once its allocator committed it
//     (synced, detached or bound a name to it); uncommitted runs are free;
//   - chunks reserved for a client to carve large objects from are free.
//   - tails of large runs are never written: they follow from their head.
// On recovery no client is attached, so every lease is gone and an empty small
// chunk is free.
//
// Invariants (checked by CheckInvariants()):
//   - a chunk is kFree exactly when free_ holds it;
//   - a run's head has run_chunks = length; each tail's head_chunk names it;
//   - a small chunk is in leasable_[class] exactly when it has no lessee and
//     a free slot; clients_[c].leased holds exactly the chunks leased by c;
//   - clients_[c].reserved holds exactly the kReserved chunks whose lessee
//     is c; clients_[c].reserved_frees names only such chunks;
//   - remote_frees are slots of leased chunks, without repeats;
//   - every pin is a live object start.
// Not thread-safe: the owning PersistentHeap serializes calls.
#ifndef HEAPD_ALLOCATOR_CHUNK_DIRECTORY_H_
#define HEAPD_ALLOCATOR_CHUNK_DIRECTORY_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/free_runs.h"
#include "allocator/lease_types.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"

namespace heapd {

enum class ChunkKind : uint8_t {
  kFree = 0,
  kSmall = 1,
  kLargeHead = 2,
  kLargeTail = 3,  // in memory only
  kReserved = 4,   // in memory only: a client carves large objects from it
};

// The persisted image of one chunk.
struct ChunkRecord {
  uint32_t chunk = 0;
  ChunkKind kind = ChunkKind::kFree;
  uint32_t size_class = 0;      // kSmall
  uint32_t run_chunks = 0;      // kLargeHead
  std::vector<uint64_t> words;  // kSmall
};

struct SizeClassUsage {
  uint32_t chunks = 0;
  uint64_t live_objects = 0;
};

struct DirectoryStats {
  uint32_t capacity_chunks = 0;
  uint32_t free_chunks = 0;
  uint32_t small_chunks = 0;
  uint32_t leased_chunks = 0;         // small chunks leased
  uint32_t large_reserve_chunks = 0;  // chunks reserved for sessions' large objects
  uint32_t large_chunks = 0;
  uint64_t large_objects = 0;
  uint64_t live_objects = 0;     // small and large
  uint64_t allocated_bytes = 0;  // slot sizes of live small objects + large runs
  std::array<SizeClassUsage, kNumSizeClasses> by_class{};
};

struct ReclaimResult {
  uint32_t leases = 0;      // chunks whose lease was taken back
  uint32_t large_runs = 0;  // uncommitted large objects freed
  // Frees this client made that were later found wrong and not yet told
  // (it is gone: for the log).
  std::vector<std::string> rejected_frees;
};

// What a client learns from its report (a sync or detach).
struct ReportResult {
  // Frees by other clients applied to its chunks, and slots kept live for
  // names: the client updates its pool with these.
  std::vector<LeaseCorrection> corrections;
  // Frees this client made in chunks other clients lease that those
  // clients' reports showed wrong (not a live object): double frees. One
  // message each, naming the offset.
  std::vector<std::string> rejected_frees;
};

class ChunkDirectory {
 public:
  // A directory of `capacity_chunks` free chunks.
  explicit ChunkDirectory(uint32_t capacity_chunks);

  // Rebuilds a directory from persisted records: the last record of each
  // chunk wins, unlisted chunks are free. Fails with DATA_LOSS when records
  // contradict each other or the capacity.
  static absl::StatusOr<std::unique_ptr<ChunkDirectory>> FromRecords(
      uint32_t capacity_chunks, absl::Span<const ChunkRecord> records);

  ChunkDirectory(const ChunkDirectory&) = delete;
  ChunkDirectory& operator=(const ChunkDirectory&) = delete;

  uint32_t capacity_chunks() const { return static_cast<uint32_t>(chunks_.size()); }

  // Free chunks at the end of the heap (a growth extends their run).
  uint32_t FreeTailChunks() const;
  // Free chunks anywhere.
  uint32_t FreeChunks() const { return static_cast<uint32_t>(free_.free_chunks()); }

  // Adds free chunks up to `capacity_chunks`. REQUIRES: not a shrink.
  void Grow(uint32_t capacity_chunks);

  // Leases up to `count` chunks of `size_class` to `client`: first the
  // chunks of `reuse` it may take back as this class (Reclass), then
  // unleased partly used chunks, then free ones. Returns an empty vector
  // when no chunk is available (the caller grows the heap and retries).
  absl::StatusOr<std::vector<LeaseGrant>> Lease(ClientId client, uint32_t size_class,
                                                uint32_t count,
                                                absl::Span<const uint32_t> reuse = {});
  // Makes `client`'s leased chunk `chunk`, which its client emptied, a
  // chunk of `size_class` (still leased to it, empty): true if it did. Only
  // a chunk with no object as the daemon knows it (its last report, or as
  // it was leased, is empty: the last commit holds none there, so a crash
  // or the client's death leaves it empty too) and no free of another
  // queued there. One already of `size_class` is granted again, empty (a
  // client that did not hear of an earlier Reclass offers it again).
  // Frees deferred against its old objects are then void (its incarnation
  // moves on, as a chunk's that became free); reports of the old class
  // still on their way are stale (Stale). Anything else (not this
  // client's, not small, a hostile offer) is left as it is: false.
  bool Reclass(ClientId client, uint32_t chunk, uint32_t size_class);

  // Records `client`'s view of chunks it leases and returns what the daemon
  // changed in it: frees by others of slots live in the client's view (in
  // `reports`, or as last reported for chunks not in them) are applied and
  // told back as corrections. A pending free of a slot that is not live in
  // the report is given one more report (the object may have been
  // allocated after the report was taken), then rejected as a double free
  // and told to the client that made it. With `release`, the reported
  // leases end, and what they end with is final. All-or-nothing: a report
  // for a chunk the client does not lease, or of the wrong size, fails with
  // FAILED_PRECONDITION / INVALID_ARGUMENT and changes nothing.
  absl::StatusOr<ReportResult> Report(ClientId client, absl::Span<const LeaseReport> reports,
                                      bool release);
  // A report that says a class other than its chunk's: taken before the
  // chunk changed class (Reclass), skipped by Report and CheckReport.
  bool Stale(const LeaseReport& report) const;
  // Report's checks alone: OK iff Report(client, reports, ...) would change
  // the directory. Stays true until `client`'s leases change (only its own
  // Report, Reclaim and Reclass, under its serialized calls, change them).
  absl::Status CheckReport(ClientId client, absl::Span<const LeaseReport> reports) const;

  // Allocates a run of whole chunks for `size` bytes; the run stays
  // uncommitted until Commit(client) or a Pin. RESOURCE_EXHAUSTED if no free
  // run fits. REQUIRES: 0 < size.
  absl::StatusOr<uint64_t> AllocateLarge(ClientId client, uint64_t size);

  // Reserves for `client` the longest free run of at most `max_chunks`
  // chunks (taken from the start of a longer one), which carves large
  // objects from them itself (no round trip per object) and tells which by
  // TellReserve. Reserved chunks persist as free; those not placed are
  // freed when the session ends. RESOURCE_EXHAUSTED if no free run has
  // `min_chunks` (the caller grows the heap and retries).
  absl::StatusOr<LargePlacement> Reserve(ClientId client, uint32_t min_chunks, uint32_t max_chunks);

  // Takes what `client` tells of its reserved chunks. The large objects it
  // placed become its uncommitted large runs, as AllocateLarge's (committed
  // by its Commit, freed if it dies first); a free queued for an object's
  // first chunk (see Free) applies now. The runs it released are free
  // again. All-or-nothing: an object or run outside the client's reserved
  // chunks, of no chunks, or overlapping another fails with
  // INVALID_ARGUMENT naming it and changes nothing. A placement marked
  // `again` (sent again after a sync whose answer was lost) is placed if
  // its chunks are still reserved for the client and skipped otherwise.
  absl::Status TellReserve(ClientId client, const ReserveReport& report);
  // TellReserve's checks alone; stays true until `client`'s reserve changes
  // (only its own Reserve, TellReserve and end do that).
  absl::Status CheckReserveReport(ClientId client, const ReserveReport& report) const;
  // TellReserve without the checks. REQUIRES: CheckReserveReport(client,
  // report) was OK since `client`'s last Reserve, TellReserve or end.
  void ApplyReserveReport(ClientId client, const ReserveReport& report);

  // `client`'s report is complete (a sync's last part): a free queued for a
  // reserved chunk it has not placed is kept for one more report (the
  // object may have been carved after this report was taken), then
  // rejected and told to its freer.
  void SettleReservedFrees(ClientId client);

  // Frees objects on behalf of `client`: large runs (committed or not, by
  // any client), slots of unleased chunks, and slots of leased chunks —
  // another client's, or `client`'s own (a free it batched before it leased
  // the chunk). The last are queued for the lessee, whose own view is the
  // truth for them (it may have allocated the object since its last
  // report): they are validated against its next report (see Report), or
  // applied when its lease ends. A leased chunk stays leased to its lessee
  // alone. All-or-nothing: every offset is validated first as far as the
  // daemon can; one that is not the start of an object (interior pointer,
  // outside the heap, size of another class), a free of an object known
  // free, or a second free of a queued one fails with INVALID_ARGUMENT, one
  // bound by a name with FAILED_PRECONDITION; then nothing is freed. The
  // first chunk of a reserved run may start an object its client carved and
  // has not placed yet: that free is queued for the client (see TellReserve).
  absl::Status Free(ClientId client, absl::Span<const ObjectRef> objects);
  // What Free would say of `objects` now, changing nothing.
  absl::Status CheckFree(ClientId client, absl::Span<const ObjectRef> objects) const;

  // Makes `client`'s large allocations persistent (at its sync or detach).
  void Commit(ClientId client);

  // Ends `client`'s session: its leases return at their last reported state,
  // its uncommitted large runs and reserved chunks are freed (frees queued
  // for them are dropped: the objects died with it). Frees others queued in its chunks
  // are applied where that state has the object; where it does not, the
  // object was allocated after that state and dies with the session, so
  // the free has nothing left to do.
  ReclaimResult Reclaim(ClientId client);
  // Ends `client`'s session as it asked (a detach): its leases end at their
  // last reported state, which is final (frees others queued there that it
  // does not have are rejected, as by Report with `release`); its
  // uncommitted large runs and reserved chunks are freed (frees queued for
  // reserved chunks are rejected).
  ReclaimResult Release(ClientId client);

  // Marks the object at `object` bound by a name, so it stays live until
  // Unpin. The object must be live as the daemon knows it; `caller`'s own
  // leased slots are taken as live on its word, and its uncommitted large
  // runs are committed. client 0 is the daemon itself (recovery).
  absl::Status Pin(ClientId caller, ObjectRef object);

  // Drops one pin of `offset`. REQUIRES: it is pinned.
  void Unpin(uint64_t offset);

  // Persisted view of the chunks changed since the last call.
  std::vector<ChunkRecord> TakeDirtyRecords();

  // Persisted view of every chunk that is not free (a checkpoint).
  std::vector<ChunkRecord> AllRecords() const;

  DirectoryStats Stats() const;

  // Chunk `chunk` as a crash now would recover it (free, small with its
  // bitmap, or a committed large run's head). REQUIRES: within capacity.
  ChunkRecord PersistedRecord(uint32_t chunk) const { return Persisted(chunk); }
  // The first chunk of the large run `chunk` lies in (its head), else
  // `chunk` itself. REQUIRES: within capacity.
  uint32_t RunStart(uint32_t chunk) const {
    return chunks_[chunk].kind == ChunkKind::kLargeTail ? chunks_[chunk].head_chunk : chunk;
  }

  // Leases held by `client`.
  size_t LeaseCount(ClientId client) const;
  // The client leasing the small chunk that holds `offset`, the one that
  // allocated the large object at `offset` while it is uncommitted, or the
  // one `offset`'s chunk is reserved for; 0 if none.
  ClientId LesseeOf(uint64_t offset) const;
  // Whether `client` leases `chunk` as a chunk of small objects (not a
  // reserve, not a large object).
  bool LeasesSmall(ClientId client, uint32_t chunk) const;
  // Times the chunk holding `offset` became free or changed class
  // (wrapping); 0 outside the heap. A free checked now and applied later
  // applies only if it is the same then: else the object it named is gone,
  // and its chunk was handed out again.
  uint32_t IncarnationOf(uint64_t offset) const;

  absl::Status CheckInvariants() const;

 private:
  // A free by another client of a slot in a leased chunk, waiting for the
  // lessee's report.
  struct RemoteFree {
    uint32_t slot = 0;
    ClientId freer = 0;
    bool seen_free = false;  // a report already showed the slot free
  };
  struct Chunk {
    ChunkKind kind = ChunkKind::kFree;
    uint8_t size_class = 0;
    bool dirty = false;
    uint32_t incarnation = 0;              // times the chunk became free or changed class
    uint32_t run_chunks = 0;               // kLargeHead: run length
    uint32_t head_chunk = 0;               // kLargeTail: its head
    ClientId lessee = 0;                   // kSmall: leasing client, 0 if none; kReserved
    ClientId uncommitted_by = 0;           // kLargeHead: allocating client until commit
    std::unique_ptr<SlotBitmap> bitmap;    // kSmall
    std::vector<RemoteFree> remote_frees;  // kSmall with a lessee
  };
  // A free of the first chunk of a reserved run, waiting for its client to
  // place an object there.
  struct ReservedFree {
    uint32_t chunks = 0;  // of the object as its freer sized it; 0: unknown
    ClientId freer = 0;
    bool seen = false;  // a complete report did not place it
  };
  struct ClientState {
    std::set<uint32_t> leased;
    std::set<uint32_t> uncommitted_runs;
    std::set<uint32_t> reserved;
    std::map<uint32_t, ReservedFree> reserved_frees;  // by chunk
    std::vector<std::string> rejected_frees;          // not yet told
  };
  // What Free will do to one object, decided before anything changes.
  struct PlannedFree {
    uint32_t chunk;
    uint32_t slot;  // small objects
  };

  absl::StatusOr<PlannedFree> PlanFree(ClientId client, ObjectRef object) const;
  absl::Status OutsideHeap(uint64_t offset) const;
  // True if another client freed `slot` of the leased `chunk` since its
  // lessee's last report.
  static bool PendingFree(const Chunk& chunk, uint32_t slot);
  // Applies the frees queued in `chunk` to `bitmap` (the lessee's view):
  // live slots are freed (and added to `correction`); a slot not live is
  // kept for one more report unless `final` or it was seen free before,
  // then rejected (told to its freer), or with `lessee_died` dropped.
  void ResolveRemoteFrees(uint32_t chunk, SlotBitmap& bitmap, bool final, bool lessee_died,
                          LeaseCorrection* correction);
  void MarkDirty(uint32_t chunk);
  void MakeSmall(uint32_t chunk, uint32_t size_class);
  // Frees a run; with `record`, its first chunk is written at the next
  // persist (a chunk that was reserved was free on disk all along).
  void MakeFree(uint32_t chunk_start, uint32_t length, bool record = true);
  void FreeRun(uint32_t head);
  // Puts an unleased small chunk where it belongs: free, leasable or neither.
  void Settle(uint32_t chunk);
  void EndLease(uint32_t chunk, bool lessee_died);
  // Every chunk of `run` is reserved for `client`.
  bool ReservedFor(ClientId client, const LargePlacement& run) const;
  // Tells `freer` (if its session is still there) its free was rejected.
  void RejectFree(ClientId freer, std::string why);
  // Reclaim (`died`) and Release.
  ReclaimResult EndClient(ClientId client, bool died);
  ChunkRecord Persisted(uint32_t chunk) const;
  bool IsPinned(uint64_t offset) const { return pins_.count(offset) != 0; }

  std::vector<Chunk> chunks_;
  FreeRuns free_;
  std::array<std::set<uint32_t>, kNumSizeClasses> leasable_;
  absl::flat_hash_map<ClientId, ClientState> clients_;
  std::map<uint64_t, uint32_t> pins_;  // object offset -> names binding it
  std::vector<uint32_t> dirty_;
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_CHUNK_DIRECTORY_H_
