// PrefetchedNames: the names heapd looked up for a session at attach
// (AttachOptions::prefetch), served to Find without a call. Each is used
// once, as of attach: a later lookup of the same name asks heapd, which may
// know a newer binding. Thread-safe; a leaf lock.
#ifndef HEAPD_CLIENT_PREFETCHED_NAMES_H_
#define HEAPD_CLIENT_PREFETCHED_NAMES_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "heap/name_table.h"

namespace heapd {

class PrefetchedNames {
 public:
  // Adds what attach found (a later entry of a name replaces an earlier).
  void Put(std::vector<NameEntry> entries) ABSL_LOCKS_EXCLUDED(mu_);
  // The entry of `name` if it was prefetched and not used yet; it is used
  // now.
  std::optional<NameEntry> Take(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops `name` (this process unbinds it).
  void Forget(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<std::string, NameEntry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_PREFETCHED_NAMES_H_
