#include "allocator/slot_bitmap.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

// Bits at and past `slot_count` in the last word.
uint64_t PaddingMask(uint32_t slot_count) {
  const uint32_t used = slot_count % 64;
  return used == 0 ? 0 : ~uint64_t{0} << used;
}

}  // namespace

SlotBitmap::SlotBitmap(uint32_t slot_count)
    : slot_count_(slot_count), words_(WordCount(slot_count), 0) {
  words_.back() |= PaddingMask(slot_count);
  RebuildSummary();
}

absl::StatusOr<SlotBitmap> SlotBitmap::FromWords(uint32_t slot_count,
                                                 absl::Span<const uint64_t> words) {
  if (slot_count == 0 || words.size() != WordCount(slot_count)) {
    return absl::InvalidArgumentError(absl::StrCat("slot bitmap has ", words.size(),
                                                   " words; a chunk of ", slot_count,
                                                   " slots needs ", WordCount(slot_count)));
  }
  SlotBitmap bitmap(slot_count);
  bitmap.words_.assign(words.begin(), words.end());
  bitmap.words_.back() |= PaddingMask(slot_count);
  bitmap.live_ = 0;
  for (uint64_t w : bitmap.words_) bitmap.live_ += __builtin_popcountll(w);
  bitmap.live_ -= __builtin_popcountll(PaddingMask(slot_count));
  bitmap.RebuildSummary();
  return bitmap;
}

void SlotBitmap::Set(uint32_t slot) {
  const size_t w = slot >> 6;
  words_[w] |= uint64_t{1} << (slot & 63);
  if (words_[w] == ~uint64_t{0}) full_[w >> 6] |= uint64_t{1} << (w & 63);
  ++live_;
}

void SlotBitmap::RebuildSummary() {
  full_.assign((words_.size() + 63) / 64, 0);
  for (size_t w = 0; w < words_.size(); ++w) {
    if (words_[w] == ~uint64_t{0}) full_[w >> 6] |= uint64_t{1} << (w & 63);
  }
  // Summary bits past the last word are marked full so they are skipped.
  const size_t used = words_.size() % 64;
  if (used != 0) full_.back() |= ~uint64_t{0} << used;
  search_hint_ = 0;
}

absl::Status SlotBitmap::CheckInvariants() const {
  const uint64_t padding = PaddingMask(slot_count_);
  if ((words_.back() & padding) != padding) {
    return absl::InternalError("slot bitmap padding bits are not all set");
  }
  uint64_t live = 0;
  for (size_t w = 0; w < words_.size(); ++w) {
    live += __builtin_popcountll(words_[w]);
    const bool full_bit = (full_[w >> 6] >> (w & 63)) & 1;
    if (full_bit != (words_[w] == ~uint64_t{0})) {
      return absl::InternalError(absl::StrCat("slot bitmap summary is wrong for word ", w));
    }
    if (w < search_hint_ * 64 && words_[w] != ~uint64_t{0}) {
      return absl::InternalError(
          absl::StrCat("slot bitmap word ", w, " has free slots before the search hint"));
    }
  }
  live -= __builtin_popcountll(padding);
  if (live != live_) {
    return absl::InternalError(
        absl::StrCat("slot bitmap counts ", live_, " live slots but holds ", live));
  }
  return absl::OkStatus();
}

}  // namespace heapd
