// OffsetArenaAllocator: the third baseline of benchmark B3. The pointer type
// of heapd::allocator (boost::interprocess::offset_ptr) over an allocator
// that costs nothing: a bump pointer through anonymous memory, frees
// ignored. Against std::allocator it prices the offset pointers in the
// container code; against heapd, heapd's allocator and heap.
//
// One OffsetArena is current at a time (set by its constructor, for the
// thread that ingests); allocators copy nothing but their type.
#ifndef HEAPD_BENCH_OFFSET_ARENA_H_
#define HEAPD_BENCH_OFFSET_ARENA_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>

#include "boost/interprocess/offset_ptr.hpp"

namespace heapd {

// Reserves `bytes` of address space (MAP_NORESERVE: pages come as touched).
class OffsetArena {
 public:
  explicit OffsetArena(size_t bytes) : size_(bytes) {
    void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) throw std::bad_alloc();
    next_ = begin_ = static_cast<char*>(memory);
    current_ = this;
  }
  ~OffsetArena() {
    munmap(begin_, size_);
    current_ = nullptr;
  }
  OffsetArena(const OffsetArena&) = delete;
  OffsetArena& operator=(const OffsetArena&) = delete;

  static OffsetArena& current() { return *current_; }

  void* Allocate(size_t bytes) {
    const size_t rounded = (bytes + 15) & ~size_t{15};
    if (rounded > size_ - static_cast<size_t>(next_ - begin_)) throw std::bad_alloc();
    void* at = next_;
    next_ += rounded;
    return at;
  }

 private:
  static inline OffsetArena* current_ = nullptr;
  const size_t size_;
  char* begin_;
  char* next_;
};

template <typename T>
struct OffsetArenaAllocator {
  using value_type = T;
  using pointer = boost::interprocess::offset_ptr<T>;
  template <typename U>
  struct rebind {
    using other = OffsetArenaAllocator<U>;
  };

  OffsetArenaAllocator() = default;
  template <typename U>
  OffsetArenaAllocator(const OffsetArenaAllocator<U>&) {}  // NOLINT: rebinding

  pointer allocate(size_t n) {
    return pointer(static_cast<T*>(OffsetArena::current().Allocate(n * sizeof(T))));
  }
  void deallocate(pointer, size_t) {}

  template <typename U>
  bool operator==(const OffsetArenaAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const OffsetArenaAllocator<U>&) const {
    return false;
  }
};

}  // namespace heapd

#endif  // HEAPD_BENCH_OFFSET_ARENA_H_
