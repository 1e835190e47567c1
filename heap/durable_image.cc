#include "heap/durable_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "heap/fault_point.h"
#include "util/dir_files.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// The two logs' files (the first is the heap's only log in heaps made
// before there were two).
constexpr const char* kLogNames[2] = {kRedoLogFileName, "redo.b"};
// A larger log is built under this name, then renamed over the current log.
constexpr char kLargerLogName[] = "redo.larger";
// The working image is loaded in steps of this many bytes.
constexpr uint64_t kLoadStep = uint64_t{2} << 20;

bool AllZero(const char* bytes, uint64_t size) {
  return size == 0 || (bytes[0] == 0 && std::memcmp(bytes, bytes + 1, size - 1) == 0);
}

}  // namespace

absl::Status DurableImage::CreateLog(int dir, const std::string& path, uint64_t log_bytes) {
  for (const char* name : kLogNames) {
    absl::StatusOr<std::unique_ptr<RedoLog>> log =
        RedoLog::Create(dir, name, log_bytes, absl::StrCat(path, "/", name));
    if (!log.ok()) return log.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DurableImage>> DurableImage::Open(int dir, const std::string& path,
                                                                 std::unique_ptr<DataFile> data,
                                                                 uint64_t committed_epoch,
                                                                 uint64_t log_bytes) {
  // A larger log that a crash kept from replacing a log: the log it was
  // to replace was empty, and is still in place.
  unlinkat(dir, kLargerLogName, 0);
  unlinkat(dir, absl::StrCat(kLargerLogName, ".new").c_str(), 0);
  std::unique_ptr<RedoLog> logs[2];
  for (int i = 0; i < 2; ++i) {
    const std::string log_path = absl::StrCat(path, "/", kLogNames[i]);
    struct stat st;
    absl::StatusOr<std::unique_ptr<RedoLog>> log =
        fstatat(dir, kLogNames[i], &st, AT_SYMLINK_NOFOLLOW) == 0
            ? RedoLog::Open(dir, kLogNames[i], log_path)
            : RedoLog::Create(dir, kLogNames[i], log_bytes, log_path, committed_epoch);
    if (!log.ok()) return log.status();
    logs[i] = *std::move(log);
  }
  // The older log first: the one whose pass began at the lower applied
  // epoch (when a log goes to the background apply, the other restarts at
  // the epoch that apply reaches), or, at a tie, the one without records.
  const auto newer = [&](int i) {
    return std::make_pair(logs[i]->applied_epoch(), logs[i]->used_bytes() != 0);
  };
  const int older = newer(0) <= newer(1) ? 0 : 1;
  std::unique_ptr<DurableImage> image(new DurableImage(dir, path, std::move(data), logs));
  RedoLog& first = *image->logs_[older];
  // Its records end at or before the committed epoch (a later one, of a
  // sync that never committed, is taken back).
  const uint64_t first_to =
      std::min(committed_epoch, std::max(first.last_epoch(), first.applied_epoch()));
  if (absl::Status s = ApplyLog(first, image->data_->fd(), first_to); !s.ok()) return s;
  image->current_ = 1 - older;
  if (absl::Status s = image->Apply(committed_epoch); !s.ok()) return s;
  return image;
}

DurableImage::~DurableImage() {
  if (other_apply_.valid()) other_apply_.wait();
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

absl::Status DurableImage::ApplyLog(RedoLog& log, int data, uint64_t applied_to) {
  absl::StatusOr<uint64_t> written = log.ApplyTo(data, applied_to);
  if (!written.ok()) return written.status();
  FaultPoint("redo.apply.before_reset");
  return log.Reset();
}

absl::Status DurableImage::FinishOtherApply() {
  if (other_apply_.valid()) other_failed_ = !other_apply_.get().ok();
  if (!other_failed_) return absl::OkStatus();
  // Retried here, on the sync's path: the current log cannot be handed
  // over before the other one is empty.
  const absl::Status retried = ApplyLog(other(), data_->fd(), other_applied_to_);
  other_failed_ = !retried.ok();
  return retried;
}

absl::Status DurableImage::MakeRoom(uint64_t pages, uint64_t committed_epoch) {
  const uint64_t needed = RedoLog::BytesFor(pages);
  if (apply_failed_) {
    if (absl::Status s = Apply(committed_epoch); !s.ok()) return s;
  }
  const bool fits = current().used_bytes() + needed <= current().capacity();
  const bool half_full = current().used_bytes() > current().capacity() / 2;
  const bool other_busy = other_apply_.valid() && other_apply_.wait_for(std::chrono::seconds(0)) !=
                                                      std::future_status::ready;
  if (fits && (!half_full || other_busy)) return absl::OkStatus();
  // The current log goes to the background apply, the other one (once its
  // own apply ended) takes the syncs from the committed epoch on.
  if (absl::Status s = FinishOtherApply(); !s.ok()) return s;
  if (current().used_bytes() != 0) {
    if (absl::Status s = other().RestartAt(committed_epoch); !s.ok()) return s;
    FaultPoint("redo.switch.after_restart");
    current_ = 1 - current_;
    other_applied_to_ = committed_epoch;
    RedoLog* const applying = logs_[1 - current_].get();
    const int data = data_->fd();
    try {
      other_apply_ = std::async(std::launch::async, [applying, data, committed_epoch] {
        return ApplyLog(*applying, data, committed_epoch);
      });
    } catch (const std::system_error&) {
      // No thread: applied here, and retried at the next switch if it fails.
      other_failed_ = !ApplyLog(*applying, data, committed_epoch).ok();
    }
  }
  if (needed <= current().capacity()) return absl::OkStatus();
  return Enlarge(std::max(needed, 2 * current().capacity()), committed_epoch, pages);
}

absl::Status DurableImage::Enlarge(uint64_t capacity, uint64_t committed_epoch, uint64_t pages) {
  // The current log is empty: a larger one replaces it. A crash between
  // leaves either, both empty.
  const char* const name = kLogNames[current_];
  const std::string log_path = absl::StrCat(path_, "/", name);
  unlinkat(dir_, kLargerLogName, 0);
  absl::StatusOr<std::unique_ptr<RedoLog>> larger =
      RedoLog::Create(dir_, kLargerLogName, capacity, log_path, committed_epoch);
  if (!larger.ok()) {
    unlinkat(dir_, kLargerLogName, 0);
    return absl::Status(
        larger.status().code(),
        absl::StrCat("a sync of ", pages, " pages needs a redo log of ", RedoLog::BytesFor(pages),
                     " bytes: ", larger.status().message()));
  }
  FaultPoint("redo.larger.before_rename");
  if (renameat(dir_, kLargerLogName, dir_, name) != 0 || fsync(dir_) != 0) {
    const int error = errno;
    unlinkat(dir_, kLargerLogName, 0);
    return ErrnoStatus(error, absl::StrCat("put a larger redo log in place of ", log_path));
  }
  logs_[current_] = *std::move(larger);
  return absl::OkStatus();
}

absl::Status DurableImage::Log(uint64_t epoch, const std::vector<uint64_t>& pages, int working,
                               const PagePatch& patch) {
  FaultPoint("redo.before_append");
  return current().Append(epoch, pages, working, patch).status();
}

absl::Status DurableImage::Apply(uint64_t committed_epoch) {
  // The other log's records are older: applied first.
  if (absl::Status s = FinishOtherApply(); !s.ok()) return s;
  const absl::Status status = ApplyLog(current(), data_->fd(), committed_epoch);
  apply_failed_ = !status.ok();
  return status;
}

absl::Status DurableImage::Grow(uint64_t size) {
  if (absl::Status s = data_->Grow(size); !s.ok()) return s;
  return data_->Flush();
}

}  // namespace heapd
