#include "heap/heap_name.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

constexpr size_t kMaxHeapNameLength = 64;

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

}  // namespace

absl::Status ValidateHeapName(absl::string_view name, absl::string_view what) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " name is empty"));
  if (name.size() > kMaxHeapNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name '", absl::CHexEscape(name.substr(0, 16)), "...' is longer than ",
                     kMaxHeapNameLength, " bytes"));
  }
  if (name[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name '", absl::CHexEscape(name), "' starts with '.'"));
  }
  for (char c : name) {
    if (!IsNameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " name '", absl::CHexEscape(name),
                                                     "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace heapd
