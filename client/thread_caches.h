// ThreadCaches: a session's per-thread lease pools, and which pool leases
// each chunk.
//
// Each thread allocates small objects (up to 1 MiB) from a LeasePool of its
// own, inside its cache's gate (OwnerScope: no atomic read-modify-write);
// sync and detach visit every cache (VisitorScope). A free of an object in
// another thread's pool is queued for that pool (a spin lock per cache)
// and applied by its owner's next allocation or the next visit; a queued
// free the pool rejects is kept for the next sync to report.
//
// Ownership: caches live as long as this object (threads that end leave
// theirs, with its leases, for sync and detach). Thread-safe as above.
#ifndef HEAPD_CLIENT_THREAD_CACHES_H_
#define HEAPD_CLIENT_THREAD_CACHES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/lease_pool.h"
#include "client/owner_gate.h"
#include "client/spin_lock.h"

namespace heapd {

class ThreadCaches {
 public:
  // Leases `count` chunks of `size_class` from heapd for a pool: checked
  // and mapped (HeapImpl's).
  using Leaser = std::function<absl::StatusOr<std::vector<LeaseGrant>>(
      uint32_t size_class, uint32_t count, absl::Span<const uint32_t> reuse)>;

  struct Cache final : LeaseSource {
    Cache(ThreadCaches* caches, uint64_t max_chunks, uint32_t lease_batch)
        : caches(caches), pool(this, max_chunks, lease_batch) {}
    absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(uint32_t size_class, uint32_t count,
                                                        absl::Span<const uint32_t> reuse) override;

    ThreadCaches* const caches;
    OwnerGate gate;
    LeasePool pool ABSL_GUARDED_BY(gate);
    // Other threads' frees of this pool's objects.
    SpinLock queued_lock;
    std::vector<uint64_t> queued_frees ABSL_GUARDED_BY(queued_lock);
    std::atomic<bool> has_queued_frees{false};
  };

  // `heap` names the heap in errors; pools of `lease_batch` chunks per
  // lease; `leaser` outlives this object.
  ThreadCaches(std::string heap, uint32_t lease_batch, Leaser leaser);

  // Sizes the chunk-to-pool table for a heap of `max_chunks`. Once, before
  // any other call.
  void Start(uint64_t max_chunks);

  // This thread's cache, made on its first call.
  ABSL_ATTRIBUTE_ALWAYS_INLINE Cache* OfThisThread() {
    struct LastUsed {
      uint64_t serial = 0;
      Cache* cache = nullptr;
    };
    static thread_local LastUsed last;
    if (last.serial != serial_) last = {serial_, NewForThisThread()};
    return last.cache;
  }

  // The cache whose pool leases `chunk`; null if none of this process.
  // REQUIRES: chunk < max_chunks.
  Cache* OwnerOf(uint64_t chunk) const { return owner_[chunk].load(std::memory_order_acquire); }

  // Queues a free of `offset` for `owner`, another thread's cache.
  static void QueueFree(Cache* owner, uint64_t offset);
  // Frees what other threads queued for `cache`; a rejected one is kept
  // for TakeRejected. REQUIRES: inside its gate.
  void ApplyQueuedFrees(Cache* cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache->gate);

  // Every cache, for sync and detach to visit.
  std::vector<Cache*> All() const ABSL_LOCKS_EXCLUDED(mu_);

  // The first free of another thread's object its pool rejected since the
  // last call (OK if none).
  absl::Status TakeRejected() ABSL_LOCKS_EXCLUDED(rejected_mu_);

 private:
  Cache* NewForThisThread() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string heap_;
  const uint32_t lease_batch_;
  const Leaser leaser_;
  const uint64_t serial_;  // tells sessions apart in thread-local lookups
  uint64_t max_chunks_ = 0;

  mutable absl::Mutex mu_;
  std::map<std::thread::id, std::unique_ptr<Cache>> caches_ ABSL_GUARDED_BY(mu_);
  // Which cache leases each chunk (null: none of this process).
  std::unique_ptr<std::atomic<Cache*>[]> owner_;

  absl::Mutex rejected_mu_;
  absl::Status rejected_ ABSL_GUARDED_BY(rejected_mu_);
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_THREAD_CACHES_H_
