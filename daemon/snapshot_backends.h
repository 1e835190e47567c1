// Where HeapdService's snapshot calls go. A request that names a store
// (store_dir) goes to a snapshot store: deduplicated versions that many
// nodes share (snapshot/store_snapshots.h). Any other goes to directory
// snapshots: a full copy each, in heapd's own directory or a caller's
// (snapshot/snapshot_store.h). A backend does the call's work, counts it
// in the metrics and logs it; HeapdService has checked the caller's access
// and limits first, and never asks which backend it has.
#ifndef HEAPD_DAEMON_SNAPSHOT_BACKENDS_H_
#define HEAPD_DAEMON_SNAPSHOT_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/caller.h"
#include "daemon/heap_registry.h"
#include "daemon/metrics.h"
#include "proto/heapd.pb.h"
#include "snapshot/snapshot_store.h"
#include "snapshot/store_snapshots.h"

namespace heapd {

class SnapshotBackend {
 public:
  virtual ~SnapshotBackend() = default;

  // Snapshots `heap` (its writers synced) as `request` asks, for
  // `caller`; `source` describes it. Logged. `start`: when the call began.
  virtual absl::StatusOr<v1::SnapshotManifest> Create(const SnapshotCaller& who,
                                                      const Caller& caller, ServedHeap& heap,
                                                      const v1::HeapInfo& source,
                                                      const v1::CreateSnapshotRequest& request,
                                                      absl::Time start) = 0;
  // Counts a CreateSnapshot call that ended with `status` (and `manifest`)
  // after `seconds`, whether or not it reached Create.
  virtual void CountCreate(const absl::Status& status, double seconds,
                           const v1::SnapshotManifest& manifest) = 0;

  virtual absl::Status List(const SnapshotCaller& who, const v1::ListSnapshotsRequest& request,
                            v1::ListSnapshotsResponse* response) = 0;
  // Reads and checks the snapshot whole; its data may have at most
  // `max_bytes`.
  virtual absl::StatusOr<v1::SnapshotManifest> Verify(const SnapshotCaller& who,
                                                      const v1::SnapshotRef& ref,
                                                      uint64_t max_bytes) = 0;
  virtual absl::Status Remove(const SnapshotCaller& who, const Caller& caller,
                              const v1::SnapshotRef& ref, v1::RemoveSnapshotResponse* response) = 0;
  // Builds heap `heap_name`'s directory in `heaps_dir` from the snapshot
  // (SnapshotStore::Restore). Counted.
  virtual absl::StatusOr<std::unique_ptr<RestoredHeapDir>> Restore(
      const SnapshotCaller& who, const v1::RestoreSnapshotRequest& request,
      const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
      v1::SnapshotManifest* manifest) = 0;
  // Logs that `caller` restored heap `heap` (now `info`) from `manifest`.
  virtual void LogRestored(const std::string& heap, const Caller& caller,
                           const v1::RestoreSnapshotRequest& request,
                           const v1::SnapshotManifest& manifest, const v1::HeapInfo& info) = 0;
};

// A full copy per snapshot, in a directory.
class DirectorySnapshots final : public SnapshotBackend {
 public:
  DirectorySnapshots(SnapshotStore* snapshots, Metrics* metrics)
      : snapshots_(snapshots), metrics_(metrics) {}

  absl::StatusOr<v1::SnapshotManifest> Create(const SnapshotCaller& who, const Caller& caller,
                                              ServedHeap& heap, const v1::HeapInfo& source,
                                              const v1::CreateSnapshotRequest& request,
                                              absl::Time start) override;
  void CountCreate(const absl::Status& status, double seconds,
                   const v1::SnapshotManifest& manifest) override;
  absl::Status List(const SnapshotCaller& who, const v1::ListSnapshotsRequest& request,
                    v1::ListSnapshotsResponse* response) override;
  absl::StatusOr<v1::SnapshotManifest> Verify(const SnapshotCaller& who, const v1::SnapshotRef& ref,
                                              uint64_t max_bytes) override;
  absl::Status Remove(const SnapshotCaller& who, const Caller& caller, const v1::SnapshotRef& ref,
                      v1::RemoveSnapshotResponse* response) override;
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> Restore(
      const SnapshotCaller& who, const v1::RestoreSnapshotRequest& request,
      const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
      v1::SnapshotManifest* manifest) override;
  void LogRestored(const std::string& heap, const Caller& caller,
                   const v1::RestoreSnapshotRequest& request, const v1::SnapshotManifest& manifest,
                   const v1::HeapInfo& info) override;

 private:
  // The directory a request names, or heapd's own.
  std::string DirOf(const std::string& target_dir) const;

  SnapshotStore* const snapshots_;
  Metrics* const metrics_;
};

// Versions in a snapshot store.
class StoreBackend final : public SnapshotBackend {
 public:
  StoreBackend(StoreSnapshots* stores, Metrics* metrics) : stores_(stores), metrics_(metrics) {}

  absl::StatusOr<v1::SnapshotManifest> Create(const SnapshotCaller& who, const Caller& caller,
                                              ServedHeap& heap, const v1::HeapInfo& source,
                                              const v1::CreateSnapshotRequest& request,
                                              absl::Time start) override;
  void CountCreate(const absl::Status& status, double seconds,
                   const v1::SnapshotManifest& manifest) override;
  absl::Status List(const SnapshotCaller& who, const v1::ListSnapshotsRequest& request,
                    v1::ListSnapshotsResponse* response) override;
  // Every selected part; several (a job's version): its name and their
  // usage added up.
  absl::StatusOr<v1::SnapshotManifest> Verify(const SnapshotCaller& who, const v1::SnapshotRef& ref,
                                              uint64_t max_bytes) override;
  absl::Status Remove(const SnapshotCaller& who, const Caller& caller, const v1::SnapshotRef& ref,
                      v1::RemoveSnapshotResponse* response) override;
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> Restore(
      const SnapshotCaller& who, const v1::RestoreSnapshotRequest& request,
      const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
      v1::SnapshotManifest* manifest) override;
  void LogRestored(const std::string& heap, const Caller& caller,
                   const v1::RestoreSnapshotRequest& request, const v1::SnapshotManifest& manifest,
                   const v1::HeapInfo& info) override;

 private:
  StoreSnapshots* const stores_;
  Metrics* const metrics_;
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_SNAPSHOT_BACKENDS_H_
