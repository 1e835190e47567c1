// DurableImage: the data file of a heap with a working image
// (ImageMode::kWorkingImage), with its redo log. Clients map the working
// image (memory: DataFile::CreateMemory); only syncs write the data file,
// and only through the redo log (heap/redo_log.h), so the data file always
// holds, with the log's committed records applied, the heap's last
// committed epoch (docs/consistency.md "Durable images").
//
// Per sync of epoch E (the heap's persist lock held):
//   MakeRoom(pages)   before anything changes: the log has room for them
//                     (it applies what it holds first, or grows);
//   Log(E, pages)     the pages as the working image holds them, durable;
//   (the epoch record commits E)
//   Apply(E)          now or later: written in place, then the log emptied.
// Open applies what the log holds up to the committed epoch and then loads
// the working image from the data file: a heapd that died, or a node that
// rebooted, starts from the last commit whatever the working image held.
//
// Thread safety: MakeRoom, Log and Apply under the heap's persist lock;
// Grow under its grow lock (it touches only the data file's size).
#ifndef HEAPD_HEAP_DURABLE_IMAGE_H_
#define HEAPD_HEAP_DURABLE_IMAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "heap/data_file.h"
#include "heap/redo_log.h"

namespace heapd {

class DurableImage {
 public:
  // Creates the redo log, with room for `log_bytes`, in the heap directory
  // being built (`dir`, named `path` in messages).
  static absl::Status CreateLog(int dir, const std::string& path, uint64_t log_bytes);

  // Opens the data file `data` of the heap directory `dir` (named `path` in
  // messages) and brings it to `committed_epoch`: the log's records up to
  // it are written in place, those after it taken back. A heap without a
  // log (restored from a snapshot, whose data is the committed image) gets
  // an empty one of `log_bytes`. DATA_LOSS if the log does not reach the
  // epoch.
  static absl::StatusOr<std::unique_ptr<DurableImage>> Open(int dir, const std::string& path,
                                                            std::unique_ptr<DataFile> data,
                                                            uint64_t committed_epoch,
                                                            uint64_t log_bytes);

  // A working image loaded from the data file (named `label`).
  absl::StatusOr<std::unique_ptr<DataFile>> LoadWorkingImage(const std::string& label) const;

  // Makes room in the log for one sync of `pages` pages: applies what it
  // holds up to `committed_epoch` if they do not fit after it (or the last
  // Apply failed), and
  // replaces the emptied log with one twice as large, or as large as they
  // need, if they do not fit in it at all. RESOURCE_EXHAUSTED naming the
  // bytes if the file system has no room for that.
  absl::Status MakeRoom(uint64_t pages, uint64_t committed_epoch);
  // Appends `pages` (page offsets, ascending, each once) read from
  // `working` and patched by `patch` (RedoLog::Append) as epoch `epoch`'s,
  // durable when it returns.
  absl::Status Log(uint64_t epoch, const std::vector<uint64_t>& pages, int working,
                   const PagePatch& patch = nullptr);
  // Writes what the log holds up to `committed_epoch` into the data file,
  // makes it durable, and empties the log.
  absl::Status Apply(uint64_t committed_epoch);
  // Whether the log is more than half full (an Apply is due).
  bool ApplyDue() const { return redo_->used_bytes() > redo_->capacity() / 2; }
  uint64_t log_used_bytes() const { return redo_->used_bytes(); }
  uint64_t log_capacity() const { return redo_->capacity(); }

  // Grows the data file to `size` bytes and makes its new size durable
  // (a sync's epoch record may name chunks there; the data file is not
  // flushed at syncs).
  absl::Status Grow(uint64_t size);

  const DataFile& data() const { return *data_; }

 private:
  DurableImage(int dir, std::string path, std::unique_ptr<DataFile> data,
               std::unique_ptr<RedoLog> redo)
      : dir_(dir), path_(std::move(path)), data_(std::move(data)), redo_(std::move(redo)) {}

  const int dir_;  // the heap directory, not owned
  const std::string path_;
  const std::unique_ptr<DataFile> data_;
  std::unique_ptr<RedoLog> redo_;
  // The last Apply failed: the log takes no record until one succeeds
  // (RedoLog::Append), so the next MakeRoom applies first.
  bool apply_failed_ = false;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_DURABLE_IMAGE_H_
