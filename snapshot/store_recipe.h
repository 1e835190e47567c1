// The layout of a snapshot store and the files in it other than
// blocks (snapshot/block_store.h):
//
//   STORE/blocks/XX/<sha-256 hex>          content-addressed blocks
//   STORE/versions/NAME/NODE/HEAP.recipe   one part of version NAME: heap
//                                          HEAP as the heapd of NODE stored it
//   STORE/leases/<random>                  a create in flight (for gc)
//
// A version groups parts: a plain create makes a version of one part; a
// Slurm job's epilogs on every node add theirs to one version (the job
// snapshot). A recipe file is "HRC1" ("HRC2" if it names delta bases:
// block_store.h, which heapd from before deltas refuse), the lengths of the next two fields
// (u32 little endian each), the part's manifest (snapshot_format.h's
// manifest.json), its usage (v1::StoreUsage) and the v1::StoreRecipe
// naming its blocks. The manifest and usage come first so that listing a
// store reads a few KiB per part, not the block lists.
//
// Nothing read is trusted: DecodeRecipeFile checks sizes and counts (the
// manifest is checked by ParseManifest, in heapd).
#ifndef HEAPD_SNAPSHOT_STORE_RECIPE_H_
#define HEAPD_SNAPSHOT_STORE_RECIPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/heapd.pb.h"

namespace heapd {

inline constexpr uint64_t kMaxRecipeBytes = uint64_t{64} << 20;
inline constexpr uint32_t kDefaultBlockBytes = uint32_t{1} << 20;
inline constexpr size_t kBlockIdBytes = 32;

// One part of a version.
struct PartRef {
  std::string name;  // the version
  std::string node;
  std::string heap;
  std::string ToString() const;    // "NAME/NODE/HEAP"
  std::string RecipePath() const;  // "versions/NAME/NODE/HEAP.recipe"
};

// Bytes of StoreRecipe::used_chunks for a data file of `data_bytes`.
uint64_t UsedChunksBytes(uint64_t data_bytes);

// INVALID_ARGUMENT unless name, node and heap are each a heap name.
absl::Status ValidatePartRef(const PartRef& part);
// A power of two from 64 KiB to 2 MiB.
bool ValidBlockBytes(uint64_t bytes);

struct RecipeFile {
  std::string manifest_json;
  v1::StoreUsage usage;
  v1::StoreRecipe recipe;
};

std::string EncodeRecipeFile(const RecipeFile& file);
// Checks everything but the manifest's JSON; DATA_LOSS naming `where`.
// With `header_only`, `bytes` may stop after the usage (recipe left empty).
absl::StatusOr<RecipeFile> DecodeRecipeFile(absl::string_view bytes, const std::string& where,
                                            bool header_only = false);
// Bytes of the header and manifest and usage of a recipe file that starts
// with `head` (at least 12 bytes); DATA_LOSS if they pass the caps.
absl::StatusOr<uint64_t> RecipeHeaderBytes(absl::string_view head, const std::string& where);

// The id of block `index` of packed ids.
inline absl::string_view PackedId(const std::string& packed, size_t index) {
  return absl::string_view(packed).substr(index * kBlockIdBytes, kBlockIdBytes);
}

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_STORE_RECIPE_H_
