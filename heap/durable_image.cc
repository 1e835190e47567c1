#include "heap/durable_image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <future>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
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
// The working image is loaded in steps of this many bytes, by this many
// threads at once.
constexpr uint64_t kLoadStep = uint64_t{2} << 20;
constexpr int kLoadReaders = 4;

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
  // `redo` alone: a heap made when there was one log; neither: a heap
  // restored from a snapshot (its data is the committed image). `redo.b`
  // alone is never left behind: `redo` was lost, with what it held.
  bool exists[2];
  for (int i = 0; i < 2; ++i) {
    struct stat st;
    exists[i] = fstatat(dir, kLogNames[i], &st, AT_SYMLINK_NOFOLLOW) == 0;
  }
  if (!exists[0] && exists[1]) {
    return absl::DataLossError(absl::StrCat("heap ", path, ": redo log ", kLogNames[0],
                                            " is missing beside ", kLogNames[1]));
  }
  std::unique_ptr<RedoLog> logs[2];
  for (int i = 0; i < 2; ++i) {
    const std::string log_path = absl::StrCat(path, "/", kLogNames[i]);
    absl::StatusOr<std::unique_ptr<RedoLog>> log =
        exists[i] ? RedoLog::Open(dir, kLogNames[i], log_path)
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
  if (logs[0]->used_bytes() != 0 && logs[1]->used_bytes() != 0 &&
      logs[0]->applied_epoch() == logs[1]->applied_epoch()) {
    return absl::DataLossError(absl::StrCat(
        "heap ", path, ": both redo logs hold records after epoch ", logs[0]->applied_epoch()));
  }
  // Applies to the epoch the other log restarted at, exactly (its records
  // must reach it: DATA_LOSS otherwise), or holds nothing to apply.
  const uint64_t first_to =
      std::min(committed_epoch, logs[older]->used_bytes() != 0 ? logs[1 - older]->applied_epoch()
                                                               : logs[older]->applied_epoch());
  absl::StatusOr<std::unique_ptr<DurableImage>> image = Make(dir, path, std::move(data), logs);
  if (!image.ok()) return image.status();
  RedoLog& first = *(*image)->logs_[older];
  if (absl::Status s = ApplyLog(first, (*image)->apply_fd_.get(), first_to); !s.ok()) return s;
  (*image)->current_ = 1 - older;
  if (absl::Status s = (*image)->Apply(committed_epoch); !s.ok()) return s;
  return image;
}

absl::StatusOr<std::unique_ptr<DurableImage>> DurableImage::Make(int dir, const std::string& path,
                                                                 std::unique_ptr<DataFile> data,
                                                                 std::unique_ptr<RedoLog> logs[2]) {
  // A file description of its own: a write-back error of the data file is
  // reported once per description, so a concurrent Grow's fdatasync cannot
  // take the error of the pages an apply wrote.
  UniqueFd apply_fd(open(absl::StrCat("/proc/self/fd/", data->fd()).c_str(), O_RDWR | O_CLOEXEC));
  if (!apply_fd.valid()) {
    return ErrnoStatus(errno, absl::StrCat("open ", data->path(), " again to apply redo logs"));
  }
  return std::unique_ptr<DurableImage>(
      new DurableImage(dir, path, std::move(data), std::move(apply_fd), logs));
}

DurableImage::~DurableImage() {
  if (other_apply_.valid()) other_apply_.wait();
}

absl::StatusOr<std::unique_ptr<DataFile>> DurableImage::LoadWorkingImage(
    const std::string& label) const {
  const uint64_t size = data_->size();
  // Reserved whole first: faster than letting the reads below allocate
  // the pages (measured: docs/performance.md, "Open after a reboot").
  absl::StatusOr<std::unique_ptr<DataFile>> working = DataFile::CreateMemory(label, size);
  if (!working.ok() || size == 0) return working;
  // Read straight into the working image's memory: one copy, through no
  // page cache (O_DIRECT, where the file takes it: the data file is whole
  // 2 MiB chunks), with kLoadReaders reads in flight.
  void* const mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, (*working)->fd(), 0);
  if (mapped == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("map ", label, " to load it"));
  absl::Cleanup unmap = [mapped, size] { munmap(mapped, size); };
  const UniqueFd direct(
      open(absl::StrCat("/proc/self/fd/", data_->fd()).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
  std::atomic<uint64_t> next{0};
  auto read_steps = [&]() -> absl::Status {
    for (uint64_t at; (at = next.fetch_add(kLoadStep)) < size;) {
      const uint64_t step = std::min(kLoadStep, size - at);
      char* const into = static_cast<char*>(mapped) + at;
      // O_DIRECT refused (EINVAL: an alignment the file system does not
      // take): through the page cache.
      if ((direct.valid() && ReadAllAt(direct.get(), into, step, at)) ||
          ((!direct.valid() || errno == EINVAL) && ReadAllAt(data_->fd(), into, step, at))) {
        continue;
      }
      return ErrnoStatus(errno, absl::StrCat("read ", step, " bytes at ", at, " of data file ",
                                             data_->path(), " into its working image"));
    }
    return absl::OkStatus();
  };
  std::vector<std::future<absl::Status>> readers;
  try {
    for (int i = 1; i < kLoadReaders; ++i)
      readers.push_back(std::async(std::launch::async, read_steps));
  } catch (const std::system_error&) {
    // Fewer threads: this one reads the rest.
  }
  absl::Status status = read_steps();
  for (std::future<absl::Status>& reader : readers) status.Update(reader.get());
  if (!status.ok()) return status;
  return working;
}

absl::Status DurableImage::ApplyLog(RedoLog& log, int data, uint64_t applied_to) try {
  absl::StatusOr<uint64_t> written = log.ApplyTo(data, applied_to);
  if (!written.ok()) return written.status();
  FaultPoint("redo.apply.before_reset");
  return log.Reset();
} catch (const std::exception& e) {
  return absl::ResourceExhaustedError(absl::StrCat("applying a redo log: ", e.what()));
}

void DurableImage::AwaitBackgroundApply() const {
  if (other_apply_.valid()) other_apply_.wait();
}

absl::Status DurableImage::FinishOtherApply() {
  if (other_apply_.valid()) {
    const absl::Status applied = other_apply_.get();
    other_failed_ = !applied.ok();
    if (!applied.ok()) {
      std::fprintf(stderr, "heapd: heap %s: the background apply of a redo log failed: %s\n",
                   path_.c_str(), applied.ToString().c_str());
    }
  }
  if (!other_failed_) return absl::OkStatus();
  // Retried here, on the sync's path: the current log cannot be handed
  // over before the other one is empty. If it fails again the sync fails
  // (and its heap breaks, reopening at its last epoch).
  const absl::Status retried = ApplyLog(other(), apply_fd_.get(), other_applied_to_);
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
  if (current().used_bytes() != 0) {
    // The current log goes to the background apply, the other one (once
    // its own apply ended) takes the syncs from the committed epoch on.
    if (absl::Status s = FinishOtherApply(); !s.ok()) return s;
    if (absl::Status s = other().RestartAt(committed_epoch); !s.ok()) return s;
    FaultPoint("redo.switch.after_restart");
    current_ = 1 - current_;
    other_applied_to_ = committed_epoch;
    RedoLog* const applying = logs_[1 - current_].get();
    const int data = apply_fd_.get();
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
  const absl::Status status = ApplyLog(current(), apply_fd_.get(), committed_epoch);
  apply_failed_ = !status.ok();
  return status;
}

absl::Status DurableImage::Grow(uint64_t size) {
  if (absl::Status s = data_->Grow(size); !s.ok()) return s;
  return data_->Flush();
}

}  // namespace heapd
