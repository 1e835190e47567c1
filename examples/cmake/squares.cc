// squares: a vector of squares in heap "counters", built with
// heapd::allocator in a Boost container, found by name by later runs.
//   ./cxx_squares N      makes it (N squares) if missing, then checks it
#include <cstdio>
#include <cstdlib>

#include "boost/container/vector.hpp"
#include "heapd/heapd.hpp"

using Squares = boost::container::vector<uint64_t, heapd::allocator<uint64_t>>;
HEAPD_TYPE_NAME(Squares, "examples::Squares/v1");

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000;
  auto client = heapd::Client::Connect();
  if (!client.ok()) {
    std::fprintf(stderr, "cxx_squares: %s\n", client.status().ToString().c_str());
    return 1;
  }
  heapd::AttachOptions options;
  options.create_if_missing = true;
  options.max_size = uint64_t{1} << 30;
  auto heap = (*client)->Attach("counters", options);
  if (!heap.ok()) {
    std::fprintf(stderr, "cxx_squares: %s\n", heap.status().ToString().c_str());
    return 1;
  }
  auto squares = (*heap)->find<Squares>("squares");
  if (!squares.ok()) {
    squares = (*heap)->construct<Squares>("squares")(heapd::allocator<uint64_t>(**heap));
    if (!squares.ok()) {
      std::fprintf(stderr, "cxx_squares: %s\n", squares.status().ToString().c_str());
      return 1;
    }
    try {
      for (uint64_t i = 0; i < n; ++i) (*squares)->push_back(i * i);
    } catch (const heapd::allocation_error& full) {  // RESOURCE_EXHAUSTED: the heap is full
      std::fprintf(stderr, "cxx_squares: %s\n", full.what());
      (void)(*heap)->destroy<Squares>("squares");  // no name left bound to half of it
      return 1;
    }
    std::printf("made %zu squares\n", (*squares)->size());
  }
  for (uint64_t i = 0; i < (*squares)->size(); ++i) {
    if ((**squares)[i] != i * i) {
      std::fprintf(stderr, "cxx_squares: square %llu is wrong\n",
                   static_cast<unsigned long long>(i));
      return 1;
    }
  }
  std::printf("checked %zu squares\n", (*squares)->size());
  return (*heap)->detach().ok() ? 0 : 1;
}
