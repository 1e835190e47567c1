#include "snapshot/store_recipe.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "heap/heap_dir.h"
#include "heap/heap_name.h"
#include "heap/metadata_format.h"
#include "snapshot/snapshot_format.h"

namespace heapd {
namespace {

constexpr char kMagic[4] = {'H', 'R', 'C', '1'};
// A recipe naming delta bases: older heapd do not know to keep them (gc),
// nor to read deltas, and refuse it.
constexpr char kDeltaMagic[4] = {'H', 'R', 'C', '2'};
constexpr size_t kFixedBytes = 12;
constexpr uint64_t kMaxUsageBytes = 4096;
constexpr char kZeroId[kBlockIdBytes] = {};

void PutLe32(std::string* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

uint32_t GetLe32(const char* at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<uint8_t>(at[i])} << (8 * i);
  return value;
}

uint64_t BlocksFor(uint64_t bytes, uint64_t block) { return (bytes + block - 1) / block; }

}  // namespace

std::string PartRef::ToString() const { return absl::StrCat(name, "/", node, "/", heap); }

std::string PartRef::RecipePath() const {
  return absl::StrCat("versions/", name, "/", node, "/", heap, ".recipe");
}

absl::Status ValidatePartRef(const PartRef& part) {
  if (absl::Status s = ValidateHeapName(part.name, "version"); !s.ok()) return s;
  if (absl::Status s = ValidateHeapName(part.node, "node"); !s.ok()) return s;
  return ValidateHeapName(part.heap);
}

uint64_t UsedChunksBytes(uint64_t data_bytes) {
  return ((data_bytes + kChunkSize - 1) / kChunkSize + 7) / 8;
}

bool ValidBlockBytes(uint64_t bytes) {
  return bytes >= (64 << 10) && bytes <= (2 << 20) && (bytes & (bytes - 1)) == 0;
}

std::string EncodeRecipeFile(const RecipeFile& file) {
  const std::string usage = file.usage.SerializeAsString();
  std::string out(file.recipe.delta_bases().empty() ? kMagic : kDeltaMagic, sizeof(kMagic));
  PutLe32(&out, static_cast<uint32_t>(file.manifest_json.size()));
  PutLe32(&out, static_cast<uint32_t>(usage.size()));
  out += file.manifest_json;
  out += usage;
  out += file.recipe.SerializeAsString();
  return out;
}

absl::StatusOr<uint64_t> RecipeHeaderBytes(absl::string_view head, const std::string& where) {
  if (head.size() < kFixedBytes || (std::memcmp(head.data(), kMagic, sizeof(kMagic)) != 0 &&
                                    std::memcmp(head.data(), kDeltaMagic, sizeof(kMagic)) != 0)) {
    return absl::DataLossError(absl::StrCat("recipe ", where, ": not a recipe file"));
  }
  const uint64_t json = GetLe32(head.data() + 4);
  const uint64_t usage = GetLe32(head.data() + 8);
  if (json > kMaxManifestBytes || usage > kMaxUsageBytes) {
    return absl::DataLossError(absl::StrCat("recipe ", where, ": its header is too large"));
  }
  return kFixedBytes + json + usage;
}

absl::StatusOr<RecipeFile> DecodeRecipeFile(absl::string_view bytes, const std::string& where,
                                            bool header_only) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("recipe ", where, ": ", why));
  };
  if (bytes.size() > kMaxRecipeBytes) return bad("larger than 64 MiB");
  absl::StatusOr<uint64_t> header = RecipeHeaderBytes(bytes, where);
  if (!header.ok()) return header.status();
  if (bytes.size() < *header) return bad("ends inside its header");
  const uint64_t json = GetLe32(bytes.data() + 4);
  RecipeFile file;
  file.manifest_json = std::string(bytes.substr(kFixedBytes, json));
  if (!file.usage.ParseFromArray(bytes.data() + kFixedBytes + json,
                                 static_cast<int>(*header - kFixedBytes - json))) {
    return bad("its usage does not parse");
  }
  if (header_only) return file;
  v1::StoreRecipe& recipe = file.recipe;
  const bool deltas = std::memcmp(bytes.data(), kDeltaMagic, sizeof(kMagic)) == 0;
  bytes.remove_prefix(*header);
  if (!recipe.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return bad("its block list does not parse");
  }
  const uint64_t block = recipe.block_bytes();
  if (!ValidBlockBytes(block)) return bad(absl::StrCat("a block size of ", block));
  if (recipe.data_bytes() > kMaxHeapBytes ||
      recipe.data_blocks().size() != BlocksFor(recipe.data_bytes(), block) * kBlockIdBytes) {
    return bad(absl::StrCat(recipe.data_blocks().size() / kBlockIdBytes, " data blocks for ",
                            recipe.data_bytes(), " bytes"));
  }
  if (!recipe.used_chunks().empty() &&
      recipe.used_chunks().size() != UsedChunksBytes(recipe.data_bytes())) {
    return bad(absl::StrCat(recipe.used_chunks().size(), " bytes of used chunks for ",
                            recipe.data_bytes(), " bytes"));
  }
  const std::string& bases = recipe.delta_bases();
  if (deltas == bases.empty() || bases.size() % kBlockIdBytes != 0) {
    return bad(
        absl::StrCat(bases.size(), " bytes of delta bases in an HRC", deltas ? 2 : 1, " recipe"));
  }
  for (size_t i = 0; i * kBlockIdBytes < bases.size(); ++i) {
    if (i > 0 && PackedId(bases, i) <= PackedId(bases, i - 1)) {
      return bad("its delta bases are not sorted and distinct");
    }
  }
  uint64_t metadata_bytes = 0;
  std::set<std::string> names;
  for (const v1::StoreFile& stored : recipe.metadata()) {
    metadata_bytes += stored.bytes();
    if (!IsMetadataFileName(stored.name()) || !names.insert(stored.name()).second ||
        stored.bytes() > kMaxMetadataBytes || metadata_bytes > kMaxMetadataBytes ||
        stored.blocks().size() != BlocksFor(stored.bytes(), block) * kBlockIdBytes) {
      return bad(
          absl::StrCat("its metadata file '", stored.name().substr(0, 64), "' does not fit"));
    }
    for (size_t i = 0; i * kBlockIdBytes < stored.blocks().size(); ++i) {
      if (PackedId(stored.blocks(), i) == absl::string_view(kZeroId, kBlockIdBytes)) {
        return bad("a metadata block is a hole");
      }
    }
  }
  return file;
}

}  // namespace heapd
