// PersistentHeap: one persistent heap, as the daemon serves it. It owns the
// heap's directory (data file, metadata files, lock), the chunk directory
// and the names, and persists them at sync points.
//
// Consistency model (docs/consistency.md): persistent state changes only at
// syncs. Sync makes the data file durable first, then appends one epoch
// record whose fdatasync commits it; Open always lands on the last committed
// epoch. A client's allocations become persistent at its own sync, detach,
// or when it binds a name to them; when a client dies, Reclaim returns its
// leases at their last reported state and frees its uncommitted large runs.
//
// A heap with a working image (HeapConfig::image, heap/durable_image.h):
// clients map a copy of the data in memory; a sync logs the pages it
// commits (the session's pre-imaged pages, memory handed to it free,
// pages handed over to it) to the redo log, durable, instead of flushing
// the data file; the log is applied to the data file later. Open loads the
// working image from the data file at the committed epoch.
//
// A heap whose data file failed to flush is broken: after a failed
// fdatasync the kernel may have dropped the pages it could not write, so no
// later sync may commit on top of them. Every later sync and allocation
// fails naming why; reopening (a restart of heapd) brings the heap back at
// its last committed epoch.
//
// Locks, in the order they are taken (docs/architecture.md):
//   persist_mu_  one sync or snapshot capture at a time; held across the
//                data file's fdatasync, the metadata writes and a
//                snapshot's copy;
//   grow_mu_     one growth at a time; held across fallocate;
//   mu_          the chunk directory and names; never held across I/O, so
//                leases, frees and lookups never wait behind a flush, a copy
//                or a fallocate.
//
// Thread-safe; the calls made for one client are serialized by the caller
// (daemon/sessions.h holds the session's lock across each).
#ifndef HEAPD_HEAP_HEAP_H_
#define HEAPD_HEAP_HEAP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/chunk_directory.h"
#include "allocator/lease_types.h"
#include "heap/content_undo.h"
#include "heap/data_file.h"
#include "heap/durable_image.h"
#include "heap/grow_ahead.h"
#include "heap/metadata_format.h"
#include "heap/metadata_store.h"
#include "heap/name_table.h"
#include "heap/pending_syncs.h"
#include "util/unique_fd.h"

namespace heapd {

struct HeapStats {
  uint64_t epoch = 0;
  bool read_only = false;          // a snapshot opened in place
  std::string broken;              // why the heap is broken; empty if it is not
  uint64_t data_file_repairs = 0;  // times a client's truncation was undone
  uint64_t max_size = 0;
  uint64_t capacity_bytes = 0;  // reserved in the data file
  BackingKind backing = BackingKind::kFile;
  DirectoryStats directory;
  size_t names = 0;
  int64_t last_sync_unix_ns = 0;
  uint64_t metadata_log_bytes = 0;
  // Object contents go back to the last sync after a crash (ContentUndo);
  // false: the backing or configuration cannot keep that (why: below).
  bool content_rollback = false;
  std::string content_rollback_note;
  UndoCounts undo;
  ImageMode image = ImageMode::kDirect;
};

// Tunables of an open heap.
struct HeapOptions {
  // See MetadataStore::kDefaultCheckpointLogBytes.
  uint64_t checkpoint_log_bytes = MetadataStore::kDefaultCheckpointLogBytes;
  // Most names the heap holds; 0: no limit.
  uint64_t max_names = 0;
  // On tmpfs a heap's pages are the node's memory: growth is refused when
  // it would leave less than this much of MemAvailable; 0: no check.
  uint64_t tmpfs_reserve_bytes = 0;
  // Keep object contents' pre-images so they go back to the last sync
  // after a crash (heap/content_undo.h); only where the backing lets
  // clients take them (tmpfs: see ContentRollbackNote).
  bool track_contents = true;
  // Grow the data file in the background when a lease or large run leaves
  // fewer than a sixteenth of the heap's chunks free, so that allocation
  // seldom waits for fallocate (which on tmpfs allocates and zeroes every
  // page). Chunks are still handed out only after Grow reserved them.
  bool grow_ahead = false;
  // Heaps with a working image: the room of each new redo log (of two;
  // each grows to the largest sync it takes).
  uint64_t redo_log_bytes = uint64_t{16} << 20;
  // New heaps on a block file system or fs-dax get a working image, where
  // contents track (ImageModeFor); false: their clients map the data file.
  bool working_images = true;
  // The per-heap memory budget of working images: a new heap whose
  // maximum size is above it is direct by default (its working image,
  // which grows to the heap's size, could not be kept in memory); 0: none.
  uint64_t working_image_max_bytes = 0;
};

// The image a new heap of at most `max_size` bytes in the directory
// `parent` gets: a working image where the heap's contents could not roll
// back otherwise (not on tmpfs; content tracking on;
// options.working_images) and the heap fits options.working_image_max_bytes,
// else direct.
ImageMode ImageModeFor(const std::string& parent, const HeapOptions& options,
                       uint64_t max_size = 0);

// Why a heap on `backing` cannot roll object contents back; empty if it
// can (tmpfs: clients write-protect its pages with userfaultfd).
std::string ContentRollbackNote(BackingKind backing, bool track_contents);

// OK if `bytes` more of tmpfs leave at least `reserve` bytes of the node's
// MemAvailable (/proc/meminfo); RESOURCE_EXHAUSTED naming both numbers.
absl::Status CheckMemoryForTmpfs(uint64_t bytes, uint64_t reserve, const std::string& heap);

// A heap's committed epoch, captured for a snapshot with the heap's files at
// rest (see WithCommittedState).
struct CommittedState {
  uint64_t epoch = 0;
  HeapConfig config;
  // The metadata files of `epoch` by name ("checkpoint", "log.G").
  std::map<std::string, std::string> metadata_files;
  int data_fd = -1;         // the data file, owned by the heap
  uint64_t data_bytes = 0;  // its size
  // Heaps that track contents: a mark taken now (ContentUndo::MarkChanges;
  // its source also names the data file's repairs, which no record shows).
  std::optional<ChunkChanges> changes;
};

// AllocateLarge (as a run) or, with `reserve`, ReserveLarge of between
// `min_size` (0: `size`) and `size` bytes, in whole chunks: what the
// AllocateLarge call does, through heapd or in process.
class PersistentHeap;
absl::StatusOr<LargePlacement> AllocateOrReserve(PersistentHeap& heap, ClientId client,
                                                 uint64_t size, bool reserve, uint64_t min_size);

// OK if `config` may describe a heap: max_size a positive multiple of 2 MiB
// up to kMaxHeapBytes, mode within 0777. INVALID_ARGUMENT saying which.
absl::Status ValidateHeapConfig(const HeapConfig& config);

// A chunk of memory a session was handed free (`record` as the directory
// would persist it), within that memory's range [begin, end).
struct FreshChunk {
  ChunkRecord record;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SyncResult {
  uint64_t epoch = 0;
  std::vector<LeaseCorrection> corrections;
  // Frees by this client that the lessee of their chunk showed wrong
  // (ChunkDirectory::Report).
  std::vector<std::string> rejected_frees;
};

class PersistentHeap {
 public:
  // Creates a heap in the new directory `dir` (made atomically: a crash
  // leaves no half-made heap there). ALREADY_EXISTS if `dir` exists.
  // config.max_size must be a positive multiple of 2 MiB.
  static absl::StatusOr<std::unique_ptr<PersistentHeap>> Create(const std::string& dir,
                                                                HeapConfig config,
                                                                HeapOptions options = {});

  // Opens the heap in `dir` at its last committed epoch. FAILED_PRECONDITION
  // if another process has it open; DATA_LOSS naming the file if its
  // metadata is corrupt.
  static absl::StatusOr<std::unique_ptr<PersistentHeap>> Open(const std::string& dir,
                                                              HeapOptions options = {});

  // A read-only heap over a snapshot: its recovered metadata and its data
  // file `data` (a regular file, read-only), with no directory of its own.
  // Every call that would change it fails with FAILED_PRECONDITION.
  // DATA_LOSS if `metadata` does not fit `data` (ValidateState).
  static absl::StatusOr<std::unique_ptr<PersistentHeap>> OpenSnapshot(
      const std::string& label, UniqueFd data, const RecoveredMetadata& metadata);

  // OK if `metadata` describes a heap whose data file has `data_bytes`
  // bytes: a valid config, the capacity within the file and the maximum
  // size, chunk records that rebuild a consistent directory, names that
  // bind live objects. DATA_LOSS naming `label` and what is wrong.
  static absl::Status ValidateState(const std::string& label, const Checkpoint& metadata,
                                    uint64_t data_bytes);

  // Closes without syncing: what was not synced is rolled back on reopen.
  ~PersistentHeap();
  PersistentHeap(const PersistentHeap&) = delete;
  PersistentHeap& operator=(const PersistentHeap&) = delete;

  // Leases up to `count` chunks of `size_class`, growing the data file when
  // none is free; first those of `reuse` the client may take back as this
  // class (ChunkDirectory::Reclass). RESOURCE_EXHAUSTED when the heap is at
  // its maximum size or the file system is full.
  absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(ClientId client, uint32_t size_class,
                                                      uint32_t count,
                                                      absl::Span<const uint32_t> reuse = {});
  // LeaseChunks for each of `wants`, all or none: when a want fails, the
  // chunks the earlier ones leased go back, and its error is returned. Not
  // those that were the client's before the call (taken back through a
  // want's `reuse`): they stay so, in their new class (a client that saw
  // the call fail holds them in doubt and offers them again), as when a
  // call of one want fails.
  absl::StatusOr<std::vector<LeaseGrant>> LeaseAll(ClientId client,
                                                   absl::Span<const LeaseWant> wants);

  // Allocates a large object (whole chunks) of `size` bytes, growing the
  // data file when needed. RESOURCE_EXHAUSTED as for LeaseChunks.
  absl::StatusOr<uint64_t> AllocateLarge(ClientId client, uint64_t size);
  // Reserves chunks for the client to carve large objects from
  // (ChunkDirectory::Reserve: the longest free run of at most `most`
  // chunks, at least `min_chunks`), told of with its syncs (ReserveReport).
  // With no such run, grows the data file by `most` first (by
  // `min_chunks` past half the heap's maximum size).
  // RESOURCE_EXHAUSTED as for LeaseChunks.
  absl::StatusOr<LargePlacement> ReserveLarge(ClientId client, uint32_t min_chunks, uint32_t most);

  // Frees objects the client's lease pool does not hold. See
  // ChunkDirectory::Free for validation; all-or-nothing. On a heap whose
  // contents roll back, the frees are checked now and applied at the
  // client's next sync (dropped if it dies first): a free belongs to the
  // same unit as the client's stores — the pointer it cleared goes back
  // with its death, so must the free.
  absl::Status Free(ClientId client, absl::Span<const ObjectRef> objects);

  // Binds `entry.name` to the live object at entry.offset (entry.size bytes).
  // ALREADY_EXISTS if taken; INVALID_ARGUMENT for a bad name, type name or
  // size; FAILED_PRECONDITION if the object is not live.
  absl::Status Bind(ClientId client, const NameEntry& entry);
  absl::StatusOr<NameEntry> Lookup(absl::string_view name) const;
  // Removes the name and returns what it bound. NOT_FOUND if not bound.
  absl::StatusOr<NameEntry> Unbind(absl::string_view name);
  std::vector<NameEntry> ListNames(absl::string_view prefix, size_t limit = 0) const;

  // A sync's reports may come in parts: StageReports holds an earlier
  // part's (checked as Sync would) until the last part, Sync or Detach,
  // applies them with its own, so that one sync commits in one epoch (a
  // cleared slot never commits before the stores that unlinked its object).
  // A chunk staged again replaces its earlier report; a client that dies
  // first commits none of them. `reserve`: what the client tells of its
  // reserved chunks, taken now (ChunkDirectory::TellReserve; the objects
  // it placed commit with the sync's last part, as large allocations do).
  absl::Status StageReports(ClientId client, absl::Span<const LeaseReport> reports,
                            const ReserveReport& reserve = {});

  // Records the client's lease reports (with those staged) and `reserve`
  // (see StageReports), commits its large allocations and persists a new
  // epoch. On an I/O error nothing is
  // lost in memory and the next sync writes a full checkpoint.
  // `generation`: the client's content generations up to this one are
  // committed with it (ContentUndo; 0: none).
  absl::StatusOr<SyncResult> Sync(ClientId client, absl::Span<const LeaseReport> reports,
                                  uint64_t generation = 0, const ReserveReport& reserve = {});

  // Ends a client's session cleanly: returns its leases with `reports` (and
  // those staged), commits and persists (a detach).
  absl::StatusOr<SyncResult> Detach(ClientId client, absl::Span<const LeaseReport> reports,
                                    uint64_t generation = 0, const ReserveReport& reserve = {});

  // The content undo journal of a new read-write session, for its client;
  // an invalid fd if this heap does not roll contents back.
  absl::StatusOr<UniqueFd> OpenUndoJournal(ClientId client);
  // The client's tracker let stores through without pre-images
  // (ContentUndo::StoresUnseen); nothing if contents are not tracked.
  void StoresUnseen(ClientId client);
  bool content_rollback() const { return undo_ != nullptr; }
  // Why not, when content_rollback() is false.
  std::string content_rollback_note() const;

  // Ends the client's leases of the reported chunks (it returns them with
  // their bitmaps), without persisting. All-or-nothing as Sync's reports.
  absl::Status ReturnLeases(ClientId client, absl::Span<const LeaseReport> reports);

  // Chunks `client` leases now.
  size_t LeaseCount(ClientId client) const;

  // Ends a dead client's session: the pages it wrote since its last sync go
  // back (ContentUndo::RollBack), then its leases back at their last
  // reported state, uncommitted large runs freed. Not persisted until the
  // next sync; but first, what a sync that failed after applying its
  // reports left in memory is persisted (else the heap breaks), so that no
  // page goes back under reports that commit later.
  ReclaimResult Reclaim(ClientId client);

  // Runs `copy(state)` with the heap's files at rest: no sync until `copy`
  // returns (the data file is not flushed: a copy reads it through the page
  // cache and makes itself durable), so the data file holds
  // what the committed epoch's metadata describes. Allocation, frees and
  // lookups go on meanwhile (they change nothing persistent). (Clients may
  // still store into their objects through their mappings; the caller
  // arranges quiet.)
  absl::Status WithCommittedState(const std::function<absl::Status(const CommittedState&)>& copy);

  // Why the heap is broken (see above); OK if it is not.
  absl::Status broken() const;
  // Takes the heap out of use once its directory was renamed away (heapd
  // removing or replacing it): waits for a sync or snapshot under way, and
  // refuses every later one (NOT_FOUND): the heap's files go with the
  // directory (reached through its descriptor), and a snapshot of a heap
  // being deleted would copy files as they are removed. Also stops growth
  // ahead (waiting for one under way), so that whichever thread closes the
  // heap later waits for nothing.
  void MarkRemoved();
  // Times the data file was put back to its size (a client truncated or
  // extended it); thread-safe.
  uint64_t data_file_repairs() const { return data_file_repairs_.load(std::memory_order_relaxed); }

  HeapStats Stats() const;
  absl::Status CheckInvariants() const;

  // The chunk records a crash now would recover (used chunks only, empty
  // small chunks left out), in chunk order.
  std::vector<ChunkRecord> PersistedChunks() const;

  // The heap's directory; empty for a snapshot opened in place.
  const std::string& dir() const { return dir_; }
  const HeapConfig& config() const { return config_; }
  bool read_only() const { return store_ == nullptr; }
  int data_fd() const { return data_->fd(); }
  // Opens what clients map anew (read-only unless `writable`): the data
  // file, or the working image; the caller owns the fd.
  absl::StatusOr<int> OpenDataFile(bool writable) const;
  // Within WithCommittedState's `copy`: a read-only fd of the data as the
  // committed epoch left it (the data file, the redo log applied; or what
  // clients map, on heaps without a working image). The caller owns it.
  absl::StatusOr<int> OpenCommittedData() const;
  uint64_t capacity_bytes() const;
  uint64_t epoch() const;

 private:
  PersistentHeap(std::string dir, HeapConfig config, HeapOptions options);

  // Builds the chunk directory and names from `state`, checked against a
  // data file of `data_bytes` bytes. DATA_LOSS naming `label`.
  absl::Status LoadLocked(const std::string& label, const Checkpoint& state, uint64_t data_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `take` under mu_ until it finds a run, growing the data file by
  // `grow_chunks` (or `grow_least` where that does not fit) while it
  // answers RESOURCE_EXHAUSTED (a few times at most); the run is fresh
  // memory for `client` (ForgetUndo).
  absl::StatusOr<LargePlacement> TakeRun(
      ClientId client, uint32_t grow_least, uint32_t grow_chunks,
      const std::function<absl::StatusOr<LargePlacement>()>& take) ABSL_LOCKS_EXCLUDED(mu_);
  // Grows the data file by at least `chunks` chunks, unless the capacity is
  // no longer `capacity_seen` (another thread grew it meanwhile).
  absl::Status Grow(uint32_t chunks, uint32_t capacity_seen) ABSL_LOCKS_EXCLUDED(mu_);
  // Undoes a client's ftruncate or extension of the data file (it holds a
  // writable fd): the file is put back to the size heapd reserved.
  absl::Status RepairDataFileLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(grow_mu_);
  // Fails unless the heap may change: not read-only, not broken.
  absl::Status CheckWritableLocked(const char* what) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Flushes the data file (repaired first); a failure breaks the heap.
  // With a working image: logs `pages` as `epoch`'s instead (all of them
  // if `all_pages`); any failure breaks the heap.
  absl::Status FlushDataLocked(uint64_t epoch, std::vector<uint64_t> pages, bool all_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  // The chunks of `ranges` ((offset, length) each) that hold objects, as
  // the directory would persist them now (a large run once, by its head).
  std::vector<FreshChunk> FreshChunksLocked(
      const std::vector<std::pair<uint64_t, uint64_t>>& ranges) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Breaks the heap (see above): `what` failed. Returns the error.
  absl::Status BreakLocked(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync and Detach: record the reports, staged and `last` (ending the
  // leases with `release`), commit the client's large runs, persist an
  // epoch.
  absl::StatusOr<SyncResult> ReportAndPersist(ClientId client, absl::Span<const LeaseReport> last,
                                              bool release, uint64_t generation,
                                              const ReserveReport& reserve);
  // With content rollback: persists, in a full checkpoint, what a sync
  // that failed after applying its reports left in memory (see Reclaim);
  // a failure breaks the heap.
  absl::Status PersistPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  // Fresh memory handed out: no pre-image may put its pages back.
  absl::Status ForgetUndo(ClientId client, uint64_t offset, uint64_t length);
  uint64_t max_chunks() const { return config_.max_size / kChunkSize; }
  // True if a growth ahead of demand is due (options_.grow_ahead): the
  // heap can grow and fewer than a sixteenth of its chunks are free.
  bool GrowAheadDueLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  const std::string dir_;
  const HeapConfig config_;
  const HeapOptions options_;
  // The heap's directory, opened once: its files are reached through it
  // (content undo's journals through undo/, opened through it once). None
  // for a snapshot.
  UniqueFd dir_fd_;
  UniqueFd lock_fd_;  // flocked while the heap is open; none for a snapshot
  // What clients map: the data file, or the working image. Set at open;
  // the file's size under grow_mu_.
  std::unique_ptr<DataFile> data_;
  // With a working image: the data file and the redo log (its log under
  // persist_mu_, its size under grow_mu_); null otherwise.
  std::unique_ptr<DurableImage> durable_;

  mutable absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(grow_mu_, mu_);
  std::unique_ptr<MetadataStore> store_ ABSL_PT_GUARDED_BY(persist_mu_);  // null: read-only
  // A sync failed after applying its reports: the next persist writes a
  // full checkpoint, and Reclaim persists first (see there). Written under
  // persist_mu_; Reclaim reads it without, to take that lock only then.
  std::atomic<bool> checkpoint_next_{false};

  mutable absl::Mutex grow_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  std::unique_ptr<ChunkDirectory> directory_ ABSL_PT_GUARDED_BY(mu_);
  NameTable names_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_sync_unix_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t metadata_log_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> data_file_repairs_{0};
  // Staged reports and deferred frees (see StageReports and Free).
  PendingSyncs pending_ ABSL_GUARDED_BY(mu_);
  // Set at open on a tracked heap; its own lock, taken under persist_mu_
  // (never under mu_ or grow_mu_).
  std::unique_ptr<ContentUndo> undo_;
  UndoCounts recovered_;  // pages put back when the heap opened

  // Growth ahead of demand (options_.grow_ahead); stopped by the
  // destructor and MarkRemoved before anything it uses goes.
  GrowAhead grow_ahead_;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_HEAP_H_
