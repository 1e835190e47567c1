// The layout of a heap's directory, in one place. A heap is a directory
// (heapd's STATE_DIR/heaps/NAME) holding:
//   data         the data file (heap/data_file.h)
//   lock         flocked by the process that has the heap open
//   checkpoint   the metadata at some epoch, and log.G its epoch records
//                (heap/metadata_store.h): a snapshot carries these
//   undo/        pre-images of object contents (heap/content_undo.h)
// A heap directory is built under a hidden name in its parent (HeapDirBuilder)
// and renamed into place without replacing anything; a heap is removed by
// renaming it to a hidden name first. A hidden name starts with '.', which
// no heap name does: a crash midway leaves nothing that is served, and
// heapd sweeps hidden names away when it starts (daemon/heap_registry.h).
#ifndef HEAPD_HEAP_HEAP_DIR_H_
#define HEAPD_HEAP_HEAP_DIR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

namespace heapd {

inline constexpr char kDataFileName[] = "data";
inline constexpr char kLockFileName[] = "lock";
inline constexpr char kCheckpointFileName[] = "checkpoint";
inline constexpr char kUndoDirName[] = "undo";
// Most entries a heap directory is read with (it holds a handful).
inline constexpr size_t kMaxHeapDirEntries = size_t{1} << 16;

// "log.G".
std::string LogFileName(uint64_t generation);
// G of a log file's name "log.G" (decimal, at most 20 digits); nothing for
// any other name.
std::optional<uint64_t> LogGeneration(absl::string_view name);
// The checkpoint's or a log file's name: the files of a heap's metadata.
bool IsMetadataFileName(absl::string_view name);

// Why a heap directory has a hidden name.
enum class HiddenPurpose { kCreating, kRestoring, kRemoving };
// A new hidden name for heap `heap_name` in its parent:
// ".creating.NAME.RANDOM", ".restoring.NAME.RANDOM" or ".removing.NAME.RANDOM".
std::string HiddenHeapDirName(HiddenPurpose purpose, absl::string_view heap_name);
bool IsHiddenHeapDirName(absl::string_view name);

// A heap directory built under a hidden name in its parent: removed, with
// everything in it, unless committed.
class HeapDirBuilder {
 public:
  // Makes a hidden directory (0700) for heap `heap_name` in the directory
  // `parent` (opened once, never through a symlink), with an empty lock
  // file.
  static absl::StatusOr<std::unique_ptr<HeapDirBuilder>> Start(const std::string& parent,
                                                               absl::string_view heap_name,
                                                               HiddenPurpose purpose);
  ~HeapDirBuilder();
  HeapDirBuilder(const HeapDirBuilder&) = delete;
  HeapDirBuilder& operator=(const HeapDirBuilder&) = delete;

  // The directory being built, and a descriptor of it of the caller's own.
  int dir_fd() const { return dir_.get(); }
  absl::StatusOr<UniqueFd> DupDirFd() const;
  // Its path, for what takes one (and messages).
  std::string path() const;
  // The path of `name` in it.
  std::string PathOf(absl::string_view name) const;

  // Makes what was written in it durable, renames it to `name` in the
  // parent (ALREADY_EXISTS if that exists: nothing is replaced) and makes
  // the rename durable. The directory is then the caller's.
  absl::Status Commit(const std::string& name);

 private:
  HeapDirBuilder(std::string parent_path, UniqueFd parent, std::string hidden_name, UniqueFd dir)
      : parent_path_(std::move(parent_path)),
        parent_(std::move(parent)),
        hidden_name_(std::move(hidden_name)),
        dir_(std::move(dir)) {}

  const std::string parent_path_;
  const UniqueFd parent_;
  const std::string hidden_name_;
  const UniqueFd dir_;
  bool committed_ = false;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_HEAP_DIR_H_
