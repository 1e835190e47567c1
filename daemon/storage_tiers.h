// Storage tiers: the storage roots one heapd keeps heaps on, each named by
// the admin (--storage=tmpfs:/dev/shm/heapd,nvme:/var/lib/heapd; the first
// is the default). A heap lives in TIER_ROOT/heaps/NAME; what a heap and a
// snapshot's manifest record is the tier's name, never its path, so a
// reordered list, or another node with the same names, finds them.
#ifndef HEAPD_DAEMON_STORAGE_TIERS_H_
#define HEAPD_DAEMON_STORAGE_TIERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heapd {

struct StorageTier {
  std::string name;  // as a heap name: [A-Za-z0-9._-], not starting with '.'
  std::string root;  // absolute; heaps are under root/heaps
};

// The tier heapd uses when --storage is not given: --state_dir.
inline constexpr char kDefaultTierName[] = "default";

// Parses --storage ("NAME:PATH,NAME:PATH,..."). INVALID_ARGUMENT naming
// the entry for a missing or malformed name, a relative path, a name or a
// path given twice, or one root inside another.
absl::StatusOr<std::vector<StorageTier>> ParseStorageTiers(absl::string_view flag);

// The tiers heapd serves: --storage if given, else `state_dir` alone as
// kDefaultTierName.
absl::StatusOr<std::vector<StorageTier>> StorageTiersFromFlags(absl::string_view storage_flag,
                                                               const std::string& state_dir);

}  // namespace heapd

#endif  // HEAPD_DAEMON_STORAGE_TIERS_H_
