#include "util/random_name.h"

#include <sys/random.h>

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace heapd {

std::string RandomName() {
  uint64_t random[2];
  while (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
  }
  return absl::StrCat(absl::Hex(random[0], absl::kZeroPad16),
                      absl::Hex(random[1], absl::kZeroPad16));
}

}  // namespace heapd
