// HeapSession: one client's session on a PersistentHeap in the same process — a lease
// pool for small objects, large objects and foreign frees through the PersistentHeap,
// and a mapping of the data file. This is the client protocol without the
// RPCs: the daemon's client library runs the same steps over gRPC. Used by
// the demo, the crash and model tests and the in-process benchmarks.
//
// Not thread-safe: one thread per session.
#ifndef HEAPD_HEAP_HEAP_SESSION_H_
#define HEAPD_HEAP_HEAP_SESSION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/lease_pool.h"
#include "heap/heap.h"
#include "heap/heap_mapping.h"

namespace heapd {

class HeapSession : private LeaseSource {
 public:
  // Starts session `client` on `heap` (which outlives the session) and maps
  // the heap. REQUIRES: client ids are unique among the heap's sessions.
  static absl::StatusOr<std::unique_ptr<HeapSession>> Start(PersistentHeap* heap, ClientId client,
                                                            uint32_t lease_batch = 4);

  // Allocates `size` bytes and returns the object's offset.
  absl::StatusOr<uint64_t> Allocate(uint64_t size);

  // Frees the object at `offset`: locally if this session leases its chunk,
  // else through the heap. INVALID_ARGUMENT if it is not a live object.
  absl::Status Deallocate(uint64_t offset);

  // Reports changed leases, commits and persists an epoch; returns it.
  absl::StatusOr<uint64_t> Sync();

  // Returns every lease and persists (the session ends; the object may only
  // be destroyed afterwards).
  absl::Status Detach();

  // Maps what the heap grew by through other sessions.
  absl::Status MapCapacity();

  char* base() const { return mapping_->base(); }
  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(mapping_->base() + offset);
  }
  ClientId client() const { return client_; }
  const LeasePool& pool() const { return pool_; }

 private:
  HeapSession(PersistentHeap* heap, ClientId client, uint32_t lease_batch);
  absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(uint32_t size_class, uint32_t count) override;

  PersistentHeap* heap_;
  ClientId client_;
  LeasePool pool_;
  std::unique_ptr<HeapMapping> mapping_;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_HEAP_SESSION_H_
