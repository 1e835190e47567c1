// MappedHeap: a heap's data file as this process sees it, and its growth.
//
// The file is mapped at one address for the heap's whole maximum size
// (heap/heap_mapping.h: objects never move). The heap grows under it two
// ways, both through MapHeapGrowth: MapUpTo, when this process learns of a
// larger capacity (a lease, a sync, a named object), and the growth fault
// handler, when a pointer leads past what is mapped because another
// process grew the heap (client/growth_fault_handler.h). mapped_bytes()
// says how far either got; the HeapMapping adopts that before it flushes.
//
// A fixed-address heap's MappedHeap is listed process-wide (under one
// lock) with the process whose range it is. After fork() the child holds
// none of them until it keeps one (MapPrivately); mapping a fixed-address
// heap first gives back an inherited, unkept mapping of the same range
// (after which that MappedHeap maps nothing more), so a child can attach
// a heap its parent had attached.
//
// Thread safety: MapUpTo, MapUpToFileSize, Flush and the accessors may run
// on any thread, beside the fault handler. StartGrowth, StopGrowth,
// MapPrivately, UnmapInForkedChild and the destructor must not run beside
// anything else on this object.
#ifndef HEAPD_CLIENT_MAPPED_HEAP_H_
#define HEAPD_CLIENT_MAPPED_HEAP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/growth_fault_handler.h"
#include "client/write_tracker.h"
#include "heap/heap_mapping.h"

namespace heapd {

class MappedHeap {
 public:
  // Maps the first `capacity` bytes of `data_fd` (not owned; it must
  // outlive this) in a reservation of `max_size` bytes, with
  // `prefix_bytes` of private memory before base(), at exactly
  // `fixed_base` if not 0 (a fixed-address heap). `heap_name` names it in
  // errors.
  static absl::StatusOr<std::unique_ptr<MappedHeap>> Map(std::string heap_name, int data_fd,
                                                         uint64_t max_size, uint64_t capacity,
                                                         bool writable, uint64_t prefix_bytes,
                                                         uint64_t fixed_base = 0);
  ~MappedHeap();  // stops growth, then unmaps
  MappedHeap(const MappedHeap&) = delete;
  MappedHeap& operator=(const MappedHeap&) = delete;

  // From now on, faults past what is mapped map the heap's growth. With a
  // `tracker` (content rollback), growth is registered with it and
  // write-protected before any store can reach it, and the tracker learns
  // the fault slot.
  void StartGrowth(WriteTracker* tracker);
  // Faults past what is mapped are faults again. Idempotent.
  void StopGrowth();

  // Maps the file up to `capacity` bytes (a no-op if mapped already);
  // INTERNAL beyond the maximum size (heapd answered nonsense).
  absl::Status MapUpTo(uint64_t capacity);
  // Maps the file up to its current size (whole chunks): what other
  // processes grew the heap by. DATA_LOSS if that ends before `needed`.
  absl::Status MapUpToFileSize(uint64_t needed);
  // Writes the mapping back (msync), what the fault handler mapped too.
  absl::Status Flush();
  // In a child after fork(): what is mapped becomes this process's own
  // copy-on-write view of the file, and growth is not followed (the fork
  // emptied the child's fault slots). A fixed-address heap's range is this
  // process's from now on.
  absl::Status MapPrivately(bool writable);
  // In a child after fork(), for a fixed-address heap, kept or not:
  // unmaps it and gives its range back (the C API's detach of an inherited
  // heap, which leaks the rest of the parent's objects on purpose). No-op
  // for other heaps.
  void UnmapInForkedChild();

  char* base() const { return mapping_->base(); }
  uint64_t max_size() const { return mapping_->max_size(); }
  uint64_t mapped_bytes() const { return mapped_bytes_.load(std::memory_order_acquire); }
  // For the WriteTracker, which protects what is mapped.
  std::atomic<uint64_t>* mapped_bytes_counter() { return &mapped_bytes_; }

 private:
  MappedHeap(std::string heap_name, int data_fd, std::unique_ptr<HeapMapping> mapping)
      : heap_name_(std::move(heap_name)),
        data_fd_(data_fd),
        mapping_(std::move(mapping)),
        mapped_bytes_(mapping_->size()),
        growing_{base(),        max_size(), data_fd_, mapping_->writable(), mapping_->map_sync(),
                 &mapped_bytes_} {}

  const std::string heap_name_;
  const int data_fd_;
  void Unlist();
  absl::Status GivenBack() const;  // FAILED_PRECONDITION: given_back_

  bool fixed_ = false;                   // listed process-wide
  std::atomic<bool> given_back_{false};  // its mapping is gone (a forked child's)
  // Grows by MapHeapGrowth (MapUpTo, holding mu_, and the fault handler),
  // which raises mapped_bytes_; mapping_ adopts that size under mu_, and
  // the rest of HeapMapping may run beside them.
  absl::Mutex mu_;
  const std::unique_ptr<HeapMapping> mapping_;
  std::atomic<uint64_t> mapped_bytes_;
  GrowingHeap growing_;  // its tracker's parts set by StartGrowth
  int fault_slot_ = -1;  // growing_'s slot with the handler
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_MAPPED_HEAP_H_
