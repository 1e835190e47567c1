// Sizes as people write them, for every size heapd takes from a person
// (heapctl, heapd's flags, later the C and Python APIs):
//   "4096"  bytes;  "64K" = "64KiB" = 64 x 2^10;  "1M" = "1MiB";  "16G" =
//   "16GiB";  "2T" = "2TiB";  "1P" = "1PiB".
// Powers of two only (heaps and chunks are sized in them); "KB" and "GB"
// are refused rather than guessed. Case-insensitive units, no spaces,
// whole numbers only.
#ifndef HEAPD_UTIL_BYTE_SIZE_H_
#define HEAPD_UTIL_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heapd {

// The bytes `text` means; INVALID_ARGUMENT naming the text and the accepted
// forms when it is not a size, or when it does not fit 64 bits.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// `bytes` in the largest unit that divides it exactly ("64G", "1536M",
// "4097"), so that ParseByteSize(FormatByteSize(n)) == n.
std::string FormatByteSize(uint64_t bytes);

// A size flag: ABSL_FLAG(heapd::ByteSize, max, heapd::ByteSize{1 << 30}, ...)
// takes --max=64G.
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace heapd

#endif  // HEAPD_UTIL_BYTE_SIZE_H_
