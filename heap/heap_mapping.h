// HeapMapping: a process's view of a heap's data file. It reserves address
// space for the heap's maximum size once (PROT_NONE) and maps the file into
// its start; growth maps the new range in place, so objects never move
// while the heap is mapped. Each process may map at another address, which
// is why objects link with offset pointers; a fixed-address heap
// (heap/fixed_address.h) is mapped at its one address in every process.
//
// On fs-dax the file is mapped MAP_SHARED_VALIDATE | MAP_SYNC when the
// kernel accepts it (stores reach persistence with a cache flush), else
// MAP_SHARED.
//
// Thread safety: Extend calls must not overlap (the caller serializes
// them); Flush and the accessors may run concurrently with an Extend (they
// see the size before or after it).
#ifndef HEAPD_HEAP_HEAP_MAPPING_H_
#define HEAPD_HEAP_HEAP_MAPPING_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace heapd {

// Whether `fd` can be mapped MAP_SHARED_VALIDATE | MAP_SYNC (fs-dax). Asked
// with a throwaway mapping at an address the kernel picks: a MAP_FIXED
// attempt that the file system refuses in its mmap hook (ext4 and XFS
// without DAX) has already unmapped the range it was to replace, and since
// Linux 6.12 leaves it unmapped, a hole another thread's mmap can land in.
bool FileTakesMapSync(int fd);

// Maps `length` bytes of `fd` from `offset` at exactly `at` (MAP_FIXED),
// writable or read-only, with MAP_SYNC when `map_sync` (see
// FileTakesMapSync). Returns 0, or the errno; on failure the range is
// reserved again (PROT_NONE) rather than left a hole. Async-signal-safe
// (the client's fault handler calls it).
int MapFileAt(char* at, uint64_t length, bool writable, bool map_sync, int fd, uint64_t offset);

class HeapMapping {
 public:
  // Maps the first `size` bytes of `fd` in a reservation of `max_size`
  // bytes; read-only when !writable (stray stores fault). With
  // `prefix_bytes`, that much private read-write memory sits just before
  // base() (the client keeps its per-process header there). With
  // `fixed_base`, base() is exactly there (MAP_FIXED_NOREPLACE), or
  // FAILED_PRECONDITION naming what this process has mapped in the way.
  // REQUIRES: size <= max_size; all four multiples of the page size.
  static absl::StatusOr<std::unique_ptr<HeapMapping>> Map(int fd, uint64_t max_size, uint64_t size,
                                                          bool writable, uint64_t prefix_bytes = 0,
                                                          uint64_t fixed_base = 0);
  ~HeapMapping();
  HeapMapping(const HeapMapping&) = delete;
  HeapMapping& operator=(const HeapMapping&) = delete;

  // Maps the file up to `new_size` bytes at the same base address.
  // INVALID_ARGUMENT beyond the reservation.
  absl::Status Extend(uint64_t new_size);
  // The file is mapped up to `size` bytes already (the client's growth
  // fault handler maps without this object): Extend and Flush cover it
  // from now on, and Extend never maps it again. Serialized like Extend.
  void Adopt(uint64_t size);

  // Writes dirty pages of the mapping back to the file (msync MS_SYNC).
  absl::Status Flush();

  // Unmaps the reservation now (the destructor then leaves it alone): for
  // a forked child giving back a fixed-address heap's range it inherited.
  // Nothing may use the mapping afterwards.
  void Unmap();

  char* base() const { return base_; }
  uint64_t size() const { return size_.load(std::memory_order_acquire); }
  uint64_t max_size() const { return max_size_; }
  bool map_sync() const { return map_sync_; }
  bool writable() const { return writable_; }

 private:
  HeapMapping(int fd, char* base, uint64_t max_size, uint64_t prefix_bytes, bool writable)
      : fd_(fd),
        base_(base),
        max_size_(max_size),
        prefix_bytes_(prefix_bytes),
        writable_(writable),
        map_sync_(writable && FileTakesMapSync(fd)) {}
  absl::Status MapRange(uint64_t begin, uint64_t end);

  int fd_;  // not owned
  char* base_;
  uint64_t max_size_;
  uint64_t prefix_bytes_;
  std::atomic<uint64_t> size_{0};  // written by Extend only
  bool writable_;
  const bool map_sync_;                // every range is mapped with MAP_SYNC
  std::atomic<bool> unmapped_{false};  // by Unmap
};

}  // namespace heapd

#endif  // HEAPD_HEAP_HEAP_MAPPING_H_
