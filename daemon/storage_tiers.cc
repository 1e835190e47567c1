#include "daemon/storage_tiers.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "heap/heap_name.h"

namespace heapd {
namespace {

// Whether `inner` is `outer` or lies beneath it (both normalized).
bool Within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<StorageTier>> ParseStorageTiers(absl::string_view flag) {
  std::vector<StorageTier> tiers;
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--storage entry '", entry, "' is not NAME:PATH"));
    }
    StorageTier tier{std::string(entry.substr(0, colon)), std::string(entry.substr(colon + 1))};
    if (absl::Status s = ValidateHeapName(tier.name, "--storage tier"); !s.ok()) return s;
    const std::filesystem::path root = std::filesystem::path(tier.root).lexically_normal();
    if (!root.is_absolute()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--storage tier ", tier.name, ": path '", tier.root, "' is not absolute"));
    }
    tier.root = root.string();
    if (tier.root.size() > 1 && tier.root.back() == '/') tier.root.pop_back();
    for (const StorageTier& other : tiers) {
      if (other.name == tier.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("--storage names tier ", tier.name, " twice"));
      }
      if (Within(tier.root, other.root) || Within(other.root, tier.root)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--storage tiers ", other.name, " (", other.root, ") and ", tier.name,
                         " (", tier.root, ") overlap: each needs a directory of its own"));
      }
    }
    tiers.push_back(std::move(tier));
  }
  return tiers;
}

absl::StatusOr<std::vector<StorageTier>> StorageTiersFromFlags(absl::string_view storage_flag,
                                                               const std::string& state_dir) {
  if (storage_flag.empty()) return std::vector<StorageTier>{{kDefaultTierName, state_dir}};
  return ParseStorageTiers(storage_flag);
}

}  // namespace heapd
