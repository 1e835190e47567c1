// Size classes of the heapd allocator.
//
// The heap is cut into 2 MiB chunks. A chunk serving small objects holds slots
// of one size class. Classes are 8, 16, ..., 64 bytes, then four per doubling
// (80, 96, 112, 128, 160, ...) up to half a chunk (1 MiB): 64 classes in all.
// Every class size is a multiple of 8, so every slot is at least 8-byte
// aligned (slot k of a chunk is at chunk_base + k * class_size and chunk bases
// are 2 MiB aligned). For requests of 32 bytes and more the internal
// fragmentation (class_size - request) / class_size is below 25%; below 32
// bytes the 8-byte granularity bounds the waste at 7 bytes.
// Requests above kMaxSmallSize take runs of whole chunks.
#ifndef HEAPD_ALLOCATOR_SIZE_CLASS_H_
#define HEAPD_ALLOCATOR_SIZE_CLASS_H_

#include <array>
#include <cstdint>

namespace heapd {

inline constexpr int kChunkShift = 21;
inline constexpr uint64_t kChunkSize = uint64_t{1} << kChunkShift;
// The largest maximum size of a heap (the address space a client
// reserves): 64 TiB, 2^25 chunks.
inline constexpr uint64_t kMaxHeapBytes = uint64_t{1} << 46;
inline constexpr uint64_t kMaxSmallSize = kChunkSize / 2;
inline constexpr uint32_t kNumSizeClasses = 64;

namespace size_class_internal {

constexpr uint32_t ComputeClassSize(uint32_t size_class) {
  if (size_class < 8) return (size_class + 1) * 8;
  const uint32_t group = (size_class - 8) / 4;
  const uint32_t step = (size_class - 8) % 4;
  return (uint32_t{64} << group) + (step + 1) * (uint32_t{16} << group);
}

// Slot index = (offset_in_chunk * magic) >> kMagicShift, exact for every
// offset below kChunkSize because every class size is at most 2^21 and
// 2^21 * class_size <= 2^kMagicShift (checked exhaustively in the test).
inline constexpr int kMagicShift = 42;

struct ClassTable {
  std::array<uint32_t, kNumSizeClasses> size{};
  std::array<uint32_t, kNumSizeClasses> slots{};
  std::array<uint64_t, kNumSizeClasses> magic{};
};

constexpr ClassTable MakeClassTable() {
  ClassTable t;
  for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
    t.size[c] = ComputeClassSize(c);
    t.slots[c] = static_cast<uint32_t>(kChunkSize / t.size[c]);
    t.magic[c] = ((uint64_t{1} << kMagicShift) + t.size[c] - 1) / t.size[c];
  }
  return t;
}

inline constexpr ClassTable kClassTable = MakeClassTable();

}  // namespace size_class_internal

// Returns the size class serving `size` bytes.
// REQUIRES: 0 < size <= kMaxSmallSize.
inline uint32_t SizeClassFor(uint64_t size) {
  if (size <= 64) return static_cast<uint32_t>((size + 7) / 8) - 1;
  const uint64_t s = size - 1;
  const int log2 = 63 - __builtin_clzll(s);  // >= 6
  const uint32_t step = static_cast<uint32_t>(s >> (log2 - 2)) & 3;
  return 8 + static_cast<uint32_t>(log2 - 6) * 4 + step;
}

// Returns the slot size of `size_class`. REQUIRES: size_class < kNumSizeClasses.
inline uint32_t ClassSize(uint32_t size_class) {
  return size_class_internal::kClassTable.size[size_class];
}

// Returns how many slots one chunk of `size_class` holds.
inline uint32_t SlotsPerChunk(uint32_t size_class) {
  return size_class_internal::kClassTable.slots[size_class];
}

// Returns offset_in_chunk / ClassSize(size_class) without a division.
// REQUIRES: offset_in_chunk < kChunkSize.
inline uint32_t SlotIndex(uint32_t size_class, uint64_t offset_in_chunk) {
  return static_cast<uint32_t>(
      (offset_in_chunk * size_class_internal::kClassTable.magic[size_class]) >>
      size_class_internal::kMagicShift);
}

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_SIZE_CLASS_H_
