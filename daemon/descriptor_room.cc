#include "daemon/descriptor_room.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

namespace heapd {

absl::StatusOr<uint64_t> DescriptorsHeld() {
  // Counted, not guessed from the lowest free number: closed descriptors
  // leave holes below the highest. A few ms at 10^5 descriptors.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return ErrnoStatus(errno, "count this process's descriptors");
  uint64_t held = 0;
  while (const dirent* entry = readdir(dir)) held += entry->d_name[0] != '.';
  closedir(dir);
  return held > 0 ? held - 1 : 0;  // not the one reading the directory
}

namespace {

// FDSize of /proc/self/status (a power of two above the highest
// descriptor); UINT64_MAX if unknown.
uint64_t DescriptorTableSize() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("FDSize:", 0) == 0) return std::strtoull(line.c_str() + 7, nullptr, 10);
  }
  return UINT64_MAX;
}

}  // namespace

absl::Status CheckDescriptorRoom(absl::string_view heap) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return absl::OkStatus();
  }
  // A small limit (tests, a user's own heapd) keeps an eighth of it free.
  const uint64_t wanted =
      kDescriptorsPerHeap + std::min<uint64_t>(kDescriptorReserve, limit.rlim_cur / 8);
  // The descriptor table's size bounds the descriptors held from above and
  // costs nothing to read: count only when it does not settle it.
  if (const uint64_t table = DescriptorTableSize();
      table != UINT64_MAX && table + wanted <= limit.rlim_cur) {
    return absl::OkStatus();
  }
  const absl::StatusOr<uint64_t> counted = DescriptorsHeld();
  // None left to count with (EMFILE): no room. /proc unreadable: unknown,
  // and the heap's own opens will say.
  if (!counted.ok() && counted.status().code() != absl::StatusCode::kResourceExhausted) {
    return absl::OkStatus();
  }
  const uint64_t held = counted.ok() ? *counted : limit.rlim_cur;
  if (held + wanted <= limit.rlim_cur) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("heap ", heap, " not made or restored: heapd holds ", held,
                   " file descriptors of its limit of ", limit.rlim_cur,
                   " (RLIMIT_NOFILE; an open heap takes about 7, a session 2 or 3): raise "
                   "LimitNOFILE in heapd.service (deploy/systemd sets 1048576)"));
}

}  // namespace heapd
