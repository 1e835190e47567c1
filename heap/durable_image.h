// DurableImage: the data file of a heap with a working image
// (ImageMode::kWorkingImage), with its two redo logs. Clients map the
// working image (memory: DataFile::CreateMemory); only syncs write the data
// file, and only through a redo log (heap/redo_log.h), so the data file
// always holds, with the logs' committed records applied, the heap's last
// committed epoch (docs/consistency.md "Durable images").
//
// Per sync of epoch E (the heap's persist lock held):
//   MakeRoom(pages)   before anything changes: the current log has room
//                     for them. Once it is half full (or full) it is
//                     handed to a background apply and the other log,
//                     empty, takes the syncs; a sync waits for that apply
//                     only if the current log fills up before it ends;
//   Log(E, pages)     the pages as the working image held them at E's
//                     commit point, durable;
//   (the epoch record commits E)
//   apply             in the background: written in place, made durable,
//                     then that log emptied.
// Open applies what the logs hold up to the committed epoch, the older
// log first (the lower applied epoch: when a log is handed to the apply,
// the other one restarts at the epoch that apply reaches), and then loads
// the working image from the data file: a heapd that died, or a node that
// rebooted, starts from the last commit whatever the working image held.
//
// Thread safety: MakeRoom, Log and Apply under the heap's persist lock;
// Grow under its grow lock (it touches only the data file's size). The
// background apply owns the log it applies until MakeRoom or Apply
// collects it; it writes the data file's pages (through a file description
// of its own) and that log.
#ifndef HEAPD_HEAP_DURABLE_IMAGE_H_
#define HEAPD_HEAP_DURABLE_IMAGE_H_

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "heap/data_file.h"
#include "heap/redo_log.h"
#include "util/unique_fd.h"

namespace heapd {

class DurableImage {
 public:
  // Creates the redo logs, each with room for `log_bytes`, in the heap
  // directory being built (`dir`, named `path` in messages).
  static absl::Status CreateLog(int dir, const std::string& path, uint64_t log_bytes);

  // Opens the data file `data` of the heap directory `dir` (named `path` in
  // messages) and brings it to `committed_epoch`: the logs' records up to
  // it are written in place, the older log's first, those after it taken
  // back. A heap without a log (restored from a snapshot, whose data is the
  // committed image; or made before there were two) gets empty ones of
  // `log_bytes`. DATA_LOSS if the logs do not reach the epoch.
  static absl::StatusOr<std::unique_ptr<DurableImage>> Open(int dir, const std::string& path,
                                                            std::unique_ptr<DataFile> data,
                                                            uint64_t committed_epoch,
                                                            uint64_t log_bytes);

  // A working image loaded from the data file (named `label`).
  absl::StatusOr<std::unique_ptr<DataFile>> LoadWorkingImage(const std::string& label) const;

  // Makes room in the current log for one sync of `pages` pages (all
  // epochs up to `committed_epoch` committed): once it is more than half
  // full, or they do not fit, it goes to the background apply and the
  // other log takes the syncs (after that log's own apply ended); a log
  // they do not fit in at all, empty, is replaced by one twice as large,
  // or as large as they need. RESOURCE_EXHAUSTED naming the bytes if the
  // file system has no room for that.
  absl::Status MakeRoom(uint64_t pages, uint64_t committed_epoch);
  // Appends `pages` (page offsets, ascending, each once) read from
  // `working` and patched by `patch` (RedoLog::Append) as epoch `epoch`'s,
  // durable when it returns.
  absl::Status Log(uint64_t epoch, const std::vector<uint64_t>& pages, int working,
                   const PagePatch& patch = nullptr);
  // Writes what both logs hold up to `committed_epoch` into the data file
  // (waiting for the background apply), makes it durable, and empties
  // them: the data file then holds that epoch.
  absl::Status Apply(uint64_t committed_epoch);
  uint64_t log_used_bytes() const { return logs_[current_]->used_bytes(); }
  uint64_t log_capacity() const { return logs_[current_]->capacity(); }

  // Grows the data file to `size` bytes and makes its new size durable
  // (a sync's epoch record may name chunks there; the data file is not
  // flushed at syncs).
  absl::Status Grow(uint64_t size);

  const DataFile& data() const { return *data_; }

  // Returns once the background apply, if one runs, has ended (tests).
  void AwaitBackgroundApply() const;

  ~DurableImage();

 private:
  DurableImage(int dir, std::string path, std::unique_ptr<DataFile> data, UniqueFd apply_fd,
               std::unique_ptr<RedoLog> logs[2])
      : dir_(dir), path_(std::move(path)), data_(std::move(data)), apply_fd_(std::move(apply_fd)) {
    logs_[0] = std::move(logs[0]);
    logs_[1] = std::move(logs[1]);
  }
  static absl::StatusOr<std::unique_ptr<DurableImage>> Make(int dir, const std::string& path,
                                                            std::unique_ptr<DataFile> data,
                                                            std::unique_ptr<RedoLog> logs[2]);
  RedoLog& current() { return *logs_[current_]; }
  RedoLog& other() { return *logs_[1 - current_]; }
  // Writes the other log's records up to `applied_to` into the data
  // file, makes it durable and empties the log (the background apply's
  // work, and its retry).
  static absl::Status ApplyLog(RedoLog& log, int data, uint64_t applied_to);
  // Waits for the background apply, if one runs, and retries it here if
  // it failed (or the last retry did); its error if it fails again.
  absl::Status FinishOtherApply();
  // Replaces the current log, empty, by one of `capacity` bytes.
  absl::Status Enlarge(uint64_t capacity, uint64_t committed_epoch, uint64_t pages);

  const int dir_;  // the heap directory, not owned
  const std::string path_;
  const std::unique_ptr<DataFile> data_;
  // The data file again, opened for applies only (see Make).
  const UniqueFd apply_fd_;
  // logs_[i] is the file kLogNames[i]; current_ takes the syncs' records.
  std::unique_ptr<RedoLog> logs_[2];
  int current_ = 0;
  // The other log's apply: running (valid) or done; it reaches
  // other_applied_to_. other_failed_: its last attempt failed.
  std::future<absl::Status> other_apply_;
  uint64_t other_applied_to_ = 0;
  bool other_failed_ = false;
  // The last Apply of the current log failed: it takes no record until one
  // succeeds (RedoLog::Append), so the next MakeRoom applies first.
  bool apply_failed_ = false;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_DURABLE_IMAGE_H_
