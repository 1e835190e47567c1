// VersionStore: the work done inside a snapshot store directory (layout
// in snapshot/store_recipe.h) — storing a heap's committed state as
// one part of a version, reading recipes, fetching blocks, listing,
// removing, collecting garbage, adding up usage — relative to the store's
// root descriptor: a RunAs helper runs it with the caller's rights
// (util/run_as.h);
// snapshot/store_snapshots.h decides what to run and checks what returns.
//
// Atomic publication: a part's blocks are durable before its recipe is
// linked to its name (link fails if the name exists: two nodes storing one
// part, one wins), so a crashed create leaves no part, only blocks no
// recipe names (and a lease that expires).
//
// Garbage collection is safe against creates in flight, on any node:
//   - a create writes a lease file (leases/RANDOM) before its first block
//     and removes it after publishing; gc keeps every block modified after
//     the oldest live lease began (less a grace for clock skew), so blocks
//     a create wrote and has not yet named stay;
//   - a create that finds a block present sets its modification time; gc
//     first renames an unnamed old block aside, then looks at its time
//     again: a block marked meanwhile is renamed back, and a create whose
//     mark came after the rename fails to mark it and writes it anew.
//   Leases older than lease_expiry are taken as crashed creates.
#ifndef HEAPD_SNAPSHOT_VERSION_STORE_H_
#define HEAPD_SNAPSHOT_VERSION_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "heap/content_undo.h"
#include "proto/heapd.pb.h"
#include "snapshot/block_store.h"
#include "snapshot/store_recipe.h"
#include "util/run_as.h"

namespace heapd {

// A heap's committed state as a part to store.
struct PartSource {
  PartRef part;
  std::string manifest_json;
  int data_fd = -1;  // read only at the blocks of used chunks
  uint64_t data_bytes = 0;
  std::vector<bool> used_chunks;  // by 2 MiB chunk; unused: a hole, not read
  // Their bytes live elsewhere (heapd's copy; a helper's mapped request)
  // as long as the PartSource.
  std::map<std::string, absl::string_view> metadata_files;
  uint32_t block_bytes = kDefaultBlockBytes;
  int zstd_level = 1;
  // Blocks that changed since an earlier part of this node's (as above)
  // may be stored as deltas against that part's (snapshot/block_store.h).
  bool deltas = true;
  int threads = 2;  // workers reading, hashing and compressing
  // Non-empty: heapd knows of no write to the heap's data since it stored
  // a part with this StoreUsage::source_token; that part's data blocks
  // are reused (marked in use, not read) if this node has it in the store.
  std::string unchanged_token;
  // Heaps that track contents: the chunks heapd knows unchanged since an
  // earlier part of this node's (StoreUsage::changes_token) have that
  // part's blocks reused (marked in use, not read).
  std::optional<ChunkChanges> changes;
  size_t max_parts = 1 << 16;  // parts looked through for them
};

// Stores `source`; ALREADY_EXISTS if the part exists.
absl::StatusOr<v1::StoreUsage> WritePart(int root, const PartSource& source);

// The whole recipe file of `part` (at most kMaxRecipeBytes, unchecked), or
// with `header_only` its header, manifest and usage. NOT_FOUND if absent.
// `owner`, if given, gets the file's owner.
absl::StatusOr<std::string> ReadRecipeFile(int root, const PartRef& part, bool header_only,
                                           uint32_t* owner = nullptr);

// The parts of version `name`, or of every version if `name` is empty
// (at most `max_parts`: RESOURCE_EXHAUSTED beyond). Entries that are not
// parts are left out.
absl::StatusOr<std::vector<PartRef>> ListParts(int root, const std::string& name, size_t max_parts);

// Removes the part's recipe (its blocks stay until gc) and the version's
// directories once empty. NOT_FOUND if absent.
absl::Status RemovePart(int root, const PartRef& part);

// A block to fetch: written to the data file at `offset` (its size must
// be `length`), or, with offset -1, sent as a message: 'b', its raw id,
// its bytes.
struct WantedBlock {
  BlockId id;
  int64_t offset = -1;
  uint64_t length = 0;
};
// Reads each block (checked: snapshot/block_store.h); with data_fd -1 only
// checks them. DATA_LOSS naming
// `what` if one is missing or wrong.
absl::Status FetchBlocks(int root, const std::vector<WantedBlock>& wanted, int data_fd,
                         const std::string& what, MessageSink& out, int threads = 2);

struct GcOptions {
  absl::Duration grace = absl::Minutes(10);
  absl::Duration lease_expiry = absl::Hours(24);
  bool dry_run = false;
  size_t max_parts = 1 << 20;
};
absl::StatusOr<v1::GcStoreResponse> CollectGarbage(int root, const GcOptions& options);

// Every part's header bytes (its recipe file up to the block list) with
// its usage in the store: stored_bytes (the blocks it names) and
// exclusive_bytes (those no other part names); and the store's totals.
struct PartUsage {
  PartRef part;
  std::string header;  // as ReadRecipeFile(header_only)
  v1::StoreUsage usage;
};
struct StoreTotals {
  uint64_t stored_bytes = 0;  // every block file
  uint64_t blocks = 0;
};
absl::StatusOr<StoreTotals> AddUpUsage(int root, size_t max_parts, std::vector<PartUsage>* parts);

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_VERSION_STORE_H_
