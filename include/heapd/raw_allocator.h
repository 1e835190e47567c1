// heapd::raw_allocator<T>: a standard allocator with plain T* pointers over
// a fixed-address heap (AttachOptions::fixed_address), which every process
// maps at one address. With it libstdc++'s own containers live in the heap
// and are used from every process that attaches it:
//
//   using Vec = std::vector<uint64_t, heapd::raw_allocator<uint64_t>>;
//   Vec* v = *heap->construct<Vec>("edges")(heapd::raw_allocator<uint64_t>(*heap));
//   // later, in another process that attached the heap:
//   Vec* v = *heap->find<Vec>("edges");  v->push_back(1);  // allocates in that process
//
//   // a string in the heap (std::string itself allocates in DRAM):
//   using String = std::basic_string<char, std::char_traits<char>, heapd::raw_allocator<char>>;
//   // containers of containers pass the allocator down:
//   using Alloc = std::scoped_allocator_adaptor<heapd::raw_allocator<std::pair<const String,
//   Vec>>>;
//
// Constructing one over a heap that is not fixed-address throws
// std::invalid_argument saying so: a plain pointer into such a heap is
// wrong in every other process. Like heapd::allocator, it holds only the
// address of the per-process header just before the heap, which is the
// same in every process, so an allocator stored in the heap finds each
// process's own Heap. Allocation failure throws heapd::allocation_error.
//
// A plain pointer stored in the heap is valid wherever the heap is
// attached, as long as it points into the heap: pointers to code, static
// data, the stack or DRAM (a std::string's buffer, a vtable of a
// polymorphic type) mean nothing in another process or another run.
#ifndef HEAPD_HEAPD_RAW_ALLOCATOR_H_
#define HEAPD_HEAPD_RAW_ALLOCATOR_H_

#include <cstddef>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "heapd/allocator.h"
#include "heapd/heap.h"

namespace heapd {

template <typename T>
class raw_allocator {
 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  template <typename U>
  struct rebind {
    using other = raw_allocator<U>;
  };

  // REQUIRES nothing: throws std::invalid_argument unless
  // heap.fixed_address().
  explicit raw_allocator(Heap& heap) : header_(HeaderOf(heap)) {}
  template <typename U>
  raw_allocator(const raw_allocator<U>& other) noexcept  // NOLINT: rebinding
      : header_(other.header()) {}

  T* allocate(size_type n) {
    if (n > max_size()) throw std::bad_array_new_length();
    absl::StatusOr<void*> memory = heap().allocate(n * sizeof(T), alignof(T));
    if (!memory.ok()) throw allocation_error(memory.status());
    return static_cast<T*>(*memory);
  }

  // Frees memory from allocate(). A free the heap rejects (it would be a
  // double free) changes nothing; deallocate cannot report it.
  void deallocate(T* p, size_type n) noexcept { (void)heap().deallocate(p, n * sizeof(T)); }

  size_type max_size() const noexcept { return std::numeric_limits<size_type>::max() / sizeof(T); }

  Heap& heap() const { return *header_->heap; }
  ProcessHeader* header() const { return header_; }

  template <typename U>
  bool operator==(const raw_allocator<U>& other) const {
    return header_ == other.header();
  }
  template <typename U>
  bool operator!=(const raw_allocator<U>& other) const {
    return !(*this == other);
  }

 private:
  static ProcessHeader* HeaderOf(Heap& heap) {
    if (!heap.fixed_address()) {
      throw std::invalid_argument(
          "heapd::raw_allocator needs a fixed-address heap, and heap " + heap.name() +
          " is mapped at another address in each process: create it with fixed_address "
          "(heapctl heap create NAME --fixed_address), or use heapd::allocator");
    }
    return heap.process_header();
  }

  ProcessHeader* header_;  // at the same address in every process
};

}  // namespace heapd

#endif  // HEAPD_HEAPD_RAW_ALLOCATOR_H_
