// The adjacency list the examples and benchmark B3 keep in a heap: vertex ->
// its out-neighbours, in Boost containers over heapd::allocator, so it can
// be found by name and used from any process that attaches the heap.
#ifndef HEAPD_CLIENT_EXAMPLES_GRAPH_H_
#define HEAPD_CLIENT_EXAMPLES_GRAPH_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "boost/container/vector.hpp"
#include "boost/functional/hash.hpp"
#include "boost/unordered_map.hpp"
#include "heapd/allocator.h"

namespace heapd {

// `Allocator` is heapd::allocator<char> or std::allocator<char> (the DRAM
// baseline of benchmark B3).
template <typename Allocator>
struct AdjacencyList {
  template <typename T>
  using Rebind = typename std::allocator_traits<Allocator>::template rebind_alloc<T>;
  using Edges = boost::container::vector<uint64_t, Rebind<uint64_t>>;
  using Map = boost::unordered_map<uint64_t, Edges, boost::hash<uint64_t>, std::equal_to<uint64_t>,
                                   Rebind<std::pair<const uint64_t, Edges>>>;

  explicit AdjacencyList(const Allocator& allocator) : map(allocator) {}

  void AddEdge(uint64_t source, uint64_t destination) {
    auto it = map.find(source);
    if (it == map.end()) {
      it = map.emplace(source, Edges(Rebind<uint64_t>(map.get_allocator()))).first;
    }
    it->second.push_back(destination);
  }

  uint64_t edges = 0;
  Map map;
};

using Graph = AdjacencyList<allocator<char>>;

}  // namespace heapd

HEAPD_TYPE_NAME(heapd::Graph, "heapd::examples::Graph/v1");

#endif  // HEAPD_CLIENT_EXAMPLES_GRAPH_H_
