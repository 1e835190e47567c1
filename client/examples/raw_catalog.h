// A catalog built of libstdc++'s own containers and plain pointers, living
// in a fixed-address heap through heapd::raw_allocator: what
// raw_pointers.cc and the tests build and read back in other processes.
#ifndef HEAPD_CLIENT_EXAMPLES_RAW_CATALOG_H_
#define HEAPD_CLIENT_EXAMPLES_RAW_CATALOG_H_

#include <cstdint>
#include <functional>
#include <scoped_allocator>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "heapd/raw_allocator.h"

namespace heapd {

template <typename T>
using Raw = raw_allocator<T>;
using RawString = std::basic_string<char, std::char_traits<char>, Raw<char>>;
using RawIds = std::vector<uint64_t, Raw<uint64_t>>;

struct RawStringHash {
  size_t operator()(const RawString& s) const {
    return std::hash<std::string_view>{}(std::string_view(s.data(), s.size()));
  }
};

// A user struct with a plain pointer to the next one.
struct RawNode {
  uint64_t value;
  RawNode* next;
};

struct RawCatalog {
  using Entry = std::pair<const RawString, RawIds>;
  // Keys and values allocate in the heap too: the scoped adaptor hands the
  // map's allocator down to each string and vector it constructs.
  using Index = std::unordered_map<RawString, RawIds, RawStringHash, std::equal_to<RawString>,
                                   std::scoped_allocator_adaptor<Raw<Entry>>>;

  explicit RawCatalog(const Raw<char>& alloc) : index(alloc), title(alloc) {}

  Index index;
  RawString title;
  RawNode* list = nullptr;  // a list of RawNode, newest first
};

// Builds entries "key-0".."key-N-1" (entry i holds the ids i, 2i, ..., up
// to i + 1 of them) and a list of N nodes. Throws what raw_allocator
// throws.
inline void FillRawCatalog(Heap& heap, RawCatalog& catalog, uint64_t entries) {
  catalog.title = "a catalog whose strings are longer than the small-string buffer";
  for (uint64_t i = 0; i < entries; ++i) {
    std::string key = "key-" + std::to_string(i);
    RawIds& ids = catalog.index[RawString(key.data(), key.size(), catalog.title.get_allocator())];
    for (uint64_t j = 0; j <= i % 50; ++j) ids.push_back(i * (j + 1));
    void* memory = Raw<RawNode>(heap).allocate(1);
    catalog.list = new (memory) RawNode{i, catalog.list};
  }
}

// Empty if `catalog` holds what FillRawCatalog(entries) built (its title
// perhaps longer), else what differs first.
inline std::string CheckRawCatalog(const RawCatalog& catalog, uint64_t entries) {
  const std::string_view title = "a catalog whose strings are longer than the small-string buffer";
  if (std::string_view(catalog.title.data(), catalog.title.size()).substr(0, title.size()) !=
      title) {
    return "the title differs";
  }
  if (catalog.index.size() != entries) {
    return "the index has " + std::to_string(catalog.index.size()) + " entries";
  }
  for (uint64_t i = 0; i < entries; ++i) {
    std::string key = "key-" + std::to_string(i);
    auto it = catalog.index.find(RawString(key.data(), key.size(), catalog.title.get_allocator()));
    if (it == catalog.index.end()) return "no entry " + key;
    if (it->second.size() != i % 50 + 1 || it->second.back() != i * (i % 50 + 1)) {
      return "entry " + key + " differs";
    }
  }
  uint64_t expected = entries;
  for (const RawNode* node = catalog.list; node != nullptr; node = node->next) {
    if (expected == 0 || node->value != --expected) return "the list differs";
  }
  if (expected != 0) return "the list is short";
  return "";
}

}  // namespace heapd

#endif  // HEAPD_CLIENT_EXAMPLES_RAW_CATALOG_H_
