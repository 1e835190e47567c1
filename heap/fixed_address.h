// Fixed-address heaps: a heap every process maps at one virtual address,
// recorded with the heap (HeapConfig::fixed_base), so objects in it may
// hold plain pointers (heapd::raw_allocator).
//
// heapd hands out ranges from one node-wide window of x86-64 user address
// space where nothing else lands:
//   - above AddressSanitizer's shadow, which ends at 0x10007fff7fff;
//   - below where mmap starts in the legacy layout (TASK_SIZE / 3, about
//     0x2aaaaaaab000, plus up to 1 TiB of randomization, growing upward),
//     which `ulimit -s unlimited` selects;
//   - far below PIE binaries and their brk heaps (about 0x555555554000
//     plus up to 1 TiB) and below the default layout's mmap area (growing
//     down from just under the stack, near 0x7fffffffffff);
//   - above non-PIE binaries (0x400000) and their brk heaps.
// ThreadSanitizer reserves this window for its shadow: fixed-address heaps
// cannot be mapped under TSan.
//
// A heap's range: [fixed_base - kFixedGuardBytes, fixed_base + max_size).
// The guard holds the per-process header (heapd/heap.h) just before the
// heap and keeps neighbouring heaps apart.
#ifndef HEAPD_HEAP_FIXED_ADDRESS_H_
#define HEAPD_HEAP_FIXED_ADDRESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace heapd {

// Whether this program can map fixed-address heaps: not under
// ThreadSanitizer (its shadow covers the window; clang defines no
// __SANITIZE_THREAD__, hence __has_feature).
#if defined(__SANITIZE_THREAD__)
#define HEAPD_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HEAPD_UNDER_TSAN 1
#endif
#endif
#if defined(HEAPD_UNDER_TSAN)
inline constexpr bool kFixedAddressesMappable = false;
#else
inline constexpr bool kFixedAddressesMappable = true;
#endif

inline constexpr uint64_t kFixedWindowBegin = uint64_t{0x110000000000};  // 17 TiB
inline constexpr uint64_t kFixedWindowEnd = uint64_t{0x2a0000000000};    // 42 TiB
// Ranges start at multiples of this (a heap's base is 2 MiB aligned).
inline constexpr uint64_t kFixedGuardBytes = uint64_t{2} << 20;

struct AddressRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
  bool Overlaps(const AddressRange& other) const { return begin < other.end && other.begin < end; }
};

// The range a heap at `fixed_base` of `max_size` bytes occupies.
AddressRange FixedRangeOf(uint64_t fixed_base, uint64_t max_size);
// Its length: the bytes of the window such a heap holds.
uint64_t FixedRangeBytes(uint64_t max_size);

// OK if a heap of `max_size` bytes may sit at `fixed_base`: 2 MiB aligned
// and its whole range inside the window. INVALID_ARGUMENT saying which
// otherwise (a recorded base that is not is corrupt or hostile).
absl::Status ValidateFixedBase(uint64_t fixed_base, uint64_t max_size);

// The lowest base in the window for a heap of `max_size` bytes whose range
// overlaps none of `taken`. RESOURCE_EXHAUSTED, with how much of the
// window is taken, when none is left.
absl::StatusOr<uint64_t> FindFixedBase(std::vector<AddressRange> taken, uint64_t max_size);

// "0x110000200000..0x110040200000", for messages.
std::string RangeString(const AddressRange& range);

}  // namespace heapd

#endif  // HEAPD_HEAP_FIXED_ADDRESS_H_
