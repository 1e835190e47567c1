#include "heap/durable_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "heap/fault_point.h"
#include "util/dir_files.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// A larger log is built under this name, then renamed over the log.
constexpr char kLargerLogName[] = "redo.larger";
// The working image is loaded in steps of this many bytes.
constexpr uint64_t kLoadStep = uint64_t{2} << 20;

bool AllZero(const char* bytes, uint64_t size) {
  return size == 0 || (bytes[0] == 0 && std::memcmp(bytes, bytes + 1, size - 1) == 0);
}

}  // namespace

absl::Status DurableImage::CreateLog(int dir, const std::string& path, uint64_t log_bytes) {
  return RedoLog::Create(dir, kRedoLogFileName, log_bytes,
                         absl::StrCat(path, "/", kRedoLogFileName))
      .status();
}

absl::StatusOr<std::unique_ptr<DurableImage>> DurableImage::Open(int dir, const std::string& path,
                                                                 std::unique_ptr<DataFile> data,
                                                                 uint64_t committed_epoch,
                                                                 uint64_t log_bytes) {
  const std::string log_path = absl::StrCat(path, "/", kRedoLogFileName);
  // A larger log that a crash kept from replacing the log: the log it was
  // to replace was empty, and is still in place.
  unlinkat(dir, kLargerLogName, 0);
  unlinkat(dir, absl::StrCat(kLargerLogName, ".new").c_str(), 0);
  struct stat st;
  absl::StatusOr<std::unique_ptr<RedoLog>> redo =
      fstatat(dir, kRedoLogFileName, &st, AT_SYMLINK_NOFOLLOW) == 0
          ? RedoLog::Open(dir, kRedoLogFileName, log_path)
          : RedoLog::Create(dir, kRedoLogFileName, log_bytes, log_path, committed_epoch);
  if (!redo.ok()) return redo.status();
  std::unique_ptr<DurableImage> image(
      new DurableImage(dir, path, std::move(data), *std::move(redo)));
  if (absl::Status s = image->Apply(committed_epoch); !s.ok()) return s;
  return image;
}

absl::StatusOr<std::unique_ptr<DataFile>> DurableImage::LoadWorkingImage(
    const std::string& label) const {
  const uint64_t size = data_->size();
  absl::StatusOr<std::unique_ptr<DataFile>> working = DataFile::CreateMemory(label, size);
  if (!working.ok()) return working.status();
  std::string buffer(std::min(size, kLoadStep), '\0');
  for (uint64_t at = 0; at < size; at += buffer.size()) {
    const uint64_t step = std::min<uint64_t>(buffer.size(), size - at);
    if (!ReadAllAt(data_->fd(), buffer.data(), step, at)) {
      return ErrnoStatus(errno, absl::StrCat("read ", step, " bytes at ", at, " of data file ",
                                             data_->path(), " into its working image"));
    }
    // The working image reads as zeros where nothing is written.
    if (AllZero(buffer.data(), step)) continue;
    if (!WriteAllAt((*working)->fd(), absl::string_view(buffer.data(), step), at)) {
      return ErrnoStatus(errno, absl::StrCat("write ", step, " bytes at ", at, " of ", label));
    }
  }
  return working;
}

absl::Status DurableImage::MakeRoom(uint64_t pages, uint64_t committed_epoch) {
  const uint64_t needed = RedoLog::BytesFor(pages);
  if (!apply_failed_ && redo_->used_bytes() + needed <= redo_->capacity()) {
    return absl::OkStatus();
  }
  if (absl::Status s = Apply(committed_epoch); !s.ok()) return s;
  if (needed <= redo_->capacity()) return absl::OkStatus();
  // The log is empty (applied): a larger one replaces it. A crash between
  // leaves either, both empty.
  const uint64_t capacity = std::max(needed, 2 * redo_->capacity());
  const std::string log_path = absl::StrCat(path_, "/", kRedoLogFileName);
  unlinkat(dir_, kLargerLogName, 0);
  absl::StatusOr<std::unique_ptr<RedoLog>> larger =
      RedoLog::Create(dir_, kLargerLogName, capacity, log_path, committed_epoch);
  if (!larger.ok()) {
    unlinkat(dir_, kLargerLogName, 0);
    return absl::Status(larger.status().code(),
                        absl::StrCat("a sync of ", pages, " pages needs a redo log of ", needed,
                                     " bytes: ", larger.status().message()));
  }
  FaultPoint("redo.larger.before_rename");
  if (renameat(dir_, kLargerLogName, dir_, kRedoLogFileName) != 0 || fsync(dir_) != 0) {
    const int error = errno;
    unlinkat(dir_, kLargerLogName, 0);
    return ErrnoStatus(error, absl::StrCat("put a larger redo log in place of ", log_path));
  }
  redo_ = *std::move(larger);
  return absl::OkStatus();
}

absl::Status DurableImage::Log(uint64_t epoch, const std::vector<uint64_t>& pages, int working,
                               const PagePatch& patch) {
  FaultPoint("redo.before_append");
  return redo_->Append(epoch, pages, working, patch).status();
}

absl::Status DurableImage::Apply(uint64_t committed_epoch) {
  absl::StatusOr<uint64_t> written = redo_->ApplyTo(data_->fd(), committed_epoch);
  absl::Status status = written.status();
  if (status.ok()) {
    FaultPoint("redo.apply.before_reset");
    status = redo_->Reset();
  }
  apply_failed_ = !status.ok();
  return status;
}

absl::Status DurableImage::Grow(uint64_t size) {
  if (absl::Status s = data_->Grow(size); !s.ok()) return s;
  return data_->Flush();
}

}  // namespace heapd
