// HeapRegistry: the heaps under the state directory, by name. Every heap is
// opened when the daemon starts and stays open until it is removed or the
// daemon stops; a heap that cannot be opened (corrupt metadata) is reported
// with its error and left alone on disk.
//
// Layout: STATE_DIR/heaps/NAME/ is one heap (heap/heap.h).
// Thread-safe.
#ifndef HEAPD_DAEMON_HEAP_REGISTRY_H_
#define HEAPD_DAEMON_HEAP_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "heap/heap.h"
#include "heap/heap_name.h"

namespace heapd {

// A heap the daemon serves. Shared by the registry and the sessions on it.
struct ServedHeap {
  std::string name;
  std::unique_ptr<PersistentHeap> heap;
  bool reflink = false;  // its file system can clone files (cheap snapshots)
};

// `heap` served as `name`, with its file system's reflink support probed.
std::shared_ptr<ServedHeap> MakeServedHeap(const std::string& name, std::unique_ptr<PersistentHeap> heap);

class HeapRegistry {
 public:
  // Opens every heap under `state_dir`, creating the directories if needed.
  static absl::StatusOr<std::unique_ptr<HeapRegistry>> Open(const std::string& state_dir);

  // Creates heap `name`. ALREADY_EXISTS if it exists.
  absl::StatusOr<std::shared_ptr<ServedHeap>> Create(const std::string& name,
                                                     const HeapConfig& config);

  // Opens heap `name` that was just made in heaps_dir() (a restore).
  // ALREADY_EXISTS if the registry has one of that name.
  absl::StatusOr<std::shared_ptr<ServedHeap>> OpenNew(const std::string& name);

  // The heap `name`; NOT_FOUND if there is none, or the error it failed to
  // open with.
  absl::StatusOr<std::shared_ptr<ServedHeap>> Get(absl::string_view name) const;

  // Closes heap `name` and deletes its directory. REQUIRES: no session uses
  // it (the caller checks).
  absl::Status Remove(absl::string_view name);

  std::vector<std::shared_ptr<ServedHeap>> List() const;

  // Heaps that failed to open, with why.
  std::map<std::string, absl::Status> Broken() const;

  // Persists an epoch of every heap (at shutdown); returns the first error.
  absl::Status SyncAll();

  const std::string& heaps_dir() const { return heaps_dir_; }

 private:
  explicit HeapRegistry(std::string heaps_dir) : heaps_dir_(std::move(heaps_dir)) {}

  const std::string heaps_dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServedHeap>, std::less<>> heaps_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status, std::less<>> broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_HEAP_REGISTRY_H_
