// ChunkMap: chunk index -> T*, a two-level radix table sized for the heap's
// maximum size. Lookups are two loads; leaves are allocated on first use, so
// a 1 TiB heap costs 4 KiB until chunks are mapped.
#ifndef HEAPD_ALLOCATOR_CHUNK_MAP_H_
#define HEAPD_ALLOCATOR_CHUNK_MAP_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

namespace heapd {

template <typename T>
class ChunkMap {
 public:
  explicit ChunkMap(uint64_t max_chunks)
      : max_chunks_(max_chunks), leaves_((max_chunks + kLeafSize - 1) / kLeafSize) {}

  // Returns the entry for `chunk`, or nullptr if unset or out of range.
  T* Get(uint64_t chunk) const {
    if (chunk >= max_chunks_) return nullptr;
    const Leaf* leaf = leaves_[chunk >> kLeafBits].get();
    return leaf == nullptr ? nullptr : (*leaf)[chunk & (kLeafSize - 1)];
  }

  // Sets the entry for `chunk`. REQUIRES: chunk < max_chunks.
  void Set(uint64_t chunk, T* value) {
    std::unique_ptr<Leaf>& leaf = leaves_[chunk >> kLeafBits];
    if (leaf == nullptr) leaf = std::make_unique<Leaf>();
    (*leaf)[chunk & (kLeafSize - 1)] = value;
  }

  uint64_t max_chunks() const { return max_chunks_; }

 private:
  static constexpr int kLeafBits = 10;
  static constexpr uint64_t kLeafSize = uint64_t{1} << kLeafBits;
  struct Leaf : std::array<T*, kLeafSize> {
    Leaf() { this->fill(nullptr); }
  };

  uint64_t max_chunks_;
  std::vector<std::unique_ptr<Leaf>> leaves_;
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_CHUNK_MAP_H_
