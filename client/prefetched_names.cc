#include "client/prefetched_names.h"

#include <utility>

namespace heapd {

void PrefetchedNames::Put(std::vector<NameEntry> entries) {
  absl::MutexLock lock(&mu_);
  for (NameEntry& entry : entries) {
    std::string name = entry.name;
    entries_[std::move(name)] = std::move(entry);
  }
}

std::optional<NameEntry> PrefetchedNames::Take(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  NameEntry entry = std::move(it->second);
  entries_.erase(it);
  return entry;
}

void PrefetchedNames::Forget(const std::string& name) {
  absl::MutexLock lock(&mu_);
  entries_.erase(name);
}

}  // namespace heapd
