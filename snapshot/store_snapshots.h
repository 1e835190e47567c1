// StoreSnapshots: heapd's incremental, deduplicated snapshots in snapshot
// stores — directories a caller names (the parallel file system
// in production), shared by the heapds of many nodes. Layout and formats:
// snapshot/store_recipe.h, snapshot/block_store.h; the work inside a store
// and its crash and gc rules: snapshot/version_store.h.
//
// Security (docs/security.md): every operation in a store runs in a RunAs
// helper with the caller's uid, gid and groups (SnapshotStore::RunIn), so
// the store is written and read with exactly the caller's rights; heapd
// never resolves the path. What comes back is checked here: recipes are
// size-capped and decoded with checks, manifests parsed as any snapshot's,
// metadata checked whole (VerifySnapshotFiles) and every block's hash is
// checked by whoever reads it (the helper as it fetches; heapd again before
// a block enters the node's cache).
//
// The node-local tier: heapd keeps a cache of blocks in its own directory
// (root's, 0700, bounded by cache_bytes, oldest dropped first), filled by
// restores with blocks heapd hashed itself, one part per uid (a user's
// restore is served only blocks that user's restores fetched: knowing a
// block's hash gives no one its bytes); a restore reads from the store only
// the blocks the cache lacks.
//
// Thread-safe; calls run in parallel.
#ifndef HEAPD_SNAPSHOT_STORE_SNAPSHOTS_H_
#define HEAPD_SNAPSHOT_STORE_SNAPSHOTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "heap/heap.h"
#include "proto/heapd.pb.h"
#include "snapshot/block_store.h"
#include "snapshot/snapshot_store.h"
#include "snapshot/store_recipe.h"
#include "snapshot/version_store.h"
#include "util/unique_fd.h"

namespace heapd {

struct StoreSnapshotsOptions {
  std::string node;  // this node's name in the parts it stores
  uint32_t block_bytes = kDefaultBlockBytes;
  int zstd_level = 1;
  bool deltas = true;  // PartSource::deltas
  int threads = 2;     // a create's workers (hashing and compressing)
  // heapd's block cache (made 0700 if missing); empty: none.
  std::string cache_dir;
  uint64_t cache_bytes = uint64_t{1} << 30;
  // Parts one listing, du or gc looks at.
  size_t max_parts = 1 << 16;
};

// Which part(s) of a version; empty fields match any.
struct PartSelector {
  std::string store_dir;
  std::string name;
  std::string node;
  std::string heap;
};

class StoreSnapshots {
 public:
  static absl::StatusOr<std::unique_ptr<StoreSnapshots>> Open(SnapshotStore* snapshots,
                                                              StoreSnapshotsOptions options);

  // Stores `heap`'s committed epoch as part (this node, heap_name) of
  // version `name` in `store_dir`. The answer's `store` tells what it took.
  // `unchanged_token()`, asked with the heap's files at rest: non-empty if
  // heapd knows of no write to the heap's data since it stored a part with
  // this token (the epoch is added): that part's data blocks are then
  // reused without reading the heap.
  absl::StatusOr<v1::SnapshotManifest> Create(
      const SnapshotCaller& caller, PersistentHeap& heap, const std::string& heap_name,
      const v1::HeapInfo& source, const std::string& store_dir, const std::string& name,
      const std::map<std::string, std::string>& labels,
      const std::function<std::string()>& unchanged_token = {});

  // The parts of the version `name` (every version's if empty), each a
  // manifest with its node and usage. Damaged parts are left out.
  absl::StatusOr<std::vector<v1::SnapshotManifest>> List(const SnapshotCaller& caller,
                                                         const std::string& store_dir,
                                                         const std::string& name);

  // Reads every selected part whole: its recipe, metadata (checked as a
  // snapshot's) and every block's hash. DATA_LOSS naming the first fault.
  absl::StatusOr<std::vector<v1::SnapshotManifest>> Verify(const SnapshotCaller& caller,
                                                           const PartSelector& which);

  // Removes the selected parts (their blocks stay until gc) and returns
  // them, with the parts of the version that stay. NOT_FOUND if none
  // matched.
  struct Removed {
    std::vector<PartRef> parts;
    size_t remaining = 0;
  };
  absl::StatusOr<Removed> Remove(const SnapshotCaller& caller, const PartSelector& which);

  // A heap directory built from one part, as SnapshotStore::Restore. The
  // part: `which` names it, or the version has one, or one of this node.
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> Restore(
      const SnapshotCaller& caller, const PartSelector& which, const std::string& heaps_dir,
      const std::string& heap_name, const RestoreOptions& options, v1::SnapshotManifest* manifest);

  absl::StatusOr<v1::GcStoreResponse> CollectGarbage(const SnapshotCaller& caller,
                                                     const std::string& store_dir,
                                                     std::optional<absl::Duration> grace,
                                                     bool dry_run);

  absl::StatusOr<v1::StoreUsageResponse> Usage(const SnapshotCaller& caller,
                                               const std::string& store_dir);

  const std::string& node() const { return options_.node; }

 private:
  StoreSnapshots(SnapshotStore* snapshots, StoreSnapshotsOptions options, UniqueFd cache)
      : snapshots_(snapshots), options_(std::move(options)), cache_(std::move(cache)) {}

  // The parts `which` selects (NOT_FOUND if none), each removed first if
  // `remove`, found and removed by a helper as the caller; in `others` (if
  // given) how many parts of the version it did not select. `what` names
  // it in errors.
  absl::StatusOr<std::vector<PartRef>> SelectParts(const SnapshotCaller& caller,
                                                   const PartSelector& which,
                                                   const std::string& what, bool remove,
                                                   size_t* others = nullptr);
  // The parts `which` selects (NOT_FOUND if none).
  absl::StatusOr<std::vector<PartRef>> Parts(const SnapshotCaller& caller,
                                             const PartSelector& which);
  struct ReadPart;  // a part's recipe and metadata, read and checked
  // Picks the part of `which` in a helper and reads its recipe; then its
  // metadata blocks (from the cache or the store) and, with `data_fd`,
  // its data blocks into that file (else their hashes only are checked).
  absl::StatusOr<ReadPart> ReadWhole(const SnapshotCaller& caller, const PartSelector& which,
                                     int data_fd, uint64_t max_data_bytes);
  // ReadWhole's first step: the recipe of the part `which` picks, its
  // manifest checked against it and into `read` (with the charge for what
  // heapd holds); RESOURCE_EXHAUSTED above `max_data_bytes` of data.
  absl::StatusOr<v1::StoreRecipe> ReadRecipe(const SnapshotCaller& caller,
                                             const PartSelector& which, uint64_t max_data_bytes,
                                             ReadPart* read);
  // Fetches `wanted` from the store in a helper: data blocks into
  // `data_fd`, metadata blocks (at most `block_bytes` each, checked by
  // their hashes) into `metadata_blocks`. Returns the ids of the metadata
  // blocks fetched.
  absl::StatusOr<std::vector<BlockId>> FetchFromStore(
      const SnapshotCaller& caller, const PartSelector& which,
      const std::vector<WantedBlock>& wanted, uint64_t block_bytes, int data_fd,
      const std::string& where, std::map<BlockId, std::string>* metadata_blocks);
  // The cache of `uid`'s blocks: a user's restores never read another's
  // (a block id is no capability). nullopt: no cache, or it failed.
  std::optional<BlockStore> CacheOf(uint32_t uid);
  // Adds a block heapd read and hashed itself to `cache`, best effort.
  void Cache(BlockStore& cache, absl::string_view bytes);
  // Drops the oldest cached blocks while the cache holds more than its bound.
  void TrimCache();

  SnapshotStore* const snapshots_;
  const StoreSnapshotsOptions options_;
  const UniqueFd cache_;  // invalid: no cache
  std::atomic<uint64_t> cache_bytes_{0};
  absl::Mutex trim_mu_;
};

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_STORE_SNAPSHOTS_H_
