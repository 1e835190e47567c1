// heapd's C++ API in one include: heapd::Client (connect, attach),
// heapd::Heap (allocate, construct / find / destroy named objects, sync,
// detach), heapd::allocator<T> (offset pointers, for Boost.Container and
// boost::unordered containers in the heap), heapd::raw_allocator<T> (plain
// pointers in fixed-address heaps, for the standard library's containers)
// and HEAPD_TYPE_NAME.
//
//   #include <heapd/heapd.hpp>
//   auto client = heapd::Client::Connect();
//   auto heap = (*client)->Attach("graph", {.create_if_missing = true});
//
// Link with -lheapd (pkg-config heapd-cxx, or CMake's heapd::heapd_cxx).
// The C API is <heapd/heapd.h>.
#ifndef HEAPD_HEAPD_HEAPD_HPP_
#define HEAPD_HEAPD_HEAPD_HPP_

#include "heapd/allocator.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "heapd/raw_allocator.h"
#include "heapd/type_name.h"

#endif  // HEAPD_HEAPD_HEAPD_HPP_
