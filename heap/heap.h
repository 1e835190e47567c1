// PersistentHeap: one persistent heap, as the daemon serves it. It owns the heap's
// directory (data file, metadata files, lock), the chunk directory and the
// names, and persists them at sync points.
//
// Consistency model (docs/consistency.md): persistent state changes only at
// syncs. Sync makes the data file durable first, then appends one epoch
// record whose fdatasync commits it; Open always lands on the last committed
// epoch. A client's allocations become persistent at its own sync, detach,
// or when it binds a name to them; when a client dies, Reclaim returns its
// leases at their last reported state and frees its uncommitted large runs.
//
// Thread-safe: every call takes the heap's mutex.
#ifndef HEAPD_HEAP_HEAP_H_
#define HEAPD_HEAP_HEAP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/chunk_directory.h"
#include "allocator/lease_types.h"
#include "heap/data_file.h"
#include "heap/metadata_format.h"
#include "heap/metadata_store.h"
#include "heap/name_table.h"

namespace heapd {

struct HeapStats {
  uint64_t epoch = 0;
  uint64_t max_size = 0;
  uint64_t capacity_bytes = 0;   // reserved in the data file
  BackingKind backing = BackingKind::kFile;
  DirectoryStats directory;
  size_t names = 0;
  int64_t last_sync_unix_ns = 0;
  uint64_t metadata_log_bytes = 0;
};

// Tunables of an open heap.
struct HeapOptions {
  // See MetadataStore::kDefaultCheckpointLogBytes.
  uint64_t checkpoint_log_bytes = MetadataStore::kDefaultCheckpointLogBytes;
};

struct SyncResult {
  uint64_t epoch = 0;
  std::vector<LeaseCorrection> corrections;
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

  // Closes without syncing: what was not synced is rolled back on reopen.
  ~PersistentHeap();
  PersistentHeap(const PersistentHeap&) = delete;
  PersistentHeap& operator=(const PersistentHeap&) = delete;

  // Leases up to `count` chunks of `size_class`, growing the data file when
  // none is free. RESOURCE_EXHAUSTED when the heap is at its maximum size or
  // the file system is full.
  absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(ClientId client,
                                                      uint32_t size_class,
                                                      uint32_t count);

  // Allocates a large object (whole chunks) of `size` bytes, growing the
  // data file when needed. RESOURCE_EXHAUSTED as for LeaseChunks.
  absl::StatusOr<uint64_t> AllocateLarge(ClientId client, uint64_t size);

  // Frees objects the client's lease pool does not hold. See
  // ChunkDirectory::Free for validation; all-or-nothing.
  absl::Status Free(ClientId client, absl::Span<const ObjectRef> objects);

  // Binds `entry.name` to the live object at entry.offset (entry.size bytes).
  // ALREADY_EXISTS if taken; INVALID_ARGUMENT for a bad name, type name or
  // size; FAILED_PRECONDITION if the object is not live.
  absl::Status Bind(ClientId client, const NameEntry& entry);
  absl::StatusOr<NameEntry> Lookup(absl::string_view name) const;
  // Removes the name and returns what it bound. NOT_FOUND if not bound.
  absl::StatusOr<NameEntry> Unbind(absl::string_view name);
  std::vector<NameEntry> ListNames(absl::string_view prefix, size_t limit = 0) const;

  // Records the client's lease reports, commits its large allocations and
  // persists a new epoch. On an I/O error nothing is lost in memory and the
  // next sync writes a full checkpoint.
  absl::StatusOr<SyncResult> Sync(ClientId client, absl::Span<const LeaseReport> reports);

  // Ends a client's session cleanly: returns its leases with `reports`,
  // commits and persists (a detach).
  absl::StatusOr<SyncResult> Detach(ClientId client, absl::Span<const LeaseReport> reports);

  // Ends the client's leases of the reported chunks (it returns them with
  // their bitmaps), without persisting. All-or-nothing as Sync's reports.
  absl::Status ReturnLeases(ClientId client, absl::Span<const LeaseReport> reports);

  // Chunks `client` leases now.
  size_t LeaseCount(ClientId client) const;

  // Ends a dead client's session: leases back at their last reported state,
  // uncommitted large runs freed. Not persisted until the next sync.
  ReclaimResult Reclaim(ClientId client);

  // Runs `copy(dir, data_fd, epoch)` with the heap's files at rest: the
  // data file made durable first, and no sync, checkpoint or other metadata
  // write until `copy` returns, so the metadata files in `dir` are exactly
  // those of committed epoch `epoch`. (Clients may still store into their
  // objects through their mappings; the caller arranges quiet.)
  absl::Status WithFilesAtRest(
      const std::function<absl::Status(const std::string& dir, int data_fd, uint64_t epoch)>&
          copy);

  HeapStats Stats() const;
  absl::Status CheckInvariants() const;

  // The chunk records a crash now would recover (used chunks only, empty
  // small chunks left out), in chunk order.
  std::vector<ChunkRecord> PersistedChunks() const;

  const std::string& dir() const { return dir_; }
  const HeapConfig& config() const { return config_; }
  int data_fd() const { return data_->fd(); }
  // Opens the data file anew (read-only unless `writable`) for a client;
  // the caller owns the fd.
  absl::StatusOr<int> OpenDataFile(bool writable) const;
  uint64_t capacity_bytes() const;
  uint64_t epoch() const;

 private:
  PersistentHeap(std::string dir, HeapConfig config, int lock_fd)
      : dir_(std::move(dir)), config_(config), lock_fd_(lock_fd) {}

  // Grows the data file by at least `chunks` chunks.
  absl::Status GrowLocked(uint32_t chunks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync and Detach: record the reports (ending the leases with `release`),
  // commit the client's large runs, persist an epoch.
  absl::StatusOr<SyncResult> ReportAndPersist(ClientId client,
                                              absl::Span<const LeaseReport> reports,
                                              bool release);
  uint64_t max_chunks() const { return config_.max_size / kChunkSize; }

  const std::string dir_;
  const HeapConfig config_;
  const int lock_fd_;
  mutable absl::Mutex mu_;
  std::unique_ptr<DataFile> data_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<MetadataStore> store_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ChunkDirectory> directory_ ABSL_GUARDED_BY(mu_);
  NameTable names_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_sync_unix_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool checkpoint_next_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_HEAP_H_
