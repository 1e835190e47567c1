// VersionStore: versions of heaps in a snapshot store directory (issue 12):
// blocks in a BlockStore, and one recipe per version naming them
// (v1::StoreRecipe at versions/HEAP/NAME.recipe). A version is made from a
// heap's committed state: the chunks free at that epoch are never read or
// stored, blocks of zeros are holes, and a block the store already has is
// not written again (versions share their unchanged blocks). A recipe is
// published (linked to its name) once every block it names is durable, so
// a crashed create leaves no version, only blocks no recipe names.
//
// A version checks out to an ordinary snapshot directory (manifest.json,
// metadata files, data), which the rest of heapd restores or attaches in
// place with its usual checks. Nothing read from the store is trusted:
// recipes are size-capped and checked, blocks are checked by BlockStore,
// and the checked-out snapshot is verified as any other.
//
// Not yet (issue 12's next steps): hashing skipped for chunks known
// unchanged, gc, job groups, the RPCs and heapctl --store.
#ifndef HEAPD_SNAPSHOT_VERSION_STORE_H_
#define HEAPD_SNAPSHOT_VERSION_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "heap/heap.h"
#include "proto/heapd.pb.h"
#include "snapshot/block_store.h"

namespace heapd {

struct VersionStats {
  uint64_t logical_bytes = 0;   // the data file and metadata files
  uint64_t blocks = 0;          // blocks the version names (holes not counted)
  uint64_t blocks_written = 0;  // of those, new to the store
  uint64_t stored_bytes = 0;    // compressed bytes this version added
};

class VersionStore {
 public:
  // The store in `dir` (made if missing). `block_bytes`: the block size of
  // versions made from now on (a power of two, 64 KiB to 2 MiB).
  static absl::StatusOr<std::unique_ptr<VersionStore>> Open(const std::string& dir,
                                                            uint32_t block_bytes = 1 << 20);

  // Stores `state` (a heap's committed state: PersistentHeap::
  // WithCommittedState) as version `name` of heap `heap` described by
  // `source`. ALREADY_EXISTS if the heap has a version of that name.
  absl::StatusOr<VersionStats> Create(const std::string& heap, const std::string& name,
                                      const v1::HeapInfo& source, const CommittedState& state);

  // The recipe of version `name` of `heap`, checked.
  absl::StatusOr<v1::StoreRecipe> Read(const std::string& heap, const std::string& name) const;

  // Writes version `name` of `heap` as a snapshot directory at `target`
  // (which must not exist), checked whole before it returns;
  // RESOURCE_EXHAUSTED if its data file would exceed `max_data_bytes`.
  absl::Status Checkout(const std::string& heap, const std::string& name, const std::string& target,
                        uint64_t max_data_bytes) const;

 private:
  VersionStore(std::string dir, std::unique_ptr<BlockStore> blocks, uint32_t block_bytes)
      : dir_(std::move(dir)), blocks_(std::move(blocks)), block_bytes_(block_bytes) {}
  std::string RecipePath(const std::string& heap, const std::string& name) const;
  // Checkout's work, into `target`.
  absl::Status CheckoutInto(const std::string& heap, const std::string& name,
                            const std::string& target, uint64_t max_data_bytes) const;

  const std::string dir_;
  const std::unique_ptr<BlockStore> blocks_;
  const uint32_t block_bytes_;
};

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_VERSION_STORE_H_
