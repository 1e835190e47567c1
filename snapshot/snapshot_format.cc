#include "snapshot/snapshot_format.h"

#include <climits>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "allocator/chunk_directory.h"
#include "google/protobuf/util/json_util.h"
#include "heap/heap.h"
#include "heap/heap_dir.h"
#include "heap/heap_name.h"
#include "zlib.h"

namespace heapd {
namespace {

// A snapshot holds a checkpoint and the one log that continues it.
constexpr size_t kMaxMetadataFiles = 2;

absl::Status Corrupt(absl::string_view where, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("snapshot ", where, ": ", what));
}

}  // namespace

absl::Status ValidateLabels(const std::map<std::string, std::string>& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(absl::StrCat(labels.size(), " labels; at most ", kMaxLabels));
  }
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > kMaxLabelBytes || value.size() > kMaxLabelBytes) {
      return absl::InvalidArgumentError(absl::StrCat("label '", absl::CHexEscape(key),
                                                     "' is empty or it or its value is longer "
                                                     "than ",
                                                     kMaxLabelBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSnapshotDir(absl::string_view target_dir) {
  if (target_dir.empty()) return absl::OkStatus();
  if (target_dir[0] != '/' || target_dir.size() >= PATH_MAX ||
      target_dir.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot directory '",
                                                   absl::CHexEscape(target_dir.substr(0, 256)),
                                                   "' is not an absolute path"));
  }
  return absl::OkStatus();
}

uint32_t MetadataCrc32(absl::string_view bytes) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                     reinterpret_cast<const Bytef*>(bytes.data()),
                                     static_cast<uInt>(bytes.size())));
}

std::string ManifestToJson(const v1::SnapshotManifest& manifest) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(manifest, &json, options);
  return json;
}

absl::StatusOr<v1::SnapshotManifest> ParseManifest(absl::string_view json,
                                                   absl::string_view where) {
  if (json.size() > kMaxManifestBytes) return Corrupt(where, "manifest.json is too large");
  v1::SnapshotManifest manifest;
  const google::protobuf::util::Status parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &manifest);
  if (!parsed.ok()) {
    return Corrupt(where, absl::StrCat("manifest.json does not parse: ",
                                       std::string(parsed.message()).substr(0, 200)));
  }
  if (absl::Status s = ValidateHeapName(manifest.name(), "snapshot"); !s.ok()) {
    return Corrupt(where, s.message());
  }
  if (absl::Status s = ValidateHeapName(manifest.heap()); !s.ok()) {
    return Corrupt(where, s.message());
  }
  if (absl::Status s = ValidateLabels({manifest.labels().begin(), manifest.labels().end()});
      !s.ok()) {
    return Corrupt(where, s.message());
  }
  if (manifest.data_bytes() > kMaxHeapBytes) {
    return Corrupt(where, absl::StrCat("a data file of ", manifest.data_bytes(), " bytes"));
  }
  if (manifest.metadata_crc32().empty() || manifest.metadata_crc32().size() > kMaxMetadataFiles) {
    return Corrupt(where, absl::StrCat("the manifest lists ", manifest.metadata_crc32().size(),
                                       " metadata files"));
  }
  for (const auto& [name, crc] : manifest.metadata_crc32()) {
    if (!IsMetadataFileName(name)) {
      return Corrupt(where, absl::StrCat("the manifest lists '", absl::CHexEscape(name), "'"));
    }
  }
  return manifest;
}

absl::StatusOr<VerifiedSnapshot> VerifySnapshotFiles(
    absl::string_view where, absl::string_view manifest_json,
    const std::map<std::string, std::string>& metadata_files, uint64_t data_bytes) {
  absl::StatusOr<v1::SnapshotManifest> manifest = ParseManifest(manifest_json, where);
  if (!manifest.ok()) return manifest.status();
  for (const auto& [name, crc] : manifest->metadata_crc32()) {
    auto file = metadata_files.find(name);
    if (file == metadata_files.end()) return Corrupt(where, absl::StrCat(name, " is missing"));
    if (MetadataCrc32(file->second) != crc) {
      return Corrupt(where, absl::StrCat(name, " does not match its checksum"));
    }
  }
  for (const auto& [name, bytes] : metadata_files) {
    if (manifest->metadata_crc32().count(name) == 0) {
      return Corrupt(where, absl::StrCat(name, " is not in the manifest"));
    }
  }
  auto checkpoint = metadata_files.find(kCheckpointFileName);
  if (checkpoint == metadata_files.end()) return Corrupt(where, "it has no checkpoint");
  const std::string label = absl::StrCat("snapshot ", where);
  absl::StatusOr<Checkpoint> base = DecodeCheckpointFile(checkpoint->second, label);
  if (!base.ok()) return base.status();
  const std::string log_name = LogFileName(base->log_generation);
  auto log = metadata_files.find(log_name);
  if (metadata_files.size() != (log == metadata_files.end() ? 1u : 2u)) {
    return Corrupt(where, absl::StrCat("its metadata files are not the checkpoint and ", log_name));
  }
  absl::StatusOr<RecoveredMetadata> metadata =
      ReplayLog(*std::move(base), log == metadata_files.end() ? "" : log->second,
                absl::StrCat(label, "/", log_name), TornTail::kCorrupt);
  if (!metadata.ok()) return metadata.status();
  if (metadata->state.epoch != manifest->epoch()) {
    return Corrupt(where, absl::StrCat("its metadata is at epoch ", metadata->state.epoch,
                                       ", its manifest says ", manifest->epoch()));
  }
  if (data_bytes != manifest->data_bytes()) {
    return Corrupt(where, absl::StrCat("its data file has ", data_bytes,
                                       " bytes, its manifest says ", manifest->data_bytes()));
  }
  if (absl::Status s = PersistentHeap::ValidateState(label, metadata->state, data_bytes); !s.ok()) {
    return s;
  }
  return VerifiedSnapshot{*std::move(manifest), *std::move(metadata)};
}

// The chunks the committed epoch uses (small chunks, large runs): its
// records read as the heap reads them (the last of each chunk wins; a
// log's records free chunks too).
absl::StatusOr<std::vector<bool>> UsedChunks(const Checkpoint& state) {
  absl::StatusOr<std::unique_ptr<ChunkDirectory>> directory =
      ChunkDirectory::FromRecords(state.capacity_chunks, state.chunks);
  if (!directory.ok()) return directory.status();
  std::vector<bool> used(state.capacity_chunks, false);
  for (const ChunkRecord& record : (*directory)->AllRecords()) {
    const uint64_t length = record.kind == ChunkKind::kLargeHead ? record.run_chunks : 1;
    for (uint64_t c = record.chunk; c < record.chunk + length && c < used.size(); ++c) {
      used[c] = true;
    }
  }
  return used;
}

}  // namespace heapd
