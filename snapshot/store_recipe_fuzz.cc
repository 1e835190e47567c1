// Fuzzes what heapd and its helpers read of a snapshot store's recipe
// files (snapshot/store_recipe.h): DecodeRecipeFile and RecipeHeaderBytes
// get bytes a hostile user may have written.
//
// Beyond not crashing, checked on every input:
//   - every failure is DATA_LOSS and names the recipe;
//   - what DecodeRecipeFile accepts keeps its promises: a valid block size,
//     exactly one 32-byte id per block of the data, metadata files with
//     valid, distinct names, the bytes they claim in blocks of the block
//     size, no hole among them, at most 1 GiB of metadata in all; delta
//     bases sorted and distinct, in an HRC2 file exactly when there are any;
//   - the header alone decodes to the same manifest and usage, and what
//     was accepted encodes to bytes that decode to the same recipe.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "heap/heap_dir.h"
#include "snapshot/snapshot_format.h"
#include "snapshot/store_recipe.h"
#include "tools/fuzz/fuzz_seeds.h"

namespace heapd {
namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_recipe_fuzz: %s\n", what);
    std::abort();
  }
}

uint64_t BlocksFor(uint64_t bytes, uint64_t block) { return (bytes + block - 1) / block; }

void FuzzOne(absl::string_view input) {
  absl::StatusOr<RecipeFile> file = DecodeRecipeFile(input, "fuzz/node/heap");
  if (!file.ok()) {
    Check(file.status().code() == absl::StatusCode::kDataLoss, "a failure that is not DATA_LOSS");
    Check(file.status().message().find("fuzz/node/heap") != absl::string_view::npos,
          "a failure that does not name the recipe");
    return;
  }
  const v1::StoreRecipe& recipe = file->recipe;
  const uint64_t block = recipe.block_bytes();
  Check(ValidBlockBytes(block), "a block size out of range");
  Check(recipe.data_blocks().size() == BlocksFor(recipe.data_bytes(), block) * kBlockIdBytes,
        "data ids that do not match the data size");
  std::set<std::string> names;
  uint64_t metadata = 0;
  for (const v1::StoreFile& stored : recipe.metadata()) {
    Check(IsMetadataFileName(stored.name()), "a metadata file with a bad name");
    Check(names.insert(stored.name()).second, "a metadata file twice");
    Check(stored.blocks().size() == BlocksFor(stored.bytes(), block) * kBlockIdBytes,
          "metadata ids that do not match its size");
    metadata += stored.bytes();
    for (size_t i = 0; i * kBlockIdBytes < stored.blocks().size(); ++i) {
      Check(PackedId(stored.blocks(), i) != absl::string_view("\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"
                                                              "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
                                                              kBlockIdBytes),
            "a hole among metadata blocks");
    }
  }
  Check(metadata <= kMaxMetadataBytes, "more metadata than the cap");
  const std::string& bases = recipe.delta_bases();
  Check(bases.size() % kBlockIdBytes == 0, "delta bases that are not whole ids");
  for (size_t i = 1; i * kBlockIdBytes < bases.size(); ++i) {
    Check(PackedId(bases, i - 1) < PackedId(bases, i), "delta bases not sorted and distinct");
  }
  Check((input.substr(0, 4) == "HRC2") == !bases.empty(), "delta bases in the wrong recipe kind");
  absl::StatusOr<RecipeFile> header = DecodeRecipeFile(input, "fuzz/node/heap", true);
  Check(header.ok() && header->manifest_json == file->manifest_json &&
            header->usage.SerializeAsString() == file->usage.SerializeAsString(),
        "the header alone decodes otherwise");
  absl::StatusOr<RecipeFile> again = DecodeRecipeFile(EncodeRecipeFile(*file), "again");
  Check(again.ok() && again->manifest_json == file->manifest_json &&
            again->recipe.SerializeAsString() == recipe.SerializeAsString(),
        "a re-encoded recipe decodes otherwise");
}

}  // namespace

namespace fuzz {

Seeds MakeSeeds() {
  RecipeFile file;
  file.manifest_json = "{\"name\": \"v1\", \"heap\": \"h\", \"node\": \"n\"}";
  file.usage.set_logical_bytes(3 << 20);
  file.recipe.set_block_bytes(1 << 20);
  file.recipe.set_data_bytes(3 << 20);
  std::string ids(3 * kBlockIdBytes, '\0');
  ids[0] = 1;
  ids[2 * kBlockIdBytes] = 2;  // the middle block is a hole
  file.recipe.set_data_blocks(ids);
  v1::StoreFile& checkpoint = *file.recipe.add_metadata();
  checkpoint.set_name("checkpoint");
  checkpoint.set_bytes(100);
  checkpoint.set_blocks(std::string(kBlockIdBytes, '\3'));
  const std::string good = EncodeRecipeFile(file);
  RecipeFile deltas = file;
  deltas.recipe.set_delta_bases(std::string(kBlockIdBytes, '\4') +
                                std::string(kBlockIdBytes, '\5'));
  return {{"recipe", good},
          {"header_only", good.substr(0, 12 + file.manifest_json.size())},
          {"recipe_deltas", EncodeRecipeFile(deltas)}};
}

}  // namespace fuzz
}  // namespace heapd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  heapd::FuzzOne(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
