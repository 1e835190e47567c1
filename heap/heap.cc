#include "heap/heap.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "heap/fault_point.h"

namespace heapd {
namespace {

constexpr char kDataFile[] = "data";
constexpr char kLockFile[] = "lock";
// Growth step: at least this many chunks, or an eighth of the heap.
constexpr uint32_t kMinGrowChunks = 8;

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PersistentHeap>> PersistentHeap::Create(const std::string& dir,
                                                   HeapConfig config, HeapOptions options) {
  if (config.max_size < kChunkSize || config.max_size % kChunkSize != 0 ||
      config.max_size / kChunkSize > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heap maximum size ", config.max_size, " is not a positive multiple of ",
        kChunkSize, " bytes (2 MiB) below 2^32 chunks"));
  }
  if (config.mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat("heap mode 0", absl::Hex(config.mode),
                                                   " has bits beyond 0777"));
  }
  if (config.created_unix_ns == 0) config.created_unix_ns = absl::ToUnixNanos(absl::Now());
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("heap directory ", dir, " already exists"));
  }
  // Build the heap in a private directory, then rename it into place.
  const std::string building = absl::StrCat(dir, ".creating.", getpid());
  std::error_code ignored;
  std::filesystem::remove_all(building, ignored);
  if (mkdir(building.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, absl::StrCat("create heap directory ", building));
  }
  auto give_up = [&](absl::Status status) {
    std::filesystem::remove_all(building, ignored);
    return status;
  };
  const std::string lock_path = absl::StrCat(building, "/", kLockFile);
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return give_up(ErrnoStatus(errno, absl::StrCat("create ", lock_path)));
  close(lock_fd);
  absl::StatusOr<std::unique_ptr<DataFile>> data =
      DataFile::Create(absl::StrCat(building, "/", kDataFile), 0);
  if (!data.ok()) return give_up(data.status());
  Checkpoint initial;
  initial.config = config;
  absl::StatusOr<std::unique_ptr<MetadataStore>> store = MetadataStore::Create(building, initial);
  if (!store.ok()) return give_up(store.status());
  store->reset();
  data->reset();
  if (absl::Status s = SyncDirectory(building); !s.ok()) return give_up(s);
  FaultPoint("create.before_rename");
  if (rename(building.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    return give_up(err == ENOTEMPTY || err == EEXIST
                       ? absl::AlreadyExistsError(absl::StrCat("heap directory ", dir,
                                                               " already exists"))
                       : ErrnoStatus(err, absl::StrCat("rename ", building, " to ", dir)));
  }
  if (absl::Status s = SyncDirectory(ParentOf(dir)); !s.ok()) return s;
  return Open(dir, options);
}

absl::StatusOr<std::unique_ptr<PersistentHeap>> PersistentHeap::Open(const std::string& dir,
                                                 HeapOptions options) {
  const std::string lock_path = absl::StrCat(dir, "/", kLockFile);
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  if (lock_fd < 0) return ErrnoStatus(errno, absl::StrCat("open heap lock ", lock_path));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(lock_fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("heap ", dir, " is open in another process (", lock_path, " is locked)"));
    }
    return ErrnoStatus(err, absl::StrCat("lock ", lock_path));
  }
  RecoveredMetadata recovered;
  absl::StatusOr<std::unique_ptr<MetadataStore>> store = MetadataStore::Open(dir, &recovered, options.checkpoint_log_bytes);
  if (!store.ok()) {
    close(lock_fd);
    return store.status();
  }
  // The heap owns lock_fd from here on; closing it releases the lock.
  std::unique_ptr<PersistentHeap> heap(new PersistentHeap(dir, recovered.state.config, lock_fd));
  absl::MutexLock lock(&heap->mu_);
  heap->store_ = *std::move(store);
  absl::StatusOr<std::unique_ptr<DataFile>> data =
      DataFile::Open(absl::StrCat(dir, "/", kDataFile));
  if (!data.ok()) return data.status();
  heap->data_ = *std::move(data);
  const uint64_t file_chunks = heap->data_->size() / kChunkSize;
  if (file_chunks < recovered.state.capacity_chunks) {
    return absl::DataLossError(absl::StrCat(
        "data file ", heap->data_->path(), " has ", heap->data_->size(),
        " bytes; its metadata says ", uint64_t{recovered.state.capacity_chunks} * kChunkSize));
  }
  // Chunks past the recorded capacity were added after the last sync: free.
  const uint32_t capacity =
      static_cast<uint32_t>(std::min<uint64_t>(file_chunks, heap->max_chunks()));
  absl::StatusOr<std::unique_ptr<ChunkDirectory>> directory =
      ChunkDirectory::FromRecords(capacity, recovered.state.chunks);
  if (!directory.ok()) {
    return absl::DataLossError(absl::StrCat("heap ", dir, ": ", directory.status().message()));
  }
  heap->directory_ = *std::move(directory);
  for (const NameEntry& entry : recovered.state.names) {
    if (absl::Status s = heap->directory_->Pin(0, {entry.offset, entry.size}); !s.ok()) {
      return absl::DataLossError(absl::StrCat("heap ", dir, ": name '", entry.name,
                                              "' binds a dead object: ", s.message()));
    }
    if (absl::Status s = heap->names_.Bind(entry); !s.ok()) return s;
  }
  heap->names_.TakeChanges();
  heap->directory_->TakeDirtyRecords();
  heap->epoch_ = recovered.state.epoch;
  return heap;
}

PersistentHeap::~PersistentHeap() { close(lock_fd_); }

absl::StatusOr<int> PersistentHeap::OpenDataFile(bool writable) const {
  const std::string path = absl::StrCat(dir_, "/", kDataFile);
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  return fd;
}

uint64_t PersistentHeap::capacity_bytes() const {
  absl::MutexLock lock(&mu_);
  return uint64_t{directory_->capacity_chunks()} * kChunkSize;
}

uint64_t PersistentHeap::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

absl::Status PersistentHeap::GrowLocked(uint32_t chunks) {
  const uint64_t capacity = directory_->capacity_chunks();
  const uint64_t step = std::max<uint64_t>({chunks, kMinGrowChunks, capacity / 8});
  const uint64_t target = std::min(capacity + step, max_chunks());
  if (target < capacity + chunks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "heap ", dir_, " is full: it needs ", chunks, " more chunks of 2 MiB and has ",
        directory_->Stats().free_chunks, " free of ", capacity, " (maximum size ",
        config_.max_size, " bytes)"));
  }
  if (absl::Status s = data_->Grow(target * kChunkSize); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("heap ", dir_, ": ", s.message()));
  }
  directory_->Grow(static_cast<uint32_t>(target));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LeaseGrant>> PersistentHeap::LeaseChunks(ClientId client,
                                                          uint32_t size_class,
                                                          uint32_t count) {
  absl::MutexLock lock(&mu_);
  if (count == 0) return absl::InvalidArgumentError("lease of 0 chunks");
  absl::StatusOr<std::vector<LeaseGrant>> grants = directory_->Lease(client, size_class, count);
  if (!grants.ok() || !grants->empty()) return grants;
  if (absl::Status s = GrowLocked(count); !s.ok()) return s;
  return directory_->Lease(client, size_class, count);
}

absl::StatusOr<uint64_t> PersistentHeap::AllocateLarge(ClientId client, uint64_t size) {
  absl::MutexLock lock(&mu_);
  if (size == 0 || size > config_.max_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "large allocation of ", size, " bytes in heap ", dir_, " of at most ",
        config_.max_size, " bytes"));
  }
  absl::StatusOr<uint64_t> offset = directory_->AllocateLarge(client, size);
  if (offset.ok() || offset.status().code() != absl::StatusCode::kResourceExhausted) {
    return offset;
  }
  const uint32_t chunks = static_cast<uint32_t>((size + kChunkSize - 1) / kChunkSize);
  if (absl::Status s = GrowLocked(chunks); !s.ok()) return s;
  return directory_->AllocateLarge(client, size);
}

absl::Status PersistentHeap::Free(ClientId client, absl::Span<const ObjectRef> objects) {
  absl::MutexLock lock(&mu_);
  return directory_->Free(client, objects);
}

absl::Status PersistentHeap::Bind(ClientId client, const NameEntry& entry) {
  if (absl::Status s = ValidateName(entry.name); !s.ok()) return s;
  if (absl::Status s = ValidateName(entry.type_name, "type name"); !s.ok()) return s;
  if (entry.size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("name '", entry.name, "' binds 0 bytes"));
  }
  absl::MutexLock lock(&mu_);
  // Check the name first so a taken name pins nothing.
  if (absl::StatusOr<NameEntry> taken = names_.Lookup(entry.name); taken.ok()) {
    return absl::AlreadyExistsError(absl::StrCat("name '", entry.name,
                                                 "' is already bound (offset ", taken->offset,
                                                 ", type ", taken->type_name, ")"));
  }
  if (absl::Status s = directory_->Pin(client, {entry.offset, entry.size}); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot bind '", entry.name, "': ", s.message()));
  }
  return names_.Bind(entry);
}

absl::StatusOr<NameEntry> PersistentHeap::Lookup(absl::string_view name) const {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return names_.Lookup(name);
}

absl::StatusOr<NameEntry> PersistentHeap::Unbind(absl::string_view name) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<NameEntry> entry = names_.Unbind(name);
  if (entry.ok()) directory_->Unpin(entry->offset);
  return entry;
}

std::vector<NameEntry> PersistentHeap::ListNames(absl::string_view prefix, size_t limit) const {
  absl::MutexLock lock(&mu_);
  return names_.List(prefix, limit);
}

absl::Status PersistentHeap::PersistLocked() {
  // Object contents first: a name must never reach disk before its object.
  if (absl::Status s = data_->Flush(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("sync of heap ", dir_, ": ", s.message()));
  }
  FaultPoint("sync.after_data_flush");
  const uint64_t epoch = epoch_ + 1;
  absl::Status status;
  if (checkpoint_next_ || store_->CheckpointDue()) {
    directory_->TakeDirtyRecords();
    names_.TakeChanges();
    Checkpoint checkpoint;
    checkpoint.config = config_;
    checkpoint.epoch = epoch;
    checkpoint.capacity_chunks = directory_->capacity_chunks();
    checkpoint.chunks = directory_->AllRecords();
    checkpoint.names = names_.List("");
    status = store_->WriteCheckpoint(std::move(checkpoint));
  } else {
    EpochRecord record;
    record.epoch = epoch;
    record.capacity_chunks = directory_->capacity_chunks();
    record.chunks = directory_->TakeDirtyRecords();
    record.names = names_.TakeChanges();
    status = store_->Append(record);
  }
  if (!status.ok()) {
    // The changes taken above are still in memory; a full checkpoint at the
    // next sync persists them.
    checkpoint_next_ = true;
    return absl::Status(status.code(), absl::StrCat("sync of heap ", dir_, ": ",
                                                    status.message()));
  }
  checkpoint_next_ = false;
  epoch_ = epoch;
  last_sync_unix_ns_ = absl::ToUnixNanos(absl::Now());
  return absl::OkStatus();
}

absl::StatusOr<SyncResult> PersistentHeap::ReportAndPersist(ClientId client,
                                                   absl::Span<const LeaseReport> reports,
                                                   bool release) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::vector<LeaseCorrection>> corrections =
      directory_->Report(client, reports, release);
  if (!corrections.ok()) return corrections.status();
  directory_->Commit(client);
  if (release) directory_->Reclaim(client);  // leases the client did not report
  if (absl::Status s = PersistLocked(); !s.ok()) return s;
  return SyncResult{epoch_, *std::move(corrections)};
}

absl::StatusOr<SyncResult> PersistentHeap::Sync(ClientId client, absl::Span<const LeaseReport> reports) {
  return ReportAndPersist(client, reports, /*release=*/false);
}

absl::StatusOr<SyncResult> PersistentHeap::Detach(ClientId client, absl::Span<const LeaseReport> reports) {
  return ReportAndPersist(client, reports, /*release=*/true);
}

absl::Status PersistentHeap::ReturnLeases(ClientId client, absl::Span<const LeaseReport> reports) {
  absl::MutexLock lock(&mu_);
  return directory_->Report(client, reports, /*release=*/true).status();
}

size_t PersistentHeap::LeaseCount(ClientId client) const {
  absl::MutexLock lock(&mu_);
  return directory_->LeaseCount(client);
}

ReclaimResult PersistentHeap::Reclaim(ClientId client) {
  absl::MutexLock lock(&mu_);
  return directory_->Reclaim(client);
}

absl::Status PersistentHeap::WithFilesAtRest(
    const std::function<absl::Status(const std::string& dir, int data_fd, uint64_t epoch)>&
        copy) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = data_->Flush(); !s.ok()) return s;
  return copy(dir_, data_->fd(), epoch_);
}

HeapStats PersistentHeap::Stats() const {
  absl::MutexLock lock(&mu_);
  HeapStats stats;
  stats.epoch = epoch_;
  stats.max_size = config_.max_size;
  stats.capacity_bytes = uint64_t{directory_->capacity_chunks()} * kChunkSize;
  stats.backing = data_->backing();
  stats.directory = directory_->Stats();
  stats.names = names_.size();
  stats.last_sync_unix_ns = last_sync_unix_ns_;
  stats.metadata_log_bytes = store_->log_bytes();
  return stats;
}

absl::Status PersistentHeap::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = directory_->CheckInvariants(); !s.ok()) return s;
  if (data_->size() < uint64_t{directory_->capacity_chunks()} * kChunkSize) {
    return absl::InternalError("data file is smaller than the heap's capacity");
  }
  return absl::OkStatus();
}

}  // namespace heapd

namespace heapd {

std::vector<ChunkRecord> PersistentHeap::PersistedChunks() const {
  absl::MutexLock lock(&mu_);
  std::vector<ChunkRecord> records = directory_->AllRecords();
  records.erase(std::remove_if(records.begin(), records.end(),
                               [](const ChunkRecord& r) {
                                 if (r.kind != ChunkKind::kSmall) return false;
                                 absl::StatusOr<SlotBitmap> bitmap =
                                     SlotBitmap::FromWords(SlotsPerChunk(r.size_class), r.words);
                                 return bitmap.ok() && bitmap->empty();
                               }),
                records.end());
  return records;
}

}  // namespace heapd
