// heapd::allocator<T>: a standard allocator over a heapd::Heap whose
// pointers are offset pointers, so Boost.Container and boost::unordered
// containers can live in the heap and be used from every process that
// attaches it, wherever it maps the heap.
//
//   using Vec = boost::container::vector<uint64_t, heapd::allocator<uint64_t>>;
//   Vec* v = *heap->construct<Vec>("edges")(heapd::allocator<uint64_t>(*heap));
//   // later, in another process:
//   Vec* v = *heap->find<Vec>("edges");  v->push_back(1);  // allocates in that process
//
// The allocator holds only an offset pointer to the ProcessHeader that sits
// just before the mapped heap; the header names this process's Heap. An
// allocator stored in the heap therefore finds, in each process, that
// process's own Heap. Allocation failure throws heapd::allocation_error, a
// std::bad_alloc that says which heap and why (RESOURCE_EXHAUSTED: the heap
// is at its maximum size or its file system is full).
#ifndef HEAPD_HEAPD_ALLOCATOR_H_
#define HEAPD_HEAPD_ALLOCATOR_H_

#include <cstddef>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "boost/interprocess/offset_ptr.hpp"
#include "heapd/heap.h"

namespace heapd {

// What heapd::allocator throws when the heap gives no memory: a
// std::bad_alloc, so containers and code that catch that keep working,
// whose what() and status() name the heap and the reason.
class allocation_error : public std::bad_alloc {
 public:
  explicit allocation_error(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::string what_;
};

template <typename T>
class allocator {
 public:
  using value_type = T;
  using pointer = boost::interprocess::offset_ptr<T>;
  using const_pointer = boost::interprocess::offset_ptr<const T>;
  using void_pointer = boost::interprocess::offset_ptr<void>;
  using const_void_pointer = boost::interprocess::offset_ptr<const void>;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  template <typename U>
  struct rebind {
    using other = allocator<U>;
  };

  explicit allocator(Heap& heap) : header_(heap.process_header()) {}
  template <typename U>
  allocator(const allocator<U>& other) : header_(other.header()) {}  // NOLINT: rebinding
  allocator(const allocator& other) : header_(other.header_) {}
  allocator& operator=(const allocator& other) {
    header_ = other.header_;
    return *this;
  }

  pointer allocate(size_type n) {
    if (n > max_size()) throw std::bad_array_new_length();
    absl::StatusOr<void*> memory = heap().allocate(n * sizeof(T), alignof(T));
    if (!memory.ok()) throw allocation_error(memory.status());
    return pointer(static_cast<T*>(*memory));
  }

  // Frees memory from allocate(). A free the heap rejects (it would be a
  // double free) changes nothing; deallocate cannot report it.
  void deallocate(pointer p, size_type n) noexcept {
    (void)heap().deallocate(boost::interprocess::ipcdetail::to_raw_pointer(p), n * sizeof(T));
  }

  size_type max_size() const noexcept { return std::numeric_limits<size_type>::max() / sizeof(T); }

  Heap& heap() const { return *header_->heap; }
  const boost::interprocess::offset_ptr<ProcessHeader>& header() const { return header_; }

  template <typename U>
  bool operator==(const allocator<U>& other) const {
    return header_.get() == other.header().get();
  }
  template <typename U>
  bool operator!=(const allocator<U>& other) const {
    return !(*this == other);
  }

 private:
  boost::interprocess::offset_ptr<ProcessHeader> header_;
};

}  // namespace heapd

#endif  // HEAPD_HEAPD_ALLOCATOR_H_
