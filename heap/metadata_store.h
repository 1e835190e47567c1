// MetadataStore: the files that hold a heap's persisted metadata, in the
// heap's directory:
//   checkpoint   the whole state at some epoch E, naming log generation G;
//   log.G        epoch records E+1, E+2, ... appended by syncs.
// A sync appends one record and fdatasyncs it: the record is the commit.
// A checkpoint is written to checkpoint.tmp, fsynced, renamed over
// checkpoint (the commit) and the directory fsynced; then log.G+1 starts
// and log.G is removed. Recovery reads the checkpoint and replays its log;
// a torn record at the log's end (a crash inside a sync) is cut off, so the
// heap opens at the last completed sync. Corruption anywhere else is
// DATA_LOSS naming the file.
// Not thread-safe: the owning PersistentHeap serializes calls.
#ifndef HEAPD_HEAP_METADATA_STORE_H_
#define HEAPD_HEAP_METADATA_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "heap/metadata_format.h"
#include "util/unique_fd.h"

namespace heapd {

// The persisted state as recovered: the checkpoint's chunk records followed
// by each log record's (the last record of a chunk wins), the final names.
struct RecoveredMetadata {
  Checkpoint state;
  uint64_t log_records = 0;
  uint64_t torn_bytes = 0;  // bytes of an incomplete final record cut off
};

// What a record that does not decode at the log's end is.
enum class TornTail {
  kCutOff,   // a sync the crash interrupted: recovery ends before it
  kCorrupt,  // DATA_LOSS: a snapshot is complete, so nothing may be torn
};

// Decodes the bytes of a checkpoint file (one checkpoint frame).
absl::StatusOr<Checkpoint> DecodeCheckpointFile(absl::string_view bytes, absl::string_view file);

// The state of `checkpoint` with the records of the log that continues it
// (`log_bytes`) applied in order.
absl::StatusOr<RecoveredMetadata> ReplayLog(Checkpoint checkpoint, absl::string_view log_bytes,
                                            absl::string_view log_file, TornTail torn_tail);

// Recovers the state from the bytes of a checkpoint file and of the log
// that continues it (no I/O; `checkpoint_file` and `log_file` name them in
// errors). DATA_LOSS for anything that does not decode or does not follow,
// except a torn last record when `torn_tail` is kCutOff. Bounded: it
// allocates no more than a few times the input's size.
absl::StatusOr<RecoveredMetadata> RecoverMetadata(absl::string_view checkpoint_bytes,
                                                  absl::string_view log_bytes,
                                                  absl::string_view checkpoint_file,
                                                  absl::string_view log_file, TornTail torn_tail);

class MetadataStore {
 public:
  // The log may grow to max(this, twice the checkpoint) before a checkpoint
  // replaces it.
  static constexpr uint64_t kDefaultCheckpointLogBytes = 8 << 20;

  // Writes the first checkpoint of a new heap into the directory `dir`
  // (opened by the store, or given open; `dir_path` names it in messages).
  // The store reaches its files through that descriptor only.
  static absl::StatusOr<std::unique_ptr<MetadataStore>> Create(const std::string& dir,
                                                               const Checkpoint& initial);
  static absl::StatusOr<std::unique_ptr<MetadataStore>> CreateAt(UniqueFd dir, std::string dir_path,
                                                                 const Checkpoint& initial);

  // Recovers the metadata in the directory `dir`, as Create takes it.
  static absl::StatusOr<std::unique_ptr<MetadataStore>> Open(
      const std::string& dir, RecoveredMetadata* recovered,
      uint64_t checkpoint_log_bytes = kDefaultCheckpointLogBytes);
  static absl::StatusOr<std::unique_ptr<MetadataStore>> OpenAt(
      UniqueFd dir, std::string dir_path, RecoveredMetadata* recovered,
      uint64_t checkpoint_log_bytes = kDefaultCheckpointLogBytes);

  ~MetadataStore();
  MetadataStore(const MetadataStore&) = delete;
  MetadataStore& operator=(const MetadataStore&) = delete;

  // Appends `record` and makes it durable. On failure the log is cut back
  // to its previous end; the caller must write a checkpoint next.
  absl::Status Append(const EpochRecord& record);

  // Writes `checkpoint` as the new base and starts a new, empty log. On
  // failure the caller must write a checkpoint again before appending.
  absl::Status WriteCheckpoint(Checkpoint checkpoint);

  // True when the log has grown large next to the last checkpoint, so
  // replaying it would cost more than writing a checkpoint.
  bool CheckpointDue() const;

  uint64_t log_bytes() const { return log_bytes_; }
  // When the epoch Open recovered was committed: the modification time of
  // the file that holds it (the log if it has records, else the
  // checkpoint), in Unix nanoseconds.
  int64_t recovered_commit_unix_ns() const { return recovered_commit_unix_ns_; }

  // The bytes of the files of the last committed epoch, by file name
  // ("checkpoint", "log.G"): what a snapshot copies.
  absl::StatusOr<std::map<std::string, std::string>> ReadCommittedFiles() const;

 private:
  MetadataStore(UniqueFd dir, std::string dir_path, uint64_t generation)
      : dir_(std::move(dir)), dir_path_(std::move(dir_path)), generation_(generation) {}
  // The path of log generation `generation`, for messages.
  std::string LogPath(uint64_t generation) const;
  absl::Status OpenLog(bool create);

  const UniqueFd dir_;
  const std::string dir_path_;  // for messages
  uint64_t generation_;
  int log_fd_ = -1;
  uint64_t log_bytes_ = 0;
  uint64_t checkpoint_bytes_ = 0;
  uint64_t checkpoint_log_bytes_ = kDefaultCheckpointLogBytes;
  int64_t recovered_commit_unix_ns_ = 0;
};

// Writes `bytes` to `name` in the directory `dir` (`dir_path` in messages)
// via a temporary file, fsyncs it, renames it into place and fsyncs the
// directory. On failure the temporary file is removed. `fault_prefix`
// names its fault points.
absl::Status WriteFileAtomically(int dir, const std::string& dir_path, const std::string& name,
                                 const std::string& bytes, const char* fault_prefix);

// Fsyncs the directory `dir` (to make renames and creations durable).
absl::Status SyncDirectory(const std::string& dir);

}  // namespace heapd

#endif  // HEAPD_HEAP_METADATA_STORE_H_
