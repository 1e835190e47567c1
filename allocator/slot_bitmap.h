// SlotBitmap: which slots of a small-object chunk hold live objects.
//
// Bit i of words() is 1 when slot i is allocated. A second level, one bit per
// word, marks the words that are full, so finding a free slot reads at most a
// few words whatever the chunk's occupancy.
//
// Invariants (checked by CheckInvariants()):
//   - bits at and past slot_count() in the last word are always 1 (padding,
//     never handed out, never counted);
//   - full_ bit w is 1 exactly when words_[w] == ~0;
//   - live_ == number of 1 bits below slot_count();
//   - every word before search_hint_ * 64 is full.
// Not thread-safe: one owner at a time (the daemon, or one client thread).
#ifndef HEAPD_ALLOCATOR_SLOT_BITMAP_H_
#define HEAPD_ALLOCATOR_SLOT_BITMAP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace heapd {

class SlotBitmap {
 public:
  // An empty bitmap of `slot_count` slots. REQUIRES: slot_count > 0.
  explicit SlotBitmap(uint32_t slot_count);

  // Loads `words` (as returned by words()) for a chunk of `slot_count`
  // slots. Fails with INVALID_ARGUMENT if the word count does not match.
  // Padding bits are forced to 1.
  static absl::StatusOr<SlotBitmap> FromWords(uint32_t slot_count,
                                              absl::Span<const uint64_t> words);

  // Whether `words` (as returned by words()) mark none of the first
  // `slot_count` slots allocated; padding bits do not count.
  static bool NoneAllocated(uint32_t slot_count, absl::Span<const uint64_t> words) {
    for (size_t w = 0; w < words.size(); ++w) {
      const uint64_t bits = w * 64 >= slot_count ? 0
                            : slot_count - w * 64 >= 64
                                ? ~uint64_t{0}
                                : (uint64_t{1} << (slot_count - w * 64)) - 1;
      if ((words[w] & bits) != 0) return false;
    }
    return true;
  }

  SlotBitmap(SlotBitmap&&) = default;
  SlotBitmap& operator=(SlotBitmap&&) = default;
  SlotBitmap(const SlotBitmap&) = default;
  SlotBitmap& operator=(const SlotBitmap&) = default;

  // Marks the lowest free slot allocated and returns its index, or -1 when
  // the chunk is full.
  int64_t AllocateLowest() {
    const size_t summary_words = full_.size();
    for (; search_hint_ < summary_words; ++search_hint_) {
      const uint64_t not_full = ~full_[search_hint_];
      if (not_full == 0) continue;
      const size_t w = search_hint_ * 64 + __builtin_ctzll(not_full);
      const uint64_t word = words_[w];
      const int bit = __builtin_ctzll(~word);
      words_[w] = word | (uint64_t{1} << bit);
      if (words_[w] == ~uint64_t{0}) full_[w >> 6] |= uint64_t{1} << (w & 63);
      ++live_;
      return static_cast<int64_t>(w * 64 + bit);
    }
    return -1;
  }

  bool IsAllocated(uint32_t slot) const { return (words_[slot >> 6] >> (slot & 63)) & 1; }

  // Marks `slot` free. REQUIRES: slot < slot_count() && IsAllocated(slot).
  void Free(uint32_t slot) {
    const size_t w = slot >> 6;
    words_[w] &= ~(uint64_t{1} << (slot & 63));
    full_[w >> 6] &= ~(uint64_t{1} << (w & 63));
    if ((w >> 6) < search_hint_) search_hint_ = w >> 6;
    --live_;
  }

  // Marks `slot` allocated. REQUIRES: slot < slot_count() && !IsAllocated(slot).
  void Set(uint32_t slot);

  uint32_t slot_count() const { return slot_count_; }
  uint32_t live() const { return live_; }
  bool empty() const { return live_ == 0; }
  bool full() const { return live_ == slot_count_; }
  const std::vector<uint64_t>& words() const { return words_; }

  // Returns the number of 64-bit words a chunk of `slot_count` slots uses.
  static size_t WordCount(uint32_t slot_count) { return (slot_count + 63) / 64; }

  // Verifies every invariant above; returns INTERNAL naming the broken one.
  absl::Status CheckInvariants() const;

 private:
  void RebuildSummary();

  uint32_t slot_count_;
  uint32_t live_ = 0;
  size_t search_hint_ = 0;
  std::vector<uint64_t> words_;
  std::vector<uint64_t> full_;
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_SLOT_BITMAP_H_
