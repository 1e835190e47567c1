// What a snapshot directory holds, and how heapd checks what it reads from
// one. A snapshot is a directory NAME with
//   manifest.json  heapd.v1.SnapshotManifest in protobuf's JSON mapping:
//                  source heap, epoch, time, sizes, labels, who made it,
//                  the CRC-32 of each metadata file;
//   data           the heap's data file at that epoch;
//   checkpoint, log.G   the metadata files of that epoch.
//
// heapd trusts nothing it reads from a snapshot, even one it wrote: a user
// may have edited any file of one in their own directory. Everything read
// is capped in size before it is read, and parsed with bounds here.
#ifndef HEAPD_SNAPSHOT_SNAPSHOT_FORMAT_H_
#define HEAPD_SNAPSHOT_SNAPSHOT_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "heap/metadata_store.h"
#include "proto/heapd.pb.h"

namespace heapd {

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kSnapshotDataFile[] = "data";
// The most heapd reads of a manifest, and of all metadata files together.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;
// Entries of a snapshot directory heapd lists.
inline constexpr size_t kMaxSnapshotEntries = 4096;
inline constexpr size_t kMaxLabels = 32;
inline constexpr size_t kMaxLabelBytes = 256;

// OK if `labels` are few and short enough; INVALID_ARGUMENT saying which.
absl::Status ValidateLabels(const std::map<std::string, std::string>& labels);

// OK if `target_dir` may name where snapshots are: empty (heapd's own
// directory) or an absolute path shorter than PATH_MAX without a NUL byte.
// INVALID_ARGUMENT otherwise. Whether the caller may use it is the
// kernel's to say, when the caller's own process opens it.
absl::Status ValidateSnapshotDir(absl::string_view target_dir);

// manifest.json's bytes.
std::string ManifestToJson(const v1::SnapshotManifest& manifest);

// Parses manifest.json of the snapshot `where` and checks its fields
// (names, labels, sizes, metadata file names). DATA_LOSS saying what is
// wrong.
absl::StatusOr<v1::SnapshotManifest> ParseManifest(absl::string_view json, absl::string_view where);

// A snapshot whose files were read and checked.
struct VerifiedSnapshot {
  v1::SnapshotManifest manifest;
  RecoveredMetadata metadata;  // the state at manifest.epoch
};

// Checks what was read of the snapshot `where`: the manifest parses; the
// metadata files are exactly those it lists, each with its CRC; they
// recover to its epoch with no torn record; they describe a heap whose data
// file has `data_bytes` bytes, which is the manifest's size. DATA_LOSS
// naming the file or field that is wrong.
absl::StatusOr<VerifiedSnapshot> VerifySnapshotFiles(
    absl::string_view where, absl::string_view manifest_json,
    const std::map<std::string, std::string>& metadata_files, uint64_t data_bytes);

// The chunks `state` uses (small chunks, large runs), as the heap reads its
// records (the last of each chunk wins; a log's records free chunks too):
// the only ones whose data a snapshot of it needs.
absl::StatusOr<std::vector<bool>> UsedChunks(const Checkpoint& state);

// The CRC-32 recorded for a metadata file.
uint32_t MetadataCrc32(absl::string_view bytes);

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_SNAPSHOT_FORMAT_H_
