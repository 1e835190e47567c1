// Snapshots: a consistent, openable copy of a heap at a sync point.
//
// TARGET/NAME/ holds what a heap directory holds — the data file (cloned,
// else copied sparse, else copied), the metadata files of the committed
// epoch, an empty lock file — plus manifest.json (heapd.v1.SnapshotManifest
// in protobuf's JSON mapping: source heap, epoch, time, sizes, labels, copy
// method, CRC-32 of each metadata file). It is built in a hidden directory
// beside it, every file and the directory fsynced, then renamed into place
// and TARGET fsynced: a failed or killed snapshot leaves no NAME.
//
// A snapshot directory opens as a heap (PersistentHeap::Open) at the
// snapshot's epoch.
#ifndef HEAPD_SNAPSHOT_SNAPSHOT_H_
#define HEAPD_SNAPSHOT_SNAPSHOT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "heap/heap.h"
#include "proto/heapd.pb.h"

namespace heapd {

struct SnapshotRequest {
  std::string name;        // the snapshot's directory name (as a heap name)
  std::string target_dir;  // where it goes; must exist
  std::map<std::string, std::string> labels;
};

// Snapshots `heap` (served as `heap_name`, described by `source`).
// ALREADY_EXISTS if TARGET/NAME exists, RESOURCE_EXHAUSTED if the target
// is full, INVALID_ARGUMENT for a bad name or label.
absl::StatusOr<v1::SnapshotManifest> CreateSnapshot(PersistentHeap& heap,
                                                   const std::string& heap_name,
                                                   const v1::HeapInfo& source,
                                                   const SnapshotRequest& request);

// The manifest of the snapshot in `dir`. NOT_FOUND if it has none;
// DATA_LOSS if it does not parse.
absl::StatusOr<v1::SnapshotManifest> ReadManifest(const std::string& dir);

// Makes the new heap directory `heap_dir` from the snapshot in `dir`
// (cloned or copied like a snapshot; built hidden beside it, fsynced,
// renamed into place). ALREADY_EXISTS if `heap_dir` exists. The caller
// verifies the snapshot first.
absl::Status RestoreSnapshotInto(const std::string& dir, const std::string& heap_dir);

// Checks the snapshot in `dir`: its metadata files against the manifest's
// CRCs and its data file's size. DATA_LOSS naming the file that differs.
absl::Status VerifySnapshot(const std::string& dir);

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_SNAPSHOT_H_
