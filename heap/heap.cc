#include "heap/heap.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"
#include "heap/fault_point.h"
#include "heap/fixed_address.h"
#include "heap/heap_dir.h"
#include "util/errno_status.h"
#include "util/random_name.h"

namespace heapd {
namespace {

// Growth step: at least this many chunks, or an eighth of the heap.
constexpr uint32_t kMinGrowChunks = 8;
// Other threads may take what a growth made before this one gets to it;
// after this many growths the allocation gives up (RESOURCE_EXHAUSTED).
constexpr int kMaxGrowAttempts = 8;

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The pages of `chunks` that live objects use, within each one's range;
// ascending, each once.
std::vector<uint64_t> LivePages(const std::vector<FreshChunk>& chunks) {
  std::vector<uint64_t> live;
  for (const FreshChunk& fresh : chunks) {
    const ChunkRecord& record = fresh.record;
    // The pages of the bytes [begin, stop), within the range.
    auto add = [&](uint64_t begin, uint64_t stop) {
      begin = std::max(begin, fresh.begin) & ~(kRedoBlockBytes - 1);
      stop = std::min(stop, fresh.end);
      // Chunks come in no particular order: only a repeat of the last page
      // (neighbouring slots) is left out here, the rest after the sort.
      for (uint64_t page = begin; page < stop; page += kRedoBlockBytes) {
        if (live.empty() || live.back() != page) live.push_back(page);
      }
    };
    const uint64_t base = uint64_t{record.chunk} * kChunkSize;
    if (record.kind == ChunkKind::kLargeHead) {
      add(base, base + uint64_t{record.run_chunks} * kChunkSize);
      continue;
    }
    // A small chunk: its allocated slots, word by word (bits past the last
    // slot are set: cut by SlotsPerChunk).
    const uint64_t slot_bytes = ClassSize(record.size_class);
    const uint32_t slots = SlotsPerChunk(record.size_class);
    for (size_t word = 0; word < record.words.size(); ++word) {
      for (uint64_t bits = record.words[word]; bits != 0; bits &= bits - 1) {
        const uint64_t slot = word * 64 + static_cast<uint64_t>(__builtin_ctzll(bits));
        if (slot >= slots) break;
        add(base + slot * slot_bytes, base + (slot + 1) * slot_bytes);
      }
    }
  }
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  return live;
}

}  // namespace

absl::Status CheckMemoryForTmpfs(uint64_t bytes, uint64_t reserve, const std::string& heap) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key != "MemAvailable:") continue;
    const uint64_t available = kib << 10;
    if (available < reserve || available - reserve < bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("heap ", heap, " lives in memory (on tmpfs, or a working image): ", bytes,
                       " more bytes would leave less than the reserve of ", reserve,
                       " bytes (--tmpfs_reserve_bytes) of the node's ", available,
                       " bytes of available memory"));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();  // no MemAvailable to go by
}

ImageMode ImageModeFor(const std::string& parent, const HeapOptions& options, uint64_t max_size) {
  if (!options.working_images || !options.track_contents) return ImageMode::kDirect;
  if (options.working_image_max_bytes != 0 && max_size > options.working_image_max_bytes) {
    return ImageMode::kDirect;
  }
  struct statfs fs;
  if (statfs(parent.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) return ImageMode::kDirect;
  return ImageMode::kWorkingImage;
}

std::string ContentRollbackNote(BackingKind backing, bool track_contents) {
  if (!track_contents) return "content tracking is off (--track_contents=false)";
  if (backing != BackingKind::kTmpfs) {
    return absl::StrCat(
        "clients map the heap's data file, on ", BackingKindName(backing),
        ", where they cannot take pre-images of pages (userfaultfd write-protection "
        "works on tmpfs only): allocations and names roll back to the last sync, object "
        "contents do not (a heap created with a working image would: --image=working, the "
        "default unless heapd runs with --working_images=false)");
  }
  return "";
}

absl::Status ValidateHeapConfig(const HeapConfig& config) {
  if (config.max_size < kChunkSize || config.max_size % kChunkSize != 0 ||
      config.max_size > kMaxHeapBytes) {
    return absl::InvalidArgumentError(absl::StrCat("heap maximum size ", config.max_size,
                                                   " is not a positive multiple of ", kChunkSize,
                                                   " bytes (2 MiB) up to ", kMaxHeapBytes));
  }
  if (config.mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("heap mode 0", absl::StrFormat("%o", config.mode), " has bits beyond 0777"));
  }
  if (config.fixed_base != 0) return ValidateFixedBase(config.fixed_base, config.max_size);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PersistentHeap>> PersistentHeap::Create(const std::string& dir,
                                                                       HeapConfig config,
                                                                       HeapOptions options) {
  if (absl::Status s = ValidateHeapConfig(config); !s.ok()) return s;
  if (config.created_unix_ns == 0) config.created_unix_ns = absl::ToUnixNanos(absl::Now());
  struct stat st;
  if (lstat(dir.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("heap directory ", dir, " already exists"));
  }
  absl::StatusOr<std::unique_ptr<HeapDirBuilder>> building =
      HeapDirBuilder::Start(ParentOf(dir), BaseName(dir), HiddenPurpose::kCreating);
  if (!building.ok()) return building.status();
  absl::StatusOr<std::unique_ptr<DataFile>> data =
      DataFile::Create((*building)->PathOf(kDataFileName), 0);
  if (!data.ok()) return data.status();
  Checkpoint initial;
  initial.config = config;
  absl::StatusOr<UniqueFd> metadata_dir = (*building)->DupDirFd();
  if (!metadata_dir.ok()) return metadata_dir.status();
  absl::StatusOr<std::unique_ptr<MetadataStore>> store =
      MetadataStore::CreateAt(*std::move(metadata_dir), (*building)->path(), initial);
  if (!store.ok()) return store.status();
  store->reset();
  data->reset();
  if (config.image == ImageMode::kWorkingImage) {
    absl::StatusOr<UniqueFd> log_dir = (*building)->DupDirFd();
    if (!log_dir.ok()) return log_dir.status();
    if (absl::Status s =
            DurableImage::CreateLog(log_dir->get(), (*building)->path(), options.redo_log_bytes);
        !s.ok()) {
      return s;
    }
  }
  FaultPoint("create.before_rename");
  if (absl::Status s = (*building)->Commit(BaseName(dir)); !s.ok()) return s;
  return Open(dir, options);
}

absl::StatusOr<std::unique_ptr<PersistentHeap>> PersistentHeap::Open(const std::string& dir,
                                                                     HeapOptions options) {
  // The heap's files are reached through this descriptor from here on.
  UniqueFd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir_fd.valid()) return ErrnoStatus(errno, absl::StrCat("open heap directory ", dir));
  const std::string lock_path = absl::StrCat(dir, "/", kLockFileName);
  UniqueFd lock_fd(openat(dir_fd.get(), kLockFileName, O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!lock_fd.valid()) return ErrnoStatus(errno, absl::StrCat("open heap lock ", lock_path));
  if (flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("heap ", dir, " is open in another process (", lock_path, " is locked)"));
    }
    return ErrnoStatus(errno, absl::StrCat("lock ", lock_path));
  }
  UniqueFd metadata_dir(fcntl(dir_fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!metadata_dir.valid()) return ErrnoStatus(errno, absl::StrCat("duplicate the fd of ", dir));
  RecoveredMetadata recovered;
  absl::StatusOr<std::unique_ptr<MetadataStore>> store =
      MetadataStore::OpenAt(std::move(metadata_dir), dir, &recovered, options.checkpoint_log_bytes);
  if (!store.ok()) return store.status();
  absl::StatusOr<std::unique_ptr<DataFile>> data =
      DataFile::OpenAt(dir_fd.get(), kDataFileName, absl::StrCat(dir, "/", kDataFileName));
  if (!data.ok()) return data.status();
  std::unique_ptr<DurableImage> durable;
  if (recovered.state.config.image == ImageMode::kWorkingImage) {
    // The data file at the committed epoch, then the working image from it:
    // whatever a working image held before (a heapd that died, a node that
    // rebooted) is not read.
    absl::StatusOr<std::unique_ptr<DurableImage>> opened = DurableImage::Open(
        dir_fd.get(), dir, *std::move(data), recovered.state.epoch, options.redo_log_bytes);
    if (!opened.ok()) return opened.status();
    durable = *std::move(opened);
    // The working image takes the heap's capacity in memory, as growth
    // would.
    if (options.tmpfs_reserve_bytes != 0) {
      if (absl::Status s =
              CheckMemoryForTmpfs(durable->data().size(), options.tmpfs_reserve_bytes, dir);
          !s.ok()) {
        return s;
      }
    }
    data = durable->LoadWorkingImage(absl::StrCat("the working image of heap ", dir));
    if (!data.ok()) return data.status();
  }
  const uint64_t log_bytes = (*store)->log_bytes();
  const int64_t committed_unix_ns = (*store)->recovered_commit_unix_ns();
  std::unique_ptr<PersistentHeap> heap(new PersistentHeap(dir, recovered.state.config, options));
  heap->dir_fd_ = std::move(dir_fd);
  heap->lock_fd_ = std::move(lock_fd);  // closing it releases the lock
  heap->data_ = *std::move(data);
  heap->durable_ = std::move(durable);
  heap->store_ = *std::move(store);
  absl::MutexLock lock(&heap->mu_);
  if (absl::Status s = heap->LoadLocked(dir, recovered.state, heap->data_->size()); !s.ok()) {
    return s;
  }
  heap->metadata_log_bytes_ = log_bytes;
  heap->last_sync_unix_ns_ = committed_unix_ns;
  // Journals left by a heapd that tracked contents are recovered even when
  // this one does not (--track_contents turned off across a crash).
  const bool track = ContentRollbackNote(heap->data_->backing(), options.track_contents).empty();
  const std::string undo_dir = absl::StrCat(dir, "/", kUndoDirName);
  struct stat undo_st;
  if (track || fstatat(heap->dir_fd_.get(), kUndoDirName, &undo_st, AT_SYMLINK_NOFOLLOW) == 0) {
    // A working image was just loaded at the committed epoch: nothing in
    // it goes back.
    absl::StatusOr<std::unique_ptr<ContentUndo>> undo =
        ContentUndo::OpenAt(heap->dir_fd_.get(), kUndoDirName, undo_dir, heap->data_.get(),
                            heap->epoch_, &heap->recovered_,
                            /*put_back=*/heap->durable_ == nullptr);
    if (!undo.ok()) return undo.status();
    if (track) heap->undo_ = *std::move(undo);
  }
  return heap;
}

absl::StatusOr<std::unique_ptr<PersistentHeap>> PersistentHeap::OpenSnapshot(
    const std::string& label, UniqueFd data, const RecoveredMetadata& metadata) {
  struct stat st;
  if (fstat(data.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", label));
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat(label, ": its data is not a regular file"));
  }
  absl::StatusOr<std::unique_ptr<DataFile>> file =
      DataFile::Adopt(label, data.release(), static_cast<uint64_t>(st.st_size));
  if (!file.ok()) return file.status();
  std::unique_ptr<PersistentHeap> heap(new PersistentHeap("", metadata.state.config, {}));
  heap->data_ = *std::move(file);
  absl::MutexLock lock(&heap->mu_);
  if (absl::Status s = heap->LoadLocked(label, metadata.state, heap->data_->size()); !s.ok()) {
    return s;
  }
  return heap;
}

absl::Status PersistentHeap::ValidateState(const std::string& label, const Checkpoint& metadata,
                                           uint64_t data_bytes) {
  PersistentHeap heap("", metadata.config, {});
  absl::MutexLock lock(&heap.mu_);
  return heap.LoadLocked(label, metadata, data_bytes);
}

absl::Status PersistentHeap::LoadLocked(const std::string& label, const Checkpoint& state,
                                        uint64_t data_bytes) {
  if (absl::Status s = ValidateHeapConfig(state.config); !s.ok()) {
    return absl::DataLossError(absl::StrCat("heap ", label, ": ", s.message()));
  }
  const uint64_t file_chunks = data_bytes / kChunkSize;
  if (file_chunks < state.capacity_chunks || state.capacity_chunks > max_chunks()) {
    return absl::DataLossError(absl::StrCat(
        "heap ", label, ": data file ", data_ == nullptr ? "" : data_->path(), " has ", data_bytes,
        " bytes; its metadata says ", uint64_t{state.capacity_chunks} * kChunkSize, " of at most ",
        config_.max_size));
  }
  // Chunks past the recorded capacity were added after the last sync: free.
  const uint32_t capacity = static_cast<uint32_t>(std::min<uint64_t>(file_chunks, max_chunks()));
  absl::StatusOr<std::unique_ptr<ChunkDirectory>> directory =
      ChunkDirectory::FromRecords(capacity, state.chunks);
  if (!directory.ok()) {
    return absl::DataLossError(absl::StrCat("heap ", label, ": ", directory.status().message()));
  }
  directory_ = *std::move(directory);
  for (const NameEntry& entry : state.names) {
    if (absl::Status s = ValidateName(entry.name); !s.ok()) {
      return absl::DataLossError(absl::StrCat("heap ", label, ": ", s.message()));
    }
    if (absl::Status s = directory_->Pin(0, {entry.offset, entry.size}); !s.ok()) {
      return absl::DataLossError(absl::StrCat("heap ", label, ": name '", entry.name,
                                              "' binds a dead object: ", s.message()));
    }
    if (absl::Status s = names_.Bind(entry); !s.ok()) {
      return absl::DataLossError(absl::StrCat("heap ", label, ": ", s.message()));
    }
  }
  names_.TakeChanges();
  directory_->TakeDirtyRecords();
  epoch_ = state.epoch;
  return absl::OkStatus();
}

PersistentHeap::PersistentHeap(std::string dir, HeapConfig config, HeapOptions options)
    : dir_(std::move(dir)),
      config_(config),
      options_(options),
      grow_ahead_(
          [this]() -> std::optional<uint32_t> {
            absl::MutexLock lock(&mu_);
            if (!CheckWritableLocked("grow the heap").ok() || !GrowAheadDueLocked()) {
              return std::nullopt;
            }
            return directory_->capacity_chunks();
          },
          // One chunk at least: the step is the usual one, but the last few
          // chunks below the maximum size can be added too.
          [this](uint32_t capacity_seen) { return Grow(1, capacity_seen); }) {}

PersistentHeap::~PersistentHeap() { grow_ahead_.Stop(); }

bool PersistentHeap::GrowAheadDueLocked() const {
  const uint32_t capacity = directory_->capacity_chunks();
  return options_.grow_ahead && capacity < max_chunks() && directory_->FreeChunks() < capacity / 16;
}

absl::StatusOr<int> PersistentHeap::OpenDataFile(bool writable) const {
  if (read_only()) {
    if (writable) {
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot ", data_->path(), " is read-only"));
    }
    const int fd = fcntl(data_->fd(), F_DUPFD_CLOEXEC, 3);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("duplicate the fd of ", data_->path()));
    return fd;
  }
  if (durable_ != nullptr) return data_->Reopen(writable);
  const int fd =
      openat(dir_fd_.get(), kDataFileName, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", dir_, "/", kDataFileName));
  return fd;
}

absl::StatusOr<int> PersistentHeap::OpenCommittedData() const {
  if (durable_ == nullptr) return OpenDataFile(/*writable=*/false);
  const int fd = openat(dir_fd_.get(), kDataFileName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", dir_, "/", kDataFileName));
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

absl::Status PersistentHeap::broken() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

void PersistentHeap::MarkRemoved() {
  {
    absl::MutexLock persist_lock(&persist_mu_);
    absl::MutexLock lock(&mu_);
    removed_ = true;
  }
  grow_ahead_.Stop();
}

absl::Status PersistentHeap::CheckWritableLocked(const char* what) const {
  if (read_only()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot ", what, ": snapshot ", data_->path(), " is read-only"));
  }
  if (removed_) {
    return absl::NotFoundError(absl::StrCat("cannot ", what, ": heap ", dir_, " was removed"));
  }
  if (!broken_.ok()) {
    return absl::Status(broken_.code(), absl::StrCat("cannot ", what, ": ", broken_.message()));
  }
  return absl::OkStatus();
}

absl::Status PersistentHeap::RepairDataFileLocked() {
  absl::StatusOr<bool> repaired = data_->Repair();
  if (!repaired.ok()) return repaired.status();
  if (*repaired) data_file_repairs_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status PersistentHeap::Grow(uint32_t chunks, uint32_t capacity_seen) {
  absl::MutexLock grow_lock(&grow_mu_);
  uint64_t free_tail;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckWritableLocked("grow the heap"); !s.ok()) return s;
    // Another thread grew the heap while this one waited: try that first.
    if (directory_->capacity_chunks() != capacity_seen) return absl::OkStatus();
    free_tail = directory_->FreeTailChunks();
  }
  const uint64_t capacity = capacity_seen;
  const uint64_t step = std::max<uint64_t>({chunks, kMinGrowChunks, capacity / 8});
  const uint64_t target = std::min(capacity + step, max_chunks());
  // A run of `chunks` at the end: the free chunks there and the growth.
  if (target < capacity + chunks - std::min<uint64_t>(free_tail, chunks) || target == capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("heap ", dir_, " is full: it needs a free run of ", chunks,
                     " chunks of 2 MiB, and ", free_tail, " of its ", capacity,
                     " are free at its end (maximum size ", config_.max_size, " bytes)"));
  }
  if (absl::Status s = RepairDataFileLocked(); !s.ok()) return s;
  if (data_->backing() == BackingKind::kTmpfs && options_.tmpfs_reserve_bytes != 0) {
    if (absl::Status s = CheckMemoryForTmpfs((target - capacity) * kChunkSize,
                                             options_.tmpfs_reserve_bytes, dir_);
        !s.ok()) {
      return s;
    }
  }
  // fallocate with only grow_mu_ held: leases, frees and lookups go on.
  // The data file first: the disk's room decides.
  if (durable_ != nullptr) {
    if (absl::Status s = durable_->Grow(target * kChunkSize); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("heap ", dir_, ": ", s.message()));
    }
  }
  if (absl::Status s = data_->Grow(target * kChunkSize); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("heap ", dir_, ": ", s.message()));
  }
  absl::MutexLock lock(&mu_);
  directory_->Grow(static_cast<uint32_t>(target));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LeaseGrant>> PersistentHeap::LeaseChunks(
    ClientId client, uint32_t size_class, uint32_t count, absl::Span<const uint32_t> reuse) {
  if (count == 0) return absl::InvalidArgumentError("lease of 0 chunks");
  for (int attempt = 0;; ++attempt) {
    uint32_t capacity_seen;
    bool grow_ahead;
    absl::StatusOr<std::vector<LeaseGrant>> grants;
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = CheckWritableLocked("lease chunks"); !s.ok()) return s;
      // A chunk is taken back as another class only while what the
      // directory holds is what was persisted: after a sync failed having
      // applied its reports, an emptied chunk may still hold objects at the
      // last commit, whose pre-images taking it back would void.
      grants = directory_->Lease(client, size_class, count,
                                 checkpoint_next_ ? absl::Span<const uint32_t>() : reuse);
      reuse = {};  // taken on the first attempt
      capacity_seen = directory_->capacity_chunks();
      grow_ahead = GrowAheadDueLocked();
    }
    if (grow_ahead) grow_ahead_.Request();
    if (!grants.ok() || !grants->empty() || attempt == kMaxGrowAttempts) {
      if (!grants.ok() || undo_ == nullptr) return grants;
      // An empty chunk is fresh: its client writes it without pre-images.
      for (const LeaseGrant& grant : *grants) {
        if (!SlotBitmap::NoneAllocated(SlotsPerChunk(grant.size_class), grant.words)) continue;
        if (absl::Status s = ForgetUndo(client, uint64_t{grant.chunk} * kChunkSize, kChunkSize);
            !s.ok()) {
          return s;
        }
      }
      return grants;
    }
    if (absl::Status s = Grow(count, capacity_seen); !s.ok()) return s;
  }
}

absl::StatusOr<std::vector<LeaseGrant>> PersistentHeap::LeaseAll(
    ClientId client, absl::Span<const LeaseWant> wants) {
  // The chunks offered back that are the client's before the call.
  std::set<uint32_t> held;
  {
    absl::MutexLock lock(&mu_);
    for (const LeaseWant& want : wants) {
      for (uint32_t chunk : want.reuse) {
        if (directory_->LeasesSmall(client, chunk)) held.insert(chunk);
      }
    }
  }
  std::vector<LeaseGrant> grants;
  // The chunks this call leased that were not the client's before it, at
  // their latest grant (a later want may take one back as its class).
  std::map<uint32_t, size_t> fresh;
  for (const LeaseWant& want : wants) {
    absl::StatusOr<std::vector<LeaseGrant>> got =
        LeaseChunks(client, want.size_class, want.count, want.reuse);
    if (!got.ok()) {
      std::vector<LeaseReport> back;
      for (const auto& [chunk, index] : fresh) {
        back.push_back(
            {chunk, grants[index].words, static_cast<int32_t>(grants[index].size_class)});
      }
      // If they cannot go back, they stay the client's until it ends, and
      // the answer says so.
      if (absl::Status s = ReturnLeases(client, back); !s.ok()) {
        return absl::Status(got.status().code(),
                            absl::StrCat(got.status().message(), "; the ", back.size(),
                                         " chunks the call's other wants leased stay the "
                                         "session's until it ends: ",
                                         s.message()));
      }
      return got.status();
    }
    for (LeaseGrant& grant : *got) {
      if (held.count(grant.chunk) == 0) fresh[grant.chunk] = grants.size();
      grants.push_back(std::move(grant));
    }
  }
  return grants;
}

absl::StatusOr<LargePlacement> PersistentHeap::TakeRun(
    ClientId client, uint32_t grow_least, uint32_t grow_chunks,
    const std::function<absl::StatusOr<LargePlacement>()>& take) {
  for (int attempt = 0;; ++attempt) {
    uint32_t capacity_seen;
    bool grow_ahead;
    absl::StatusOr<LargePlacement> run;
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = CheckWritableLocked("allocate"); !s.ok()) return s;
      run = take();
      capacity_seen = directory_->capacity_chunks();
      grow_ahead = GrowAheadDueLocked();
    }
    if (grow_ahead) grow_ahead_.Request();
    if (run.ok() && undo_ != nullptr) {
      // The run was free: its client writes it without pre-images.
      if (absl::Status s = ForgetUndo(client, uint64_t{run->chunk} * kChunkSize,
                                      uint64_t{run->chunks} * kChunkSize);
          !s.ok()) {
        return s;
      }
    }
    if (run.ok() || run.status().code() != absl::StatusCode::kResourceExhausted ||
        attempt == kMaxGrowAttempts) {
      return run;
    }
    // A growth by the whole run makes one at the end (with any free chunks
    // before it); by the least that serves when the heap has no more room.
    absl::Status grown = Grow(grow_chunks, capacity_seen);
    if (grown.code() == absl::StatusCode::kResourceExhausted && grow_least < grow_chunks) {
      grown = Grow(grow_least, capacity_seen);
    }
    if (!grown.ok()) return grown;
  }
}

absl::StatusOr<uint64_t> PersistentHeap::AllocateLarge(ClientId client, uint64_t size) {
  if (size == 0 || size > config_.max_size) {
    return absl::InvalidArgumentError(absl::StrCat("large allocation of ", size, " bytes in heap ",
                                                   dir_, " of at most ", config_.max_size,
                                                   " bytes"));
  }
  const uint32_t chunks = static_cast<uint32_t>((size + kChunkSize - 1) / kChunkSize);
  absl::StatusOr<LargePlacement> run =
      TakeRun(client, chunks, chunks,
              [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::StatusOr<LargePlacement> {
                absl::StatusOr<uint64_t> offset = directory_->AllocateLarge(client, size);
                if (!offset.ok()) return offset.status();
                return LargePlacement{static_cast<uint32_t>(*offset / kChunkSize), chunks};
              });
  if (!run.ok()) return run.status();
  return uint64_t{run->chunk} * kChunkSize;
}

absl::StatusOr<LargePlacement> PersistentHeap::ReserveLarge(ClientId client, uint32_t min_chunks,
                                                            uint32_t most) {
  if (min_chunks == 0 || min_chunks > most || most > max_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("a reserve of ", min_chunks, " to ", most,
                                                   " chunks in heap ", dir_, " of at most ",
                                                   max_chunks(), " chunks"));
  }
  // Past half its maximum size, the heap grows by what the object needs
  // only: a batch's remainder could split the room a later object needs.
  const bool roomy = capacity_bytes() / kChunkSize + most <= max_chunks() / 2;
  return TakeRun(client, min_chunks, roomy ? most : min_chunks,
                 [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                   return directory_->Reserve(client, min_chunks, most);
                 });
}

absl::StatusOr<LargePlacement> AllocateOrReserve(PersistentHeap& heap, ClientId client,
                                                 uint64_t size, bool reserve, uint64_t min_size) {
  auto chunks_of = [](uint64_t bytes) {
    return static_cast<uint32_t>(
        std::min<uint64_t>((bytes + kChunkSize - 1) / kChunkSize, UINT32_MAX));
  };
  if (reserve) {
    return heap.ReserveLarge(client, chunks_of(min_size == 0 ? size : min_size), chunks_of(size));
  }
  absl::StatusOr<uint64_t> offset = heap.AllocateLarge(client, size);
  if (!offset.ok()) return offset.status();
  return LargePlacement{static_cast<uint32_t>(*offset / kChunkSize), chunks_of(size)};
}

absl::Status PersistentHeap::Free(ClientId client, absl::Span<const ObjectRef> objects) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritableLocked("free"); !s.ok()) return s;
  if (undo_ == nullptr) return directory_->Free(client, objects);
  if (absl::Status s = directory_->CheckFree(client, objects); !s.ok()) return s;
  return pending_.DeferFrees(*directory_, client, objects);
}

absl::Status PersistentHeap::Bind(ClientId client, const NameEntry& entry) {
  if (absl::Status s = ValidateName(entry.name); !s.ok()) return s;
  if (absl::Status s = ValidateName(entry.type_name, "type name"); !s.ok()) return s;
  if (entry.size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("name '", entry.name, "' binds 0 bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritableLocked("bind a name"); !s.ok()) return s;
  // Check the name first so a taken name pins nothing.
  if (absl::StatusOr<NameEntry> taken = names_.Lookup(entry.name); taken.ok()) {
    return absl::AlreadyExistsError(absl::StrCat("name '", entry.name,
                                                 "' is already bound (offset ", taken->offset,
                                                 ", type ", taken->type_name, ")"));
  }
  if (options_.max_names != 0 && names_.size() >= options_.max_names) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot bind '", entry.name,
                                                     "': the heap holds ", names_.size(),
                                                     " names, its limit (--max_names_per_heap)"));
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
  if (absl::Status s = CheckWritableLocked("unbind a name"); !s.ok()) return s;
  absl::StatusOr<NameEntry> entry = names_.Unbind(name);
  if (entry.ok()) directory_->Unpin(entry->offset);
  return entry;
}

std::vector<NameEntry> PersistentHeap::ListNames(absl::string_view prefix, size_t limit) const {
  absl::MutexLock lock(&mu_);
  return names_.List(prefix, limit);
}

absl::Status PersistentHeap::FlushDataLocked(uint64_t epoch, std::vector<uint64_t> pages,
                                             bool all_pages) {
  uint64_t size;
  {
    absl::MutexLock grow_lock(&grow_mu_);
    if (absl::Status s = RepairDataFileLocked(); !s.ok()) {
      if (durable_ != nullptr) {  // as a failed log below
        absl::MutexLock lock(&mu_);
        return BreakLocked(s.message());
      }
      return absl::Status(s.code(), absl::StrCat("sync of heap ", dir_, ": ", s.message()));
    }
    size = data_->size();
  }
  if (durable_ != nullptr) {
    if (all_pages) {
      pages.clear();
      for (uint64_t page = 0; page < size; page += kRedoBlockBytes) pages.push_back(page);
    }
    // Epochs follow each other: the committed one is the one before.
    absl::Status logged = durable_->MakeRoom(pages.size(), epoch - 1);
    if (logged.ok()) {
      // Pages read after the sync's commit point, as they were at it.
      static_assert(kRedoBlockBytes == kUndoPageBytes, "the log's pages are undo pages");
      PagePatch as_of_commit = nullptr;
      if (undo_ != nullptr) {
        as_of_commit = [this](const uint64_t* offsets, size_t count, char* data) {
          return undo_->AsOfCommit(offsets, count, data);
        };
      }
      logged = durable_->Log(epoch, pages, data_->fd(), as_of_commit);
      // Logged (or failed): nothing more reads the commit window.
      if (undo_ != nullptr) undo_->EndCommit();
    }
    if (logged.ok()) return logged;
    absl::MutexLock lock(&mu_);
    // This sync's generation end is written: the next epoch would commit
    // it without these pages, and logged later they could hold the
    // session's next stores. The heap stops here; reopened, it is at its
    // last epoch.
    return BreakLocked(absl::StrCat("its redo log failed: ", logged.message()));
  }
  absl::Status flushed = data_->Flush();
  if (flushed.ok()) return flushed;
  // Never retried: the pages that failed may be clean now and lost.
  absl::MutexLock lock(&mu_);
  return BreakLocked(flushed.message());
}

std::vector<FreshChunk> PersistentHeap::FreshChunksLocked(
    const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const {
  const uint64_t capacity = uint64_t{directory_->capacity_chunks()} * kChunkSize;
  std::vector<FreshChunk> chunks;
  for (const std::pair<uint64_t, uint64_t>& range : ranges) {
    const uint64_t end = std::min(range.first + range.second, capacity);
    if (range.first >= end) continue;
    // A large object may begin before the range: memory handed out free at
    // different times, next to each other, is one run to the client's
    // reserve, which carves objects across them. Its pages in the range
    // are this range's to log (LivePages cuts the run to the range).
    for (uint64_t chunk = directory_->RunStart(static_cast<uint32_t>(range.first / kChunkSize));
         chunk * kChunkSize < end;) {
      ChunkRecord record = directory_->PersistedRecord(static_cast<uint32_t>(chunk));
      chunk += record.kind == ChunkKind::kLargeHead ? record.run_chunks : 1;
      if (record.kind == ChunkKind::kFree) continue;
      chunks.push_back(FreshChunk{std::move(record), range.first, end});
    }
  }
  return chunks;
}

absl::Status PersistentHeap::BreakLocked(absl::string_view what) {
  broken_ = absl::DataLossError(
      absl::StrCat("heap ", dir_, " is broken: ", what,
                   "; no sync can commit after this failure (restart heapd to reopen it at epoch ",
                   epoch_, ")"));
  return broken_;
}

absl::Status PersistentHeap::ForgetUndo(ClientId client, uint64_t offset, uint64_t length) {
  absl::Status s = undo_->Forget(client, offset, length);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("heap ", dir_, ": ", s.message()));
}

void PersistentHeap::StoresUnseen(ClientId client) {
  if (undo_ != nullptr) undo_->StoresUnseen(client);
}

absl::StatusOr<UniqueFd> PersistentHeap::OpenUndoJournal(ClientId client) {
  if (undo_ == nullptr) return UniqueFd();
  return undo_->OpenJournal(client);
}

absl::Status PersistentHeap::StageReports(ClientId client, absl::Span<const LeaseReport> reports,
                                          const ReserveReport& reserve) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritableLocked("sync"); !s.ok()) return s;
  // Only chunks the client leases: what it can stage is bounded by them.
  if (absl::Status s = directory_->CheckReport(client, reports); !s.ok()) return s;
  if (absl::Status s = directory_->TellReserve(client, reserve); !s.ok()) return s;
  pending_.Stage(client, reports);
  return absl::OkStatus();
}

absl::StatusOr<SyncResult> PersistentHeap::ReportAndPersist(ClientId client,
                                                            absl::Span<const LeaseReport> last,
                                                            bool release, uint64_t generation,
                                                            const ReserveReport& reserve) {
  absl::MutexLock persist_lock(&persist_mu_);
  SyncResult result;
  Checkpoint checkpoint;
  EpochRecord record;
  const bool full = checkpoint_next_ || store_ == nullptr || store_->CheckpointDue();
  std::vector<LeaseReport> reports;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckWritableLocked("sync"); !s.ok()) return s;
    // The sync's earlier parts, whatever becomes of it: a failed sync is
    // sent again whole.
    reports = pending_.TakeStaged(client, last);
    if (absl::Status s = directory_->CheckReport(client, reports); !s.ok()) return s;
    if (absl::Status s = directory_->CheckReserveReport(client, reserve); !s.ok()) return s;
    // Only persist_mu_ changes epoch_.
    result.epoch = epoch_ + 1;
  }
  // The contents first: the pre-images this epoch makes void, and commit
  // images where others wrote the same pages, apply only with it and only
  // with the generation end that is written last. The reports apply only
  // once that is written: a free (a cleared slot) never commits without
  // the stores that unlinked its object, nor a store without the
  // allocation it points to.
  // With a working image: what the sync logs. Without content tracking,
  // which pages changed is not known: all of them.
  ContentUndo::CommitPages committed;
  committed.all = undo_ == nullptr;
  std::vector<FreshChunk> fresh;  // the records of committed.fresh's chunks
  if (undo_ != nullptr) {
    if (absl::Status s = undo_->PrepareCommit(client, generation, result.epoch,
                                              durable_ != nullptr ? &committed : nullptr);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("sync of heap ", dir_, ": ", s.message()));
    }
  }
  // The sync's commit window (ContentUndo::AsOfCommit) closes once its
  // pages are logged (FlushDataLocked), or however the sync ends before.
  absl::Cleanup end_commit = [this] {
    if (undo_ != nullptr) undo_->EndCommit();
  };
  // On any failure from here on, the changes taken below are still in
  // memory, with the generation end written above; a full checkpoint at the
  // next sync persists both.
  {
    absl::MutexLock lock(&mu_);
    // The client's calls are serialized (see the class comment): nothing
    // ended its leases since the check above. A detach's leases end only
    // once its epoch is durable (below): a chunk it emptied must not be
    // handed out, and written without pre-images, before the stores that
    // unlinked its objects are committed.
    directory_->ApplyReserveReport(client, reserve);
    absl::StatusOr<ReportResult> reported = directory_->Report(client, reports, /*release=*/false);
    if (!reported.ok()) {
      broken_ = absl::InternalError(
          absl::StrCat("heap ", dir_, " is broken: client ", client,
                       "'s leases changed during its sync: ", reported.status().message()));
      return broken_;
    }
    if (!release) directory_->SettleReservedFrees(client);
    result.corrections = std::move(reported->corrections);
    result.rejected_frees = std::move(reported->rejected_frees);
    directory_->Commit(client);
    // Of the memory handed to the session free, what this epoch commits
    // live (the rest is free, its bytes never read): the chunks' records
    // now, their pages below, without the lock.
    if (durable_ != nullptr && !committed.all) fresh = FreshChunksLocked(committed.fresh);
    // What this epoch persists, taken now; later changes go to the next.
    if (full) {
      directory_->TakeDirtyRecords();
      names_.TakeChanges();
      checkpoint.config = config_;
      checkpoint.epoch = result.epoch;
      checkpoint.capacity_chunks = directory_->capacity_chunks();
      checkpoint.chunks = directory_->AllRecords();
      checkpoint.names = names_.List("");
    } else {
      record.epoch = result.epoch;
      record.capacity_chunks = directory_->capacity_chunks();
      record.chunks = directory_->TakeDirtyRecords();
      record.names = names_.TakeChanges();
    }
  }
  if (!fresh.empty()) {
    const std::vector<uint64_t> live = LivePages(fresh);
    std::vector<uint64_t> merged;
    merged.reserve(committed.pages.size() + live.size());
    std::set_union(committed.pages.begin(), committed.pages.end(), live.begin(), live.end(),
                   std::back_inserter(merged));
    committed.pages = std::move(merged);
  }
  // Object contents before metadata: a name must never reach disk before
  // its object.
  if (absl::Status s = FlushDataLocked(result.epoch, std::move(committed.pages), committed.all);
      !s.ok()) {
    checkpoint_next_ = true;
    return s;
  }
  FaultPoint("sync.after_data_flush");
  const absl::Status status =
      full ? store_->WriteCheckpoint(std::move(checkpoint)) : store_->Append(record);
  if (!status.ok()) {
    checkpoint_next_ = true;
    if (durable_ != nullptr) {
      // The redo log holds this epoch's pages, and whether its epoch record
      // is durable is not known: no later epoch may take its number.
      absl::MutexLock lock(&mu_);
      return BreakLocked(absl::StrCat("a sync's epoch record failed after its pages were logged: ",
                                      status.message()));
    }
    return absl::Status(status.code(), absl::StrCat("sync of heap ", dir_, ": ", status.message()));
  }
  checkpoint_next_ = false;
  {
    absl::MutexLock lock(&mu_);
    metadata_log_bytes_ = store_->log_bytes();
    epoch_ = result.epoch;
    last_sync_unix_ns_ = absl::ToUnixNanos(absl::Now());
    if (release) {
      ReclaimResult released = directory_->Release(client);
      std::move(released.rejected_frees.begin(), released.rejected_frees.end(),
                std::back_inserter(result.rejected_frees));
      pending_.SettleFrees(*directory_, client, /*lessee_died=*/false);
    }
    // The client's frees of others' objects go with its stores (the
    // unlinking), which this epoch just committed. Applied only now, so
    // their memory cannot be handed out (as fresh, written without
    // pre-images) before the stores that unlinked it are durable; they
    // persist with the next epoch (a crash before it leaks the objects).
    if (generation != 0 || release)
      pending_.ApplyFrees(*directory_, client, &result.rejected_frees);
  }
  if (undo_ != nullptr) {
    undo_->Committed(result.epoch);
    if (release) undo_->EndSession(client);
  }
  return result;
}

absl::StatusOr<SyncResult> PersistentHeap::Sync(ClientId client,
                                                absl::Span<const LeaseReport> reports,
                                                uint64_t generation, const ReserveReport& reserve) {
  return ReportAndPersist(client, reports, /*release=*/false, generation, reserve);
}

absl::StatusOr<SyncResult> PersistentHeap::Detach(ClientId client,
                                                  absl::Span<const LeaseReport> reports,
                                                  uint64_t generation,
                                                  const ReserveReport& reserve) {
  return ReportAndPersist(client, reports, /*release=*/true, generation, reserve);
}

absl::Status PersistentHeap::ReturnLeases(ClientId client, absl::Span<const LeaseReport> reports) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWritableLocked("return leases"); !s.ok()) return s;
  return directory_->Report(client, reports, /*release=*/true).status();
}

size_t PersistentHeap::LeaseCount(ClientId client) const {
  absl::MutexLock lock(&mu_);
  return directory_->LeaseCount(client);
}

absl::Status PersistentHeap::PersistPendingLocked() {
  if (!checkpoint_next_) return absl::OkStatus();
  Checkpoint checkpoint;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckWritableLocked("persist"); !s.ok()) return s;
    directory_->TakeDirtyRecords();
    names_.TakeChanges();
    checkpoint.config = config_;
    checkpoint.epoch = epoch_ + 1;
    checkpoint.capacity_chunks = directory_->capacity_chunks();
    checkpoint.chunks = directory_->AllRecords();
    checkpoint.names = names_.List("");
  }
  const uint64_t epoch = checkpoint.epoch;
  absl::Status status = FlushDataLocked(epoch, {}, false);
  if (status.ok()) status = store_->WriteCheckpoint(std::move(checkpoint));
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    broken_ = absl::DataLossError(
        absl::StrCat("heap ", dir_,
                     " is broken: a session ended while a failed sync's changes were not "
                     "persisted, and persisting them failed: ",
                     status.message(), " (restart heapd to reopen it at epoch ", epoch_, ")"));
    return broken_;
  }
  checkpoint_next_ = false;
  metadata_log_bytes_ = store_->log_bytes();
  epoch_ = epoch;
  undo_->Committed(epoch);
  return absl::OkStatus();
}

ReclaimResult PersistentHeap::Reclaim(ClientId client) {
  // Contents first, while the dead client's chunks are still its own: no
  // one else is handed them before its pages are back.
  if (undo_ != nullptr) {
    // A sync that failed after applying its reports wrote its generation
    // end for the next epoch: that epoch commits first, or the pages it
    // covers would go back while the reports commit later. If it cannot,
    // the heap is broken (that epoch never commits) and the pages go back
    // as a restart would put them.
    if (checkpoint_next_) {
      absl::MutexLock persist_lock(&persist_mu_);
      (void)PersistPendingLocked();
    }
    undo_->RollBack(client);
  }
  absl::MutexLock lock(&mu_);
  // Its frees go back with its stores; its unfinished sync commits nothing.
  pending_.Drop(client);
  ReclaimResult result = directory_->Reclaim(client);
  pending_.SettleFrees(*directory_, client, /*lessee_died=*/true);
  return result;
}

absl::Status PersistentHeap::WithCommittedState(
    const std::function<absl::Status(const CommittedState&)>& copy) {
  absl::MutexLock persist_lock(&persist_mu_);
  CommittedState state;
  state.config = config_;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckWritableLocked("snapshot"); !s.ok()) return s;
    state.epoch = epoch_;
  }
  // No flush: a copy reads the data through the page cache and makes
  // itself durable (the last sync made the heap's own data durable). Only
  // a data file cut short (by whoever could write it) is mended first.
  {
    absl::MutexLock grow_lock(&grow_mu_);
    if (absl::Status s = RepairDataFileLocked(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("snapshot of heap ", dir_, ": ", s.message()));
    }
  }
  // With a working image the copy reads the data file, brought to the
  // committed epoch: no store made since reaches it.
  if (durable_ != nullptr) {
    if (absl::Status s = durable_->Apply(state.epoch); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("snapshot of heap ", dir_, ": ", s.message()));
    }
  }
  const DataFile& committed = durable_ != nullptr ? durable_->data() : *data_;
  absl::StatusOr<std::map<std::string, std::string>> files = store_->ReadCommittedFiles();
  if (!files.ok()) return files.status();
  state.metadata_files = *std::move(files);
  state.data_fd = committed.fd();
  state.data_bytes = committed.size();
  if (undo_ != nullptr) {
    state.changes = undo_->MarkChanges();
    absl::StrAppend(&state.changes->source, "/", data_file_repairs());
  }
  return copy(state);
}

std::string PersistentHeap::content_rollback_note() const {
  if (read_only()) return "a snapshot attached in place is read-only";
  std::string note = ContentRollbackNote(data_->backing(), options_.track_contents);
  if (!note.empty() && options_.working_image_max_bytes != 0 &&
      config_.max_size > options_.working_image_max_bytes) {
    absl::StrAppend(&note, "; its maximum size, ", config_.max_size,
                    " bytes, is above heapd's per-heap working-image budget of ",
                    options_.working_image_max_bytes, " (--working_image_max_bytes)");
  }
  return note;
}

HeapStats PersistentHeap::Stats() const {
  HeapStats stats;
  stats.content_rollback_note = content_rollback_note();
  stats.content_rollback = undo_ != nullptr;
  stats.undo = recovered_;
  if (undo_ != nullptr) {
    const UndoCounts now = undo_->counts();
    stats.undo.pages_restored += now.pages_restored;
    stats.undo.pages_handed_over += now.pages_handed_over;
    stats.undo.bad_journals += now.bad_journals;
  }
  stats.read_only = read_only();
  stats.data_file_repairs = data_file_repairs_.load(std::memory_order_relaxed);
  stats.backing = durable_ != nullptr ? durable_->data().backing() : data_->backing();
  stats.image = config_.image;
  absl::MutexLock lock(&mu_);
  stats.epoch = epoch_;
  stats.broken = std::string(broken_.message());
  stats.max_size = config_.max_size;
  stats.capacity_bytes = uint64_t{directory_->capacity_chunks()} * kChunkSize;
  stats.directory = directory_->Stats();
  stats.names = names_.size();
  stats.last_sync_unix_ns = last_sync_unix_ns_;
  stats.metadata_log_bytes = metadata_log_bytes_;
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
