// LargeObjects: a session's objects above kMaxSmallSize (1 MiB).
//
// Up to kMaxCarvedChunks chunks, they are carved from chunks heapd
// reserves for the session in batches: the first is what the object needs
// (at least kFirstReserveChunks), each next one twice the last, up to
// kMaxReserveChunks (allocator/large_reserve.h): no call per object, and
// a session with one large object holds no more than it.
// heapd learns of them ("told") at the next sync, or before one is bound to
// a name, where they commit; what a session has not carved goes back at
// each sync, and is freed when it ends. Larger objects are one call each.
// When heapd says the heap is full, this process's pending frees and its
// unused reserve go back and the call is tried once more.
//
// Thread-safe. Locks: the session's sync lock (HeapImpl's, held through a
// sync) is taken before this one's, to top the reserve up and to tell
// heapd of untold objects.
#ifndef HEAPD_CLIENT_LARGE_OBJECTS_H_
#define HEAPD_CLIENT_LARGE_OBJECTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/large_reserve.h"
#include "client/mapped_heap.h"
#include "client/remote_frees.h"
#include "client/session_calls.h"
#include "client/write_tracker.h"

namespace heapd {

// Objects of up to this many chunks are carved from the reserve.
constexpr uint32_t kMaxCarvedChunks = 64;  // 128 MiB
constexpr uint32_t kFirstReserveChunks = 1;
constexpr uint32_t kMaxReserveChunks = 128;  // 256 MiB

class LargeObjects {
 public:
  // What the objects live in and are told over; every pointer outlives
  // this object.
  struct Session {
    SessionCalls* calls = nullptr;
    uint64_t id = 0;
    std::string heap;  // the heap's name, for errors
    uint64_t max_size = 0;
    MappedHeap* mapped = nullptr;
    WriteTracker* tracker = nullptr;  // null: contents not tracked
    RemoteFrees* frees = nullptr;
    // Held through the session's syncs; Allocate and TellUntold take it,
    // so its owner calls them only without it (HeapImpl's wrappers say so
    // to the thread-safety analysis).
    absl::Mutex* sync_mu = nullptr;
  };

  explicit LargeObjects(Session session) : session_(std::move(session)) {}

  // An object of `size` bytes (above kMaxSmallSize): its offset, mapped
  // and writable.
  absl::StatusOr<uint64_t> Allocate(uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // A free of `offset` in this session's reserve: true if it freed an
  // untold object, false if the reserve does not hold its chunk (heapd
  // judges it), INVALID_ARGUMENT if it holds it but no object starts there
  // or `size_hint` (0: unknown) is not its size.
  absl::StatusOr<bool> FreeUntold(uint64_t offset, uint64_t size_hint) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the reserve holds `chunk`.
  bool Holds(uint32_t chunk) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `chunk` starts an object heapd does not know yet.
  bool Untold(uint32_t chunk) const ABSL_LOCKS_EXCLUDED(mu_);

  // Tells heapd of every untold object now, in parts of a sync (taken at
  // once, committed by the next). Takes the sync lock.
  absl::Status TellUntold() ABSL_LOCKS_EXCLUDED(mu_);

  // `call()`, and once more if the heap was full and this process had
  // frees or reserve to give back.
  absl::Status WithReserveBack(const std::function<absl::Status()>& call) ABSL_LOCKS_EXCLUDED(mu_);

  // What a sync or detach carries: the objects carved since the last one,
  // and with `release_reserve` the runs not carved (the reserve's batches
  // then grow again from the first size). SyncEnded says how it went.
  struct ForSync {
    std::vector<LargePlacement> placed;
    std::vector<LargePlacement> released;
  };
  ForSync TakeForSync(bool release_reserve) ABSL_LOCKS_EXCLUDED(mu_);
  void SyncEnded(bool committed) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // heapd's AllocateLarge: an object of `size` bytes, or with `reserve` a
  // run of chunks for the reserve of `min_size` to `size` bytes; checked,
  // mapped and unprotected.
  absl::StatusOr<LargePlacement> TakeFromHeapd(uint64_t size, bool reserve, uint64_t min_size);
  // Hands the reserve's uncarved runs back to heapd now; true if it held
  // some and heapd took them.
  bool ReturnReserve() ABSL_LOCKS_EXCLUDED(mu_);
  // One part of a sync that tells heapd of carved objects and released
  // runs, taken at once (ChunkDirectory::TellReserve).
  absl::Status Tell(absl::Span<const LargePlacement> placed,
                    absl::Span<const LargePlacement> released);

  const Session session_;
  mutable absl::Mutex mu_;
  LargeReserve reserve_ ABSL_GUARDED_BY(mu_);
  uint32_t next_reserve_chunks_ ABSL_GUARDED_BY(mu_) = kFirstReserveChunks;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_LARGE_OBJECTS_H_
