#include "util/byte_size.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

constexpr char kUnits[] = "KMGTP";  // 2^10 .. 2^50

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  auto refuse = [text](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a size", why.empty() ? "" : ": ", why,
                     " (a number of bytes, or with a unit K, M, G, T, P or KiB ... PiB: 64G = "
                     "64GiB = 64 x 2^30)"));
  };
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0) return refuse("");
  uint64_t number;
  if (!absl::SimpleAtoi(text.substr(0, digits), &number)) return refuse("too large");
  const std::string unit = absl::AsciiStrToUpper(text.substr(digits));
  if (unit.empty() || unit == "B") return number;
  int shift = 0;
  for (int i = 0; kUnits[i] != '\0'; ++i) {
    const std::string name(1, kUnits[i]);
    if (unit == name || unit == name + "IB") shift = 10 * (i + 1);
  }
  if (shift == 0) {
    if (unit.size() == 2 && unit[1] == 'B' &&
        absl::string_view(kUnits).find(unit[0]) != absl::string_view::npos) {
      return refuse(absl::StrCat("write ", text.substr(0, digits), unit.substr(0, 1),
                                 "iB: sizes are powers of two"));
    }
    return refuse(absl::StrCat("unknown unit '", text.substr(digits), "'"));
  }
  if (number > (UINT64_MAX >> shift)) return refuse("more than 2^64 bytes");
  return number << shift;
}

std::string FormatByteSize(uint64_t bytes) {
  if (bytes == 0) return "0";
  int unit = -1;
  while (unit + 1 < static_cast<int>(sizeof(kUnits)) - 1 &&
         (bytes & ((uint64_t{1} << 10) - 1)) == 0) {
    bytes >>= 10;
    ++unit;
  }
  return unit < 0 ? absl::StrCat(bytes) : absl::StrCat(bytes, std::string(1, kUnits[unit]));
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return FormatByteSize(size.bytes); }

}  // namespace heapd
