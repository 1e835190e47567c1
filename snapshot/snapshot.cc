#include "snapshot/snapshot.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "heap/data_file.h"
#include "heap/heap_name.h"
#include "heap/metadata_store.h"
#include "snapshot/file_copy.h"
#include "zlib.h"

namespace heapd {
namespace {

constexpr char kManifest[] = "manifest.json";
constexpr char kDataFile[] = "data";
constexpr size_t kMaxLabels = 32;
constexpr size_t kMaxLabelBytes = 256;

bool IsMetadataFile(const std::string& name) {
  return name == "checkpoint" || absl::StartsWith(name, "log.");
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("read ", path));
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

uint32_t Crc32(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
            static_cast<uInt>(bytes.size())));
}

absl::Status ValidateLabels(const std::map<std::string, std::string>& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(absl::StrCat(labels.size(), " labels; at most ", kMaxLabels));
  }
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > kMaxLabelBytes || value.size() > kMaxLabelBytes) {
      return absl::InvalidArgumentError(absl::StrCat("label '", absl::CHexEscape(key),
                                                     "' is empty or longer than ",
                                                     kMaxLabelBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// Copies the metadata files of heap directory `from` into `to`; records
// their CRCs.
absl::Status CopyMetadata(const std::string& from, const std::string& to,
                          v1::SnapshotManifest* manifest) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(from, error)) {
    const std::string name = entry.path().filename();
    if (!IsMetadataFile(name)) continue;
    absl::StatusOr<std::string> bytes = ReadWholeFile(entry.path());
    if (!bytes.ok()) return bytes.status();
    if (absl::Status s = WriteFileAtomically(to, name, *bytes, "snapshot.metadata"); !s.ok()) return s;
    (*manifest->mutable_metadata_crc32())[name] = Crc32(*bytes);
  }
  if (error) return ErrnoStatus(error.value(), absl::StrCat("list ", from));
  return absl::OkStatus();
}

std::string RandomSuffix() {
  uint64_t random = 0;
  (void)!getrandom(&random, sizeof(random), 0);
  return absl::StrCat(getpid(), "-", absl::Hex(random));
}

}  // namespace

absl::StatusOr<v1::SnapshotManifest> CreateSnapshot(PersistentHeap& heap,
                                                   const std::string& heap_name,
                                                   const v1::HeapInfo& source,
                                                   const SnapshotRequest& request) {
  if (absl::Status s = ValidateHeapName(request.name, "snapshot"); !s.ok()) return s;
  if (absl::Status s = ValidateLabels(request.labels); !s.ok()) return s;
  const std::string final_dir = absl::StrCat(request.target_dir, "/", request.name);
  struct stat st;
  if (stat(final_dir.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("snapshot ", final_dir, " already exists"));
  }
  // A snapshot of this name that was killed midway left a hidden partial
  // directory: nothing lists it; clear it now.
  std::error_code ignored_error;
  for (const auto& entry : std::filesystem::directory_iterator(request.target_dir, ignored_error)) {
    if (absl::StartsWith(entry.path().filename().string(),
                         absl::StrCat(".", request.name, ".partial-"))) {
      std::filesystem::remove_all(entry.path(), ignored_error);
    }
  }
  const std::string building =
      absl::StrCat(request.target_dir, "/.", request.name, ".partial-", RandomSuffix());
  if (mkdir(building.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, absl::StrCat("create snapshot directory ", building));
  }
  auto give_up = [&building](absl::Status status) {
    std::error_code ignored;
    std::filesystem::remove_all(building, ignored);
    return status;
  };
  v1::SnapshotManifest manifest;
  manifest.set_name(request.name);
  manifest.set_heap(heap_name);
  manifest.mutable_labels()->insert(request.labels.begin(), request.labels.end());
  *manifest.mutable_source() = source;
  absl::Status copied = heap.WithFilesAtRest(
      [&](const std::string& dir, int data_fd, uint64_t epoch) -> absl::Status {
        manifest.set_epoch(epoch);
        absl::StatusOr<CopyResult> data =
            CopyFileContents(data_fd, absl::StrCat(building, "/", kDataFile));
        if (!data.ok()) return data.status();
        manifest.set_copy_method(CopyMethodName(data->method));
        manifest.set_data_bytes(data->size);
        manifest.set_bytes_written(data->bytes_written);
        return CopyMetadata(dir, building, &manifest);
      });
  if (!copied.ok()) return give_up(copied);
  manifest.set_created_unix_ns(absl::ToUnixNanos(absl::Now()));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (absl::Status s = WriteFileAtomically(building, kManifest, json, "snapshot.manifest"); !s.ok()) return give_up(s);
  if (absl::Status s = WriteFileAtomically(building, "lock", "", "snapshot.lock"); !s.ok()) return give_up(s);
  if (absl::Status s = SyncDirectory(building); !s.ok()) return give_up(s);
  if (renameat2(AT_FDCWD, building.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    return give_up(ErrnoStatus(errno, absl::StrCat("rename ", building, " to ", final_dir)));
  }
  if (absl::Status s = SyncDirectory(request.target_dir); !s.ok()) return s;
  return manifest;
}

absl::Status RestoreSnapshotInto(const std::string& dir, const std::string& heap_dir) {
  struct stat st;
  if (stat(heap_dir.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(heap_dir, " already exists"));
  }
  const size_t slash = heap_dir.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : heap_dir.substr(0, slash);
  const std::string building = absl::StrCat(heap_dir, ".restoring-", RandomSuffix());
  if (mkdir(building.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, absl::StrCat("create ", building));
  }
  auto give_up = [&building](absl::Status status) {
    std::error_code ignored;
    std::filesystem::remove_all(building, ignored);
    return status;
  };
  const std::string data = absl::StrCat(dir, "/", kDataFile);
  const int data_fd = open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (data_fd < 0) return give_up(ErrnoStatus(errno, absl::StrCat("open ", data)));
  absl::StatusOr<CopyResult> copied =
      CopyFileContents(data_fd, absl::StrCat(building, "/", kDataFile));
  close(data_fd);
  if (!copied.ok()) return give_up(copied.status());
  if (absl::Status s = ReserveWholeFile(absl::StrCat(building, "/", kDataFile)); !s.ok()) {
    return give_up(s);
  }
  v1::SnapshotManifest ignored;
  if (absl::Status s = CopyMetadata(dir, building, &ignored); !s.ok()) return give_up(s);
  if (absl::Status s = WriteFileAtomically(building, "lock", "", "restore.lock"); !s.ok()) {
    return give_up(s);
  }
  if (absl::Status s = SyncDirectory(building); !s.ok()) return give_up(s);
  if (renameat2(AT_FDCWD, building.c_str(), AT_FDCWD, heap_dir.c_str(), RENAME_NOREPLACE) != 0) {
    return give_up(ErrnoStatus(errno, absl::StrCat("rename ", building, " to ", heap_dir)));
  }
  return SyncDirectory(parent);
}

absl::StatusOr<v1::SnapshotManifest> ReadManifest(const std::string& dir) {
  absl::StatusOr<std::string> json = ReadWholeFile(absl::StrCat(dir, "/", kManifest));
  if (!json.ok()) return json.status();
  v1::SnapshotManifest manifest;
  if (!google::protobuf::util::JsonStringToMessage(*json, &manifest).ok()) {
    return absl::DataLossError(absl::StrCat(dir, "/", kManifest, " does not parse"));
  }
  return manifest;
}

absl::Status VerifySnapshot(const std::string& dir) {
  absl::StatusOr<v1::SnapshotManifest> manifest = ReadManifest(dir);
  if (!manifest.ok()) return manifest.status();
  if (manifest->metadata_crc32().empty()) {
    return absl::DataLossError(absl::StrCat(dir, ": the manifest lists no metadata files"));
  }
  for (const auto& [name, crc] : manifest->metadata_crc32()) {
    if (!IsMetadataFile(name)) {
      return absl::DataLossError(absl::StrCat(dir, ": the manifest lists '", name, "'"));
    }
    absl::StatusOr<std::string> bytes = ReadWholeFile(absl::StrCat(dir, "/", name));
    if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
    if (Crc32(*bytes) != crc) {
      return absl::DataLossError(absl::StrCat(dir, "/", name, " does not match its checksum"));
    }
  }
  struct stat st;
  const std::string data = absl::StrCat(dir, "/", kDataFile);
  if (stat(data.c_str(), &st) != 0 ||
      static_cast<uint64_t>(st.st_size) != manifest->data_bytes()) {
    return absl::DataLossError(absl::StrCat(data, " is missing or not ",
                                            manifest->data_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace heapd
