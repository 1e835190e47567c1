// SnapshotStore: heapd's snapshots — create, list, verify, remove, restore,
// open in place — in heapd's own snapshot directory or in a directory a
// caller names (on the parallel file system, say).
//
// The rule (docs/security.md): heapd never resolves a path a user controls.
//   - A caller-named directory is worked in by a RunAs helper with the
//     caller's uid, gid and groups (util/run_as.h): the kernel grants
//     exactly the caller's rights, so a symlink, a swapped directory or a
//     sticky directory gains the caller nothing. Snapshots made there belong
//     to the caller because a process with the caller's ids made them.
//   - heapd's own directory (root's, mode 0700, nobody else writes in it)
//     is worked in directly, relative to a descriptor opened once. Who may
//     use a snapshot there is decided from its manifest (who made it, the
//     source heap's owner, group and mode).
// Either way nothing read from a snapshot is trusted (snapshot_format.h):
// files are opened without following symlinks, must be regular files, are
// size-capped before they are read and checked before they are used.
//
// Creation copies the heap's committed epoch (PersistentHeap::
// WithCommittedState: syncs wait, leases and lookups do not), builds the
// snapshot under a hidden name beside its final one, fsyncs every file and
// the directory, renames it into place with RENAME_NOREPLACE and fsyncs the
// target: a failed or killed creation leaves no snapshot, and its hidden
// leftovers are removed by the next creation of that name.
//
// Thread-safe; calls run in parallel.
#ifndef HEAPD_SNAPSHOT_SNAPSHOT_STORE_H_
#define HEAPD_SNAPSHOT_SNAPSHOT_STORE_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "heap/heap.h"
#include "heap/heap_dir.h"
#include "proto/heapd.pb.h"
#include "snapshot/file_copy.h"
#include "snapshot/snapshot_format.h"
#include "util/run_as.h"
#include "util/unique_fd.h"

namespace heapd {

// Who asks, as the daemon knows them.
struct SnapshotCaller {
  Credentials credentials;
  bool admin = false;
  // True once the caller went away (its call was cancelled): work for it
  // stops. Empty: never.
  std::function<bool()> cancelled;
};

// Where a snapshot is: `target_dir` empty means heapd's own directory.
struct SnapshotRef {
  std::string target_dir;
  std::string name;
};

struct SnapshotStoreOptions {
  // Longest any one operation in a caller's directory may take.
  absl::Duration timeout = absl::Minutes(30);
  // Readable when heapd stops: helpers are killed (util/run_as.h).
  int cancel_fd = -1;
  // Bytes of snapshots (their data files' sizes) one user may keep in
  // heapd's own directory; 0: no limit.
  uint64_t max_bytes_per_user = 0;
  // Bytes read from snapshots (manifests, metadata) by all calls at once:
  // the memory heapd gives to reading snapshots.
  uint64_t max_reading_bytes = uint64_t{2} << 30;
};

// A heap directory built from a snapshot under a hidden name in heapd's
// heap directory, with the restored heap's settings (its owner, mode and
// maximum size); removed unless committed.
class RestoredHeapDir {
 public:
  RestoredHeapDir(std::unique_ptr<HeapDirBuilder> dir, const HeapConfig& config)
      : dir_(std::move(dir)), config_(config) {}

  // Renames it to `name` (never replacing it: ALREADY_EXISTS) durably.
  absl::Status Commit(const std::string& name) { return dir_->Commit(name); }
  const HeapConfig& config() const { return config_; }

 private:
  const std::unique_ptr<HeapDirBuilder> dir_;
  const HeapConfig config_;
};

// How a restored heap is owned.
struct RestoreOptions {
  // Owner of the new heap: the caller, unless an admin keeps the
  // snapshot's recorded owner, group and mode.
  uint32_t owner_uid = 0;
  uint32_t owner_gid = 0;
  bool keep_recorded_owner = false;
  // The largest data file (and maximum size) the new heap may have.
  uint64_t max_bytes = kMaxHeapBytes;
  // The most names the new heap may have (--max_names_per_heap); 0: any.
  uint64_t max_names = 0;
};

class SnapshotStore {
 public:
  // `own_dir` (created 0700 if missing) holds heapd's own snapshots;
  // `heapd_dirs` (the state directory, which contains it, and the storage
  // tiers' roots, which hold the heaps) are never a target, nor anything
  // beneath them.
  // FAILED_PRECONDITION if `own_dir` is not a directory of this process's
  // user that no one else may write.
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(
      const std::string& own_dir, const std::vector<std::string>& heapd_dirs,
      SnapshotStoreOptions options);

  // Snapshots `heap` (served as `heap_name`, described by `source`) as
  // `ref`, with `labels`. ALREADY_EXISTS if it exists, RESOURCE_EXHAUSTED if
  // the target is full or (own directory) the caller's bytes limit is
  // reached, PERMISSION_DENIED if the caller may not write the target. The
  // returned manifest also says how the data was copied and how many bytes.
  absl::StatusOr<v1::SnapshotManifest> Create(const SnapshotCaller& caller, PersistentHeap& heap,
                                              const std::string& heap_name,
                                              const v1::HeapInfo& source, const SnapshotRef& ref,
                                              const std::map<std::string, std::string>& labels);

  // The snapshots in `target_dir` the caller may see, by name. Entries
  // with no manifest are not snapshots and left out; in a caller's
  // directory, those the caller cannot read or that are damaged are named
  // in `skipped` (in heapd's own, other users' snapshots are not theirs to
  // see).
  absl::StatusOr<v1::ListSnapshotsResponse> List(const SnapshotCaller& caller,
                                                 const std::string& target_dir);

  // Reads and checks every file of the snapshot, whose data may have at
  // most `max_bytes`. DATA_LOSS naming what is wrong; NOT_FOUND;
  // PERMISSION_DENIED; RESOURCE_EXHAUSTED.
  absl::StatusOr<v1::SnapshotManifest> Verify(const SnapshotCaller& caller, const SnapshotRef& ref,
                                              uint64_t max_bytes);

  // Removes the snapshot (renamed away first, then deleted; the target
  // fsynced). In heapd's own directory: its maker, the source heap's owner
  // or an admin.
  absl::Status Remove(const SnapshotCaller& caller, const SnapshotRef& ref);

  // Builds a heap directory in `heaps_dir` (heapd's own) from the snapshot, checked
  // whole first: data cloned or copied (never more than options.max_bytes),
  // metadata rewritten by heapd with the new owner, the data file reserved.
  // `heap_name` names the heap in errors and in the hidden name.
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> Restore(
      const SnapshotCaller& caller, const SnapshotRef& ref, const std::string& heaps_dir,
      const std::string& heap_name, const RestoreOptions& options, v1::SnapshotManifest* manifest);

  // The snapshot as a read-only heap, checked whole, with its data file
  // opened by the caller (or heapd, in its own directory), of at most
  // `max_bytes` and `max_names` names (0: any).
  absl::StatusOr<std::unique_ptr<PersistentHeap>> OpenInPlace(const SnapshotCaller& caller,
                                                              const SnapshotRef& ref,
                                                              uint64_t max_bytes,
                                                              uint64_t max_names,
                                                              v1::SnapshotManifest* manifest);

  // What a restore read, for RestoreWith to check and finish.
  struct RestoreSource {
    std::string manifest_json;
    std::map<std::string, std::string> metadata_files;
    uint64_t data_bytes = 0;  // as reported; the data file itself is checked
    CopyResult copied;
  };
  // Fills the new heap's data file `data_fd` and returns the rest.
  using Filler = std::function<absl::StatusOr<RestoreSource>(int data_fd)>;
  // Restore's work for any source (`where` names it in errors; `own_dir`:
  // in heapd's own directory, so access is checked from its manifest).
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> RestoreWith(
      const SnapshotCaller& caller, const std::string& where, bool own_dir, const Filler& fill,
      const std::string& heaps_dir, const std::string& heap_name, const RestoreOptions& options,
      v1::SnapshotManifest* manifest);

  // Runs `job` with `args` and the lent `fds` in the directory
  // `target_dir`: in a RunAs helper as the caller (the path resolved by the
  // helper, never inside heapd's own directories), or here in heapd's own
  // directory if empty. Replies are bounded by `max_reply_bytes` and
  // heapd's reading budget.
  absl::StatusOr<std::vector<ChildMessage>> RunIn(const SnapshotCaller& caller,
                                                  const std::string& target_dir,
                                                  const RunAsJob& job, const std::string& args,
                                                  const std::vector<int>& fds,
                                                  const std::string& what,
                                                  uint64_t max_reply_bytes = 0);

  // Counts `bytes` heapd holds of what it read for a caller against the
  // reading budget (--max_snapshot_reading_bytes) until destroyed;
  // RESOURCE_EXHAUSTED naming `what` if they would pass it.
  class ReadingCharge {
   public:
    ReadingCharge(ReadingCharge&& other) noexcept
        : budget_(std::exchange(other.budget_, nullptr)), bytes_(other.bytes_) {}
    ReadingCharge& operator=(ReadingCharge&&) = delete;
    ~ReadingCharge() {
      if (budget_ != nullptr) budget_->used.fetch_sub(bytes_);
    }

   private:
    friend class SnapshotStore;
    ReadingCharge(RunAsOptions::Budget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    RunAsOptions::Budget* budget_;
    uint64_t bytes_;
  };
  absl::StatusOr<ReadingCharge> ChargeReading(uint64_t bytes, const std::string& what);

  const std::string& own_dir() const { return own_dir_; }

 private:
  SnapshotStore(std::string own_dir, UniqueFd own_fd,
                std::vector<std::pair<dev_t, ino_t>> heapd_dirs, SnapshotStoreOptions options)
      : own_dir_(std::move(own_dir)),
        own_fd_(std::move(own_fd)),
        heapd_dirs_(std::move(heapd_dirs)),
        options_(options) {
    reading_budget_.limit = options.max_reading_bytes;
  }

  struct Read;  // what was read of one snapshot
  // Reads the snapshot `ref`; copies its data into `copy_to` if not -1,
  // else, with `want_fd`, hands back its data fd.
  absl::StatusOr<Read> ReadSnapshot(const SnapshotCaller& caller, const SnapshotRef& ref,
                                    int copy_to, bool want_fd, uint64_t max_bytes);
  // PERMISSION_DENIED unless the caller may read (or, with `remove`,
  // remove) the snapshot of `manifest` in heapd's own directory.
  absl::Status CheckOwnAccess(const SnapshotCaller& caller, const v1::SnapshotManifest& manifest,
                              bool remove) const;
  // Bytes of `uid`'s snapshots in heapd's own directory.
  absl::StatusOr<uint64_t> OwnBytesOf(uint32_t uid);
  static std::string Where(const SnapshotRef& ref);

  const std::string own_dir_;
  const UniqueFd own_fd_;
  const std::vector<std::pair<dev_t, ino_t>> heapd_dirs_;  // never a target
  const SnapshotStoreOptions options_;
  RunAsOptions::Budget reading_budget_;
  // Bytes of snapshots being made in heapd's own directory, by uid: counted
  // with those kept, so calls at once cannot pass a user's limit together.
  absl::Mutex own_mu_;
  std::map<uint32_t, uint64_t> own_pending_ ABSL_GUARDED_BY(own_mu_);
};

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_SNAPSHOT_STORE_H_
