#include "heap/fixed_address.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace heapd {

AddressRange FixedRangeOf(uint64_t fixed_base, uint64_t max_size) {
  return AddressRange{fixed_base - kFixedGuardBytes, fixed_base + max_size};
}

uint64_t FixedRangeBytes(uint64_t max_size) { return kFixedGuardBytes + max_size; }

std::string RangeString(const AddressRange& range) {
  return absl::StrCat("0x", absl::Hex(range.begin), "..0x", absl::Hex(range.end));
}

absl::Status ValidateFixedBase(uint64_t fixed_base, uint64_t max_size) {
  if (fixed_base % kFixedGuardBytes != 0 || fixed_base < kFixedWindowBegin + kFixedGuardBytes ||
      fixed_base > kFixedWindowEnd || max_size > kFixedWindowEnd - fixed_base) {
    return absl::InvalidArgumentError(
        absl::StrCat("fixed address 0x", absl::Hex(fixed_base), " for a heap of ", max_size,
                     " bytes is not 2 MiB aligned inside heapd's window ",
                     RangeString(AddressRange{kFixedWindowBegin, kFixedWindowEnd})));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FindFixedBase(std::vector<AddressRange> taken, uint64_t max_size) {
  std::sort(taken.begin(), taken.end(),
            [](const AddressRange& a, const AddressRange& b) { return a.begin < b.begin; });
  const uint64_t need = kFixedGuardBytes + max_size;
  uint64_t candidate = kFixedWindowBegin;  // the lowest free byte seen so far
  for (const AddressRange& range : taken) {
    if (range.end <= candidate) continue;
    if (range.begin > candidate && range.begin - candidate >= need) break;
    candidate = range.end;
  }
  // Ranges are multiples of the guard size, so candidate stays aligned.
  if (candidate <= kFixedWindowEnd && kFixedWindowEnd - candidate >= need) {
    return candidate + kFixedGuardBytes;
  }
  uint64_t taken_bytes = 0;
  for (const AddressRange& range : taken) taken_bytes += range.end - range.begin;
  return absl::ResourceExhaustedError(absl::StrCat(
      "no room for a fixed-address heap of ", max_size, " bytes: heapd's window ",
      RangeString(AddressRange{kFixedWindowBegin, kFixedWindowEnd}), " (",
      (kFixedWindowEnd - kFixedWindowBegin) >> 30,
      " GiB) has no free range that large: ", taken.size(), " fixed-address heaps hold ",
      taken_bytes >> 30, " GiB of it; remove one, or make this heap smaller or not fixed"));
}

}  // namespace heapd
