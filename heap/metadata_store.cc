#include "heap/metadata_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "heap/data_file.h"
#include "heap/fault_point.h"
#include "heap/heap_dir.h"
#include "util/dir_files.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& what) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, what);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Writes the first half, reports the fault point (a kill there leaves a torn
// write), then the rest.
absl::Status WriteWithTornPoint(int fd, const std::string& bytes, const std::string& what,
                                const char* torn_point) {
  const size_t half = bytes.size() / 2;
  if (absl::Status s = WriteAll(fd, bytes.data(), half, what); !s.ok()) return s;
  FaultPoint(torn_point);
  return WriteAll(fd, bytes.data() + half, bytes.size() - half, what);
}

// True if a well-formed frame starts anywhere in `bytes` after `pos`.
bool FrameStartsAfter(absl::string_view bytes, size_t pos, absl::string_view file) {
  for (size_t at = pos + 1; at + kFrameHeaderSize <= bytes.size(); ++at) {
    uint32_t magic;
    std::memcpy(&magic, bytes.data() + at, sizeof(magic));
    if (magic == kFrameMagic && DecodeFrame(bytes.substr(at), file).ok()) return true;
  }
  return false;
}

// The whole of the file `name` in the directory `dir` (`dir_path` names it
// in messages): NOT_FOUND if it does not exist.
absl::StatusOr<std::string> ReadFileIn(int dir, const std::string& dir_path,
                                       const std::string& name) {
  absl::StatusOr<std::string> bytes = ReadFileAt(dir, name, UINT64_MAX);
  if (bytes.ok()) return bytes;
  return absl::Status(bytes.status().code(), absl::StrCat("read metadata file ", dir_path, "/",
                                                          name, ": ", bytes.status().message()));
}

absl::StatusOr<UniqueFd> OpenMetadataDirectory(const std::string& dir) {
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
  return fd;
}

}  // namespace

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("fsync directory ", dir));
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(int dir, const std::string& dir_path, const std::string& name,
                                 const std::string& bytes, const char* fault_prefix) {
  const std::string tmp = name + ".tmp";
  const std::string tmp_path = absl::StrCat(dir_path, "/", tmp);
  const int fd =
      openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp_path));
  absl::Status status = WriteWithTornPoint(fd, bytes, absl::StrCat("write ", tmp_path),
                                           absl::StrCat(fault_prefix, ".torn").c_str());
  if (status.ok() && fsync(fd) != 0) status = ErrnoStatus(errno, absl::StrCat("fsync ", tmp_path));
  close(fd);
  if (status.ok()) FaultPoint(absl::StrCat(fault_prefix, ".before_rename").c_str());
  if (status.ok() && renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("rename ", tmp_path, " to ", name));
  }
  if (!status.ok()) {
    unlinkat(dir, tmp.c_str(), 0);
    return status;
  }
  FaultPoint(absl::StrCat(fault_prefix, ".after_rename").c_str());
  if (fsync(dir) != 0) return ErrnoStatus(errno, absl::StrCat("fsync directory ", dir_path));
  return absl::OkStatus();
}

std::string MetadataStore::LogPath(uint64_t generation) const {
  return absl::StrCat(dir_path_, "/", LogFileName(generation));
}

MetadataStore::~MetadataStore() {
  if (log_fd_ >= 0) close(log_fd_);
}

absl::Status MetadataStore::OpenLog(bool create) {
  const int flags = O_WRONLY | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT | O_TRUNC : O_CREAT);
  const int fd = openat(dir_.get(), LogFileName(generation_).c_str(), flags, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open metadata log ", LogPath(generation_)));
  if (log_fd_ >= 0) close(log_fd_);
  log_fd_ = fd;
  if (create) {
    log_bytes_ = 0;
    if (fsync(dir_.get()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("fsync directory ", dir_path_));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::Create(const std::string& dir,
                                                                     const Checkpoint& initial) {
  absl::StatusOr<UniqueFd> fd = OpenMetadataDirectory(dir);
  if (!fd.ok()) return fd.status();
  return CreateAt(*std::move(fd), dir, initial);
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::CreateAt(UniqueFd dir,
                                                                       std::string dir_path,
                                                                       const Checkpoint& initial) {
  std::unique_ptr<MetadataStore> store(new MetadataStore(std::move(dir), std::move(dir_path), 0));
  if (absl::Status s = store->WriteCheckpoint(initial); !s.ok()) return s;
  return store;
}

absl::StatusOr<Checkpoint> DecodeCheckpointFile(absl::string_view bytes, absl::string_view file) {
  absl::StatusOr<DecodedFrame> frame = DecodeFrame(bytes, file);
  if (!frame.ok()) return frame.status();
  if (frame->kind != FrameKind::kCheckpoint || frame->frame_size != bytes.size()) {
    return absl::DataLossError(
        absl::StrCat("metadata file ", file, " is not a single checkpoint frame"));
  }
  return DecodeCheckpoint(frame->payload, file, frame->version);
}

absl::StatusOr<RecoveredMetadata> ReplayLog(Checkpoint checkpoint, absl::string_view log_bytes,
                                            absl::string_view log_file, TornTail torn_tail) {
  RecoveredMetadata recovered{std::move(checkpoint), 0, 0};
  Checkpoint& state = recovered.state;
  std::map<std::string, NameEntry> names;
  for (NameEntry& e : state.names) names.emplace(e.name, std::move(e));
  size_t pos = 0;
  while (pos < log_bytes.size()) {
    absl::StatusOr<DecodedFrame> record_frame = DecodeFrame(log_bytes.substr(pos), log_file);
    if (!record_frame.ok()) {
      // A crash can tear only the last append: a bad record followed by a
      // good one is corruption, even if its length field claims the rest.
      if (torn_tail == TornTail::kCorrupt || FrameStartsAfter(log_bytes, pos, log_file)) {
        return absl::DataLossError(absl::StrCat(record_frame.status().message(),
                                                " (record at byte ", pos, " of ", log_bytes.size(),
                                                ")"));
      }
      recovered.torn_bytes = log_bytes.size() - pos;
      break;
    }
    if (record_frame->kind != FrameKind::kEpoch) {
      return absl::DataLossError(absl::StrCat("metadata file ", log_file, ": byte ", pos,
                                              " holds a frame that is not an epoch record"));
    }
    absl::StatusOr<EpochRecord> record = DecodeEpochRecord(record_frame->payload, log_file);
    if (!record.ok()) return record.status();
    if (record->epoch != state.epoch + 1) {
      return absl::DataLossError(absl::StrCat("metadata file ", log_file, ": epoch ", record->epoch,
                                              " follows epoch ", state.epoch));
    }
    state.epoch = record->epoch;
    state.capacity_chunks = record->capacity_chunks;
    for (ChunkRecord& c : record->chunks) state.chunks.push_back(std::move(c));
    for (const std::string& name : record->names.unbound) names.erase(name);
    for (NameEntry& e : record->names.bound) names[e.name] = std::move(e);
    ++recovered.log_records;
    pos += record_frame->frame_size;
  }
  state.names.clear();
  for (auto& [name, entry] : names) state.names.push_back(std::move(entry));
  return recovered;
}

absl::StatusOr<RecoveredMetadata> RecoverMetadata(absl::string_view checkpoint_bytes,
                                                  absl::string_view log_bytes,
                                                  absl::string_view checkpoint_file,
                                                  absl::string_view log_file, TornTail torn_tail) {
  absl::StatusOr<Checkpoint> checkpoint = DecodeCheckpointFile(checkpoint_bytes, checkpoint_file);
  if (!checkpoint.ok()) return checkpoint.status();
  return ReplayLog(*std::move(checkpoint), log_bytes, log_file, torn_tail);
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::Open(const std::string& dir,
                                                                   RecoveredMetadata* recovered,
                                                                   uint64_t checkpoint_log_bytes) {
  absl::StatusOr<UniqueFd> fd = OpenMetadataDirectory(dir);
  if (!fd.ok()) return fd.status();
  return OpenAt(*std::move(fd), dir, recovered, checkpoint_log_bytes);
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::OpenAt(
    UniqueFd dir, std::string dir_path, RecoveredMetadata* recovered,
    uint64_t checkpoint_log_bytes) {
  const std::string checkpoint_path = absl::StrCat(dir_path, "/", kCheckpointFileName);
  absl::StatusOr<std::string> checkpoint_bytes =
      ReadFileIn(dir.get(), dir_path, kCheckpointFileName);
  if (!checkpoint_bytes.ok()) return checkpoint_bytes.status();
  absl::StatusOr<Checkpoint> checkpoint = DecodeCheckpointFile(*checkpoint_bytes, checkpoint_path);
  if (!checkpoint.ok()) return checkpoint.status();
  std::unique_ptr<MetadataStore> store(
      new MetadataStore(std::move(dir), std::move(dir_path), checkpoint->log_generation));
  const int dir_fd = store->dir_.get();
  store->checkpoint_bytes_ = checkpoint_bytes->size();
  store->checkpoint_log_bytes_ = checkpoint_log_bytes;

  // A missing log is an empty one (a crash right after the checkpoint's
  // rename).
  const std::string log_name = LogFileName(store->generation_);
  const std::string log_path = store->LogPath(store->generation_);
  absl::StatusOr<std::string> log = ReadFileIn(dir_fd, store->dir_path_, log_name);
  if (!log.ok() && log.status().code() != absl::StatusCode::kNotFound) return log.status();
  const std::string log_bytes = log.ok() ? *std::move(log) : std::string();
  absl::StatusOr<RecoveredMetadata> state =
      ReplayLog(*std::move(checkpoint), log_bytes, log_path, TornTail::kCutOff);
  if (!state.ok()) return state.status();
  *recovered = *std::move(state);
  const size_t pos = log_bytes.size() - recovered->torn_bytes;
  struct stat st;
  if (fstatat(dir_fd, pos > 0 ? log_name.c_str() : kCheckpointFileName, &st, AT_SYMLINK_NOFOLLOW) ==
      0) {
    store->recovered_commit_unix_ns_ = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  }

  if (absl::Status s = store->OpenLog(/*create=*/false); !s.ok()) return s;
  if (recovered->torn_bytes > 0) {
    if (ftruncate(store->log_fd_, static_cast<off_t>(pos)) != 0 || fsync(store->log_fd_) != 0) {
      return ErrnoStatus(errno, absl::StrCat("cut the torn record off ", log_path));
    }
  }
  store->log_bytes_ = pos;
  if (lseek(store->log_fd_, static_cast<off_t>(pos), SEEK_SET) < 0) {
    return ErrnoStatus(errno, absl::StrCat("seek in ", log_path));
  }
  // Leftovers of an interrupted checkpoint: older logs and a temporary file.
  unlinkat(dir_fd, absl::StrCat(kCheckpointFileName, ".tmp").c_str(), 0);
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir_fd, kMaxHeapDirEntries);
  if (names.ok()) {
    for (const std::string& name : *names) {
      const std::optional<uint64_t> generation = LogGeneration(name);
      if (generation.has_value() && *generation != store->generation_) {
        unlinkat(dir_fd, name.c_str(), 0);
      }
    }
  }
  return store;
}

absl::Status MetadataStore::Append(const EpochRecord& record) {
  const std::string bytes = EncodeEpochRecord(record);
  const std::string what =
      absl::StrCat("append epoch ", record.epoch, " to ", LogPath(generation_));
  FaultPoint("log.before_write");
  absl::Status status = WriteWithTornPoint(log_fd_, bytes, what, "log.torn");
  if (status.ok()) {
    FaultPoint("log.before_sync");
    if (fdatasync(log_fd_) != 0) status = ErrnoStatus(errno, what);
  }
  if (!status.ok()) {
    // Cut off what was written so the log ends at a record boundary.
    if (ftruncate(log_fd_, static_cast<off_t>(log_bytes_)) != 0 ||
        lseek(log_fd_, static_cast<off_t>(log_bytes_), SEEK_SET) < 0) {
      return ErrnoStatus(errno, absl::StrCat(what, ", then cutting it back failed"));
    }
    return status;
  }
  log_bytes_ += bytes.size();
  FaultPoint("log.after_sync");
  return absl::OkStatus();
}

absl::Status MetadataStore::WriteCheckpoint(Checkpoint checkpoint) {
  checkpoint.log_generation = generation_ + 1;
  const std::string bytes = EncodeCheckpoint(checkpoint);
  if (absl::Status s =
          WriteFileAtomically(dir_.get(), dir_path_, kCheckpointFileName, bytes, "checkpoint");
      !s.ok()) {
    return s;
  }
  checkpoint_bytes_ = bytes.size();
  const uint64_t old_generation = generation_;
  generation_ = checkpoint.log_generation;
  if (absl::Status s = OpenLog(/*create=*/true); !s.ok()) return s;
  FaultPoint("checkpoint.new_log");
  if (old_generation > 0) unlinkat(dir_.get(), LogFileName(old_generation).c_str(), 0);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> MetadataStore::ReadCommittedFiles() const {
  std::map<std::string, std::string> files;
  absl::StatusOr<std::string> checkpoint = ReadFileIn(dir_.get(), dir_path_, kCheckpointFileName);
  if (!checkpoint.ok()) return checkpoint.status();
  files[kCheckpointFileName] = *std::move(checkpoint);
  absl::StatusOr<std::string> log = ReadFileIn(dir_.get(), dir_path_, LogFileName(generation_));
  if (!log.ok() && log.status().code() != absl::StatusCode::kNotFound) return log.status();
  files[LogFileName(generation_)] = log.ok() ? *std::move(log) : std::string();
  return files;
}

bool MetadataStore::CheckpointDue() const {
  return log_bytes_ > std::max(checkpoint_log_bytes_, 2 * checkpoint_bytes_);
}

}  // namespace heapd
