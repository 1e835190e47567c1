#include "snapshot/version_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "allocator/size_class.h"
#include "heap/heap_name.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/random_name.h"
#include "util/run_workers.h"

namespace heapd {
namespace {

constexpr char kVersions[] = "versions";
constexpr char kLeases[] = "leases";
constexpr char kRecipeSuffix[] = ".recipe";
// Entries of one directory of the store looked at.
constexpr size_t kMaxEntries = 1 << 20;

// `name` in `dir`, made (and its entry made durable) if missing.
absl::StatusOr<UniqueFd> MakeDirectoryAt(int dir, const std::string& name) {
  if (mkdirat(dir, name.c_str(), 0755) == 0) {
    if (fsync(dir) != 0) return ErrnoStatus(errno, absl::StrCat("fsync the parent of ", name));
  } else if (errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("make ", name));
  }
  return OpenDirectoryAt(dir, name);
}

// Whether every byte is zero: the first is, and each equals the next
// (memcmp is vectorised, a byte loop is not).
bool AllZero(absl::string_view bytes) {
  return bytes.empty() ||
         (bytes[0] == '\0' && std::memcmp(bytes.data(), bytes.data() + 1, bytes.size() - 1) == 0);
}

// Marks a create in flight until destroyed (see version_store.h).
class Lease {
 public:
  static absl::StatusOr<Lease> Take(int root) {
    absl::StatusOr<UniqueFd> leases = MakeDirectoryAt(root, kLeases);
    if (!leases.ok()) return leases.status();
    std::string name = RandomName();
    if (absl::Status s = WriteNewFileAt(leases->get(), name, ""); !s.ok()) return s;
    if (fsync(leases->get()) != 0) return ErrnoStatus(errno, "fsync the store's leases");
    return Lease(*std::move(leases), std::move(name));
  }
  Lease(Lease&&) = default;
  ~Lease() {
    if (dir_.valid()) unlinkat(dir_.get(), name_.c_str(), 0);
  }

 private:
  Lease(UniqueFd dir, std::string name) : dir_(std::move(dir)), name_(std::move(name)) {}
  UniqueFd dir_;
  std::string name_;
};

// Appends the ids of `recipe`'s blocks (holes left out) to `ids`.
void CollectIds(const v1::StoreRecipe& recipe, std::set<BlockId>* ids) {
  auto add = [&](const std::string& packed) {
    for (size_t i = 0; i * kBlockIdBytes < packed.size(); ++i) {
      const BlockId id = BlockId::FromRaw(PackedId(packed, i).data());
      if (!id.IsZero()) ids->insert(id);
    }
  };
  add(recipe.data_blocks());
  for (const v1::StoreFile& file : recipe.metadata()) add(file.blocks());
  add(recipe.delta_bases());
}

// Recipes one gc or du reads in all: what they hold in memory grows with
// the block ids read (a user's hard links to one big recipe included).
constexpr uint64_t kMaxRecipeBytesPerCall = uint64_t{256} << 20;

// Reads `part`'s recipe, counting its bytes in `*read`.
absl::StatusOr<RecipeFile> ReadRecipe(int root, const PartRef& part, uint64_t* read) {
  absl::StatusOr<std::string> bytes = ReadRecipeFile(root, part, /*header_only=*/false);
  if (!bytes.ok()) return bytes.status();
  if ((*read += bytes->size()) > kMaxRecipeBytesPerCall) {
    return absl::ResourceExhaustedError(absl::StrCat("the store's recipes hold more than ",
                                                     kMaxRecipeBytesPerCall, " bytes in all"));
  }
  return DecodeRecipeFile(*bytes, part.ToString());
}

// Whether StoreRecipe::used_chunks `used` says `chunk` was used (not if it
// is empty or too short).
bool ChunkUsed(const std::string& used, uint64_t chunk) {
  return chunk / 8 < used.size() && (static_cast<uint8_t>(used[chunk / 8]) >> (chunk % 8)) & 1;
}

// An earlier part of this node's whose data blocks a create may reuse.
struct EarlierPart {
  std::string data_ids;                             // packed, as its recipe holds them
  std::string used_chunks;                          // its StoreRecipe::used_chunks
  std::map<std::string, std::string> metadata_ids;  // packed, by file name
  uint64_t data_bytes = 0;
  bool unchanged = false;  // stored with source.unchanged_token: all of it reusable
  uint64_t mark = 0;       // else: its mark among source.changes
};

// The mark a part's changes_token gives if it was taken by the same
// ContentUndo life as `changes`, else 0.
uint64_t MarkOf(const v1::StoreUsage& usage, const ChunkChanges& changes) {
  absl::string_view token = usage.changes_token();
  uint64_t mark = 0;
  if (!absl::ConsumePrefix(&token, changes.source) || !absl::ConsumePrefix(&token, "/") ||
      !absl::SimpleAtoi(token, &mark) || mark >= changes.mark) {
    return 0;
  }
  return mark;
}

// This node's earlier part of the same heap that heapd vouches for: stored
// with `source.unchanged_token`, else the one with the latest mark among
// `source.changes`; of this user's (in a store others write to, another's
// could name blocks of this user's that are not this heap's) and of the
// same block size. NOT_FOUND if none (any trouble finding it: then the data
// is read).
absl::StatusOr<EarlierPart> FindEarlierPart(int root, const PartSource& source) {
  if (source.unchanged_token.empty() && !source.changes.has_value()) {
    return absl::NotFoundError("heapd knows nothing");
  }
  absl::StatusOr<std::vector<PartRef>> parts = ListParts(root, "", source.max_parts);
  if (!parts.ok()) return absl::NotFoundError("");
  // Candidates best first: the same token, then later marks.
  std::vector<std::pair<uint64_t, PartRef>> candidates;
  for (const PartRef& part : *parts) {
    if (part.node != source.part.node || part.heap != source.part.heap) continue;
    uint32_t owner = 0;
    absl::StatusOr<std::string> header = ReadRecipeFile(root, part, /*header_only=*/true, &owner);
    absl::StatusOr<RecipeFile> head =
        header.ok() ? DecodeRecipeFile(*header, part.ToString(), true) : header.status();
    if (!head.ok() || owner != geteuid()) continue;
    if (!source.unchanged_token.empty() && head->usage.source_token() == source.unchanged_token) {
      candidates.emplace_back(std::numeric_limits<uint64_t>::max(), part);
    } else if (const uint64_t mark = source.changes ? MarkOf(head->usage, *source.changes) : 0) {
      candidates.emplace_back(mark, part);
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  uint64_t read = 0;  // recipes planted to look like candidates cost at most this
  for (const auto& [mark, part] : candidates) {
    uint32_t owner = 0;
    absl::StatusOr<std::string> bytes = ReadRecipeFile(root, part, /*header_only=*/false, &owner);
    if (!bytes.ok() || owner != geteuid()) continue;
    if ((read += bytes->size()) > kMaxRecipeBytesPerCall) break;
    absl::StatusOr<RecipeFile> file = DecodeRecipeFile(*bytes, part.ToString());
    if (!file.ok() || file->recipe.block_bytes() != source.block_bytes) continue;
    EarlierPart earlier;
    earlier.data_bytes = file->recipe.data_bytes();
    earlier.unchanged = mark == std::numeric_limits<uint64_t>::max();
    if (earlier.unchanged && earlier.data_bytes != source.data_bytes) continue;
    earlier.mark = earlier.unchanged ? 0 : mark;
    earlier.data_ids = std::move(*file->recipe.mutable_data_blocks());
    earlier.used_chunks = std::move(*file->recipe.mutable_used_chunks());
    for (v1::StoreFile& stored : *file->recipe.mutable_metadata()) {
      earlier.metadata_ids[stored.name()] = std::move(*stored.mutable_blocks());
    }
    return earlier;
  }
  return absl::NotFoundError("");
}

// What one worker of a part's write counted; each writes the ids of its
// own blocks.
struct Tally {
  uint64_t blocks = 0, written = 0, stored_bytes = 0, hashed_bytes = 0, reused = 0, deltas = 0;
  std::set<BlockId> bases;  // of the deltas it named
  absl::Status status;
};

// Whether a changed block is worth diffing against the earlier part's
// block at its place (which costs reading that one): always for the first
// few of a part, then while at least a quarter of them paid (a heap whose
// blocks change all over, as a graph ingest, soon stops trying); data and
// metadata apart.
struct DeltaBudget {
  std::atomic<uint64_t> tried{0}, paid{0};
  bool Worth() const {
    const uint64_t tries = tried.load(), paying = paid.load();
    return tries < 8 || paying * 4 >= tries;
  }
};

// Stores `bytes` as a block, writes its id at `id` and counts it. `earlier`:
// the earlier part's block at the same place (zero: none), which the block
// may be stored as a delta against.
absl::Status PutBlock(BlockStore& blocks, absl::string_view bytes, const BlockId& earlier,
                      DeltaBudget& budget, char* id, Tally& tally) {
  bool tried = false;
  absl::StatusOr<BlockStore::Stored> stored =
      blocks.Put(bytes, [&]() -> std::optional<BlockStore::Base> {
        if (earlier.IsZero() || !budget.Worth()) return std::nullopt;
        tried = true;
        ++budget.tried;
        absl::StatusOr<BlockStore::Base> base = blocks.BaseFor(earlier);
        if (!base.ok()) return std::nullopt;  // gone or damaged: stored whole
        return *std::move(base);
      });
  if (!stored.ok()) return stored.status();
  ++tally.blocks;
  if (stored->written) {
    ++tally.written;
    tally.stored_bytes += stored->stored_bytes;
  }
  if (!stored->base.IsZero()) {
    tally.bases.insert(stored->base);
    if (stored->written) ++tally.deltas;
    if (stored->written && tried) ++budget.paid;
  }
  std::memcpy(id, stored->id.hash.data(), kBlockIdBytes);
  return absl::OkStatus();
}

// The id at `index` of packed ids, zero past their end.
BlockId IdAt(const std::string& packed, size_t index) {
  if ((index + 1) * kBlockIdBytes > packed.size()) return BlockId();
  return BlockId::FromRaw(PackedId(packed, index).data());
}

// OK if `source` may become a new part: valid, not there yet (a recipe
// opened there, even one that does not read back, is a part that exists;
// any other failure, such as a store the caller may not read, is said as
// it is), and not larger than readers accept.
absl::Status CheckNewPart(int root, const PartSource& source, uint64_t data_blocks) {
  const PartRef& part = source.part;
  if (absl::Status s = ValidatePartRef(part); !s.ok()) return s;
  if (!ValidBlockBytes(source.block_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a block size of ", source.block_bytes));
  }
  if (absl::Status existing = ReadRecipeFile(root, part, /*header_only=*/true).status();
      existing.code() != absl::StatusCode::kNotFound) {
    if (existing.ok() || existing.code() == absl::StatusCode::kDataLoss) {
      return absl::AlreadyExistsError(absl::StrCat("part ", part.ToString(), " exists"));
    }
    return existing;
  }
  if (data_blocks * kBlockIdBytes > kMaxRecipeBytes / 2) {
    return absl::ResourceExhaustedError(
        absl::StrCat("part ", part.ToString(), " would name ", data_blocks, " blocks of ",
                     source.block_bytes, " bytes: more than a recipe holds (use larger blocks)"));
  }
  return absl::OkStatus();
}

// The used-chunks bitmap of `source` as a recipe stores it.
std::string UsedChunksOf(const PartSource& source) {
  std::string used(UsedChunksBytes(source.data_bytes), '\0');
  for (uint64_t chunk = 0; chunk < source.used_chunks.size() && chunk / 8 < used.size(); ++chunk) {
    if (source.used_chunks[chunk]) used[chunk / 8] |= static_cast<char>(1 << (chunk % 8));
  }
  return used;
}

// The data of an earlier part that heapd knows unchanged (the same
// unchanged token): its blocks marked in use (gc keeps them) and its ids
// taken into `data_ids`, none read again. False, changing nothing, if a
// block is gone.
bool ReuseUnchangedData(int root, const BlockStoreOptions& options, EarlierPart& earlier,
                        std::string* data_ids, Tally* tally) {
  absl::StatusOr<BlockStore> blocks = BlockStore::At(root, options);
  if (!blocks.ok()) return false;
  uint64_t named = 0;
  std::set<BlockId> bases;
  for (size_t i = 0; i * kBlockIdBytes < earlier.data_ids.size(); ++i) {
    const BlockId id = BlockId::FromRaw(PackedId(earlier.data_ids, i).data());
    if (id.IsZero()) continue;
    BlockId base;
    if (!blocks->Mark(id, &base)) return false;
    if (!base.IsZero()) bases.insert(base);
    ++named;
  }
  if (!blocks->Commit(&bases).ok()) return false;
  *data_ids = std::move(earlier.data_ids);
  tally->blocks = named;
  tally->reused = named;
  tally->bases = std::move(bases);
  return true;
}

// Stores the heap's metadata files as blocks, their ids in `recipe`
// (deltas against `earlier`'s, if given, block by block of each file).
absl::Status StoreMetadataBlocks(int root, const BlockStoreOptions& options,
                                 const PartSource& source, const EarlierPart* earlier,
                                 DeltaBudget& budget, v1::StoreRecipe* recipe, Tally* tally) {
  absl::StatusOr<BlockStore> blocks = BlockStore::At(root, options);
  if (!blocks.ok()) return blocks.status();
  for (const auto& [name, bytes] : source.metadata_files) {
    v1::StoreFile& stored = *recipe->add_metadata();
    stored.set_name(name);
    stored.set_bytes(bytes.size());
    std::string& ids = *stored.mutable_blocks();
    ids.assign((bytes.size() + source.block_bytes - 1) / source.block_bytes * kBlockIdBytes, '\0');
    const auto before = earlier != nullptr ? earlier->metadata_ids.find(name)
                                           : std::map<std::string, std::string>::const_iterator();
    for (uint64_t at = 0, i = 0; at < bytes.size(); at += source.block_bytes, ++i) {
      const BlockId base = earlier != nullptr && before != earlier->metadata_ids.end()
                               ? IdAt(before->second, i)
                               : BlockId();
      if (absl::Status s =
              PutBlock(*blocks, absl::string_view(bytes).substr(at, source.block_bytes), base,
                       budget, &ids[i * kBlockIdBytes], *tally);
          !s.ok()) {
        return s;
      }
    }
  }
  return blocks->Commit(&tally->bases);
}

// Publishes the encoded recipe of `part`: written under a random name
// first, then linked to its name (ALREADY_EXISTS if another got there
// first). The directories are made now: a removal of the version's other
// parts may have removed them meanwhile (made again once).
absl::Status PublishRecipe(int root, const PartRef& part, const std::string& encoded) {
  absl::StatusOr<UniqueFd> node = absl::NotFoundError("");
  for (int attempt = 0; attempt < 2 && node.status().code() == absl::StatusCode::kNotFound;
       ++attempt) {
    absl::StatusOr<UniqueFd> versions = MakeDirectoryAt(root, kVersions);
    absl::StatusOr<UniqueFd> version =
        versions.ok() ? MakeDirectoryAt(versions->get(), part.name) : versions.status();
    node = version.ok() ? MakeDirectoryAt(version->get(), part.node) : version.status();
  }
  if (!node.ok()) return node.status();
  const std::string temporary = absl::StrCat(".tmp-", RandomName());
  if (absl::Status s = WriteNewFileAt(node->get(), temporary, encoded); !s.ok()) return s;
  const std::string recipe_name = part.heap + kRecipeSuffix;
  const int linked = linkat(node->get(), temporary.c_str(), node->get(), recipe_name.c_str(), 0);
  const int err = errno;
  unlinkat(node->get(), temporary.c_str(), 0);
  if (linked != 0) {
    if (err == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat("part ", part.ToString(), " exists"));
    }
    return ErrnoStatus(err, absl::StrCat("publish part ", part.ToString()));
  }
  if (fsync(node->get()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("fsync the directory of part ", part.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::StoreUsage> WritePart(int root, const PartSource& source) {
  const PartRef& part = source.part;
  const uint64_t data_blocks =
      source.block_bytes == 0 ? 0
                              : (source.data_bytes + source.block_bytes - 1) / source.block_bytes;
  if (absl::Status s = CheckNewPart(root, source, data_blocks); !s.ok()) return s;
  absl::StatusOr<Lease> lease = Lease::Take(root);
  if (!lease.ok()) return lease.status();
  BlockStoreOptions options;
  options.zstd_level = source.zstd_level;
  // A recipe names at most one base per block: a heap whose ids would
  // take more than a quarter of a recipe is stored without deltas, so its
  // bases always fit beside them.
  options.deltas = source.deltas && 2 * data_blocks * kBlockIdBytes <= kMaxRecipeBytes / 2;
  // A block both workers meet is written by the first (counted once).
  absl::Mutex claims_mu;
  std::set<BlockId> claimed;  // under claims_mu
  options.claim = [&](const BlockId& id) {
    absl::MutexLock lock(&claims_mu);
    return claimed.insert(id).second;
  };

  RecipeFile file;
  file.manifest_json = source.manifest_json;
  v1::StoreUsage& usage = file.usage;
  v1::StoreRecipe& recipe = file.recipe;
  recipe.set_block_bytes(source.block_bytes);
  recipe.set_data_bytes(source.data_bytes);
  *recipe.mutable_used_chunks() = UsedChunksOf(source);
  // The data file's blocks, by `threads` workers (hashing and compressing
  // are the cost), each taking the next block; holes stay zero ids.
  std::string& data_ids = *recipe.mutable_data_blocks();
  data_ids.assign(data_blocks * kBlockIdBytes, '\0');
  const int threads = std::max(1, source.threads);
  std::vector<Tally> tallies(threads);
  std::atomic<bool> failed{false};  // one worker's failure stops the others
  NextIndex next_block(data_blocks);
  // The chunks heapd knows unchanged since an earlier part's mark.
  absl::StatusOr<EarlierPart> earlier = FindEarlierPart(root, source);
  const bool reusable = earlier.ok() && !earlier->unchanged && source.changes.has_value();
  DeltaBudget budget, metadata_budget;
  auto work = [&](int worker) {
    Tally& tally = tallies[worker];
    absl::StatusOr<BlockStore> blocks = BlockStore::At(root, options);
    if (!blocks.ok()) {
      tally.status = blocks.status();
      return;
    }
    std::string block(source.block_bytes, '\0');
    for (uint64_t i = 0; tally.status.ok() && !failed && next_block.Take(&i);) {
      const uint64_t at = i * source.block_bytes;
      const uint64_t chunk = at / kChunkSize;
      if (chunk >= source.used_chunks.size() || !source.used_chunks[chunk]) continue;
      const size_t length =
          static_cast<size_t>(std::min<uint64_t>(source.block_bytes, source.data_bytes - at));
      // A block within a chunk heapd knows unchanged since the earlier
      // part's mark, whole there too (blocks never span chunks). A hole
      // there is zeros if the chunk was used then; one free then may have
      // been written before that mark and committed since (no stamp says
      // so), and is read.
      if (reusable && source.changes->ChangedAt(chunk) <= earlier->mark &&
          at + length <= earlier->data_bytes && length == source.block_bytes &&
          (i + 1) * kBlockIdBytes <= earlier->data_ids.size()) {
        const BlockId id = BlockId::FromRaw(PackedId(earlier->data_ids, i).data());
        if (id.IsZero() && ChunkUsed(earlier->used_chunks, chunk)) continue;
        BlockId base;
        if (!id.IsZero() && blocks->Mark(id, &base)) {
          std::memcpy(&data_ids[i * kBlockIdBytes], id.hash.data(), kBlockIdBytes);
          if (!base.IsZero()) tally.bases.insert(base);
          ++tally.blocks;
          ++tally.reused;
          continue;
        }
      }
      if (!ReadAllAt(source.data_fd, block.data(), length, at)) {
        tally.status = ErrnoStatus(errno, absl::StrCat("read heap ", part.heap, "'s data at ", at));
        break;
      }
      tally.hashed_bytes += length;
      const absl::string_view bytes(block.data(), length);
      if (AllZero(bytes)) continue;  // a hole
      // The earlier part's block at this place, if of the same size, may
      // be a base: a block that changed often changed in a few places.
      const BlockId before = earlier.ok() && at + length <= earlier->data_bytes
                                 ? IdAt(earlier->data_ids, i)
                                 : BlockId();
      tally.status = PutBlock(*blocks, bytes, before, budget, &data_ids[i * kBlockIdBytes], tally);
    }
    if (tally.status.ok() && !failed) tally.status = blocks->Commit(&tally.bases);
    if (!tally.status.ok()) failed = true;
  };
  usage.set_source_token(source.unchanged_token);
  if (source.changes.has_value()) {
    usage.set_changes_token(absl::StrCat(source.changes->source, "/", source.changes->mark));
  }
  if (earlier.ok() && earlier->unchanged &&
      ReuseUnchangedData(root, options, *earlier, &data_ids, &tallies[0])) {
    usage.set_data_reused(true);
  } else {
    RunWorkers(threads, work);
  }
  for (const Tally& each : tallies) {
    if (!each.status.ok()) return each.status;
  }
  if (absl::Status s =
          StoreMetadataBlocks(root, options, source, earlier.ok() ? &*earlier : nullptr,
                              metadata_budget, &recipe, &tallies[0]);
      !s.ok()) {
    return s;
  }
  usage.set_logical_bytes(source.data_bytes);
  for (const auto& [name, bytes] : source.metadata_files) {
    usage.set_logical_bytes(usage.logical_bytes() + bytes.size());
  }
  for (const Tally& each : tallies) {
    usage.set_blocks(usage.blocks() + each.blocks);
    usage.set_blocks_written(usage.blocks_written() + each.written);
    usage.set_stored_bytes(usage.stored_bytes() + each.stored_bytes);
    usage.set_hashed_bytes(usage.hashed_bytes() + each.hashed_bytes);
    usage.set_reused_blocks(usage.reused_blocks() + each.reused);
    usage.set_delta_blocks(usage.delta_blocks() + each.deltas);
  }
  std::set<BlockId> bases;
  for (const Tally& each : tallies) bases.insert(each.bases.begin(), each.bases.end());
  for (const BlockId& base : bases) {
    recipe.mutable_delta_bases()->append(reinterpret_cast<const char*>(base.hash.data()),
                                         kBlockIdBytes);
  }
  const std::string encoded = EncodeRecipeFile(file);
  // A recipe readers would refuse is an error now, not at restore.
  if (encoded.size() > kMaxRecipeBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "part ", part.ToString(), " needs a recipe of ", encoded.size(), " bytes, more than the ",
        kMaxRecipeBytes, " a store reads (use larger blocks)"));
  }
  if (absl::Status s = PublishRecipe(root, part, encoded); !s.ok()) return s;
  return usage;
}

absl::StatusOr<std::string> ReadRecipeFile(int root, const PartRef& part, bool header_only,
                                           uint32_t* owner) {
  if (absl::Status s = ValidatePartRef(part); !s.ok()) return s;
  const std::string where = part.ToString();
  absl::StatusOr<UniqueFd> versions = OpenDirectoryAt(root, kVersions);
  absl::StatusOr<UniqueFd> version =
      versions.ok() ? OpenDirectoryAt(versions->get(), part.name) : versions.status();
  absl::StatusOr<UniqueFd> node =
      version.ok() ? OpenDirectoryAt(version->get(), part.node) : version.status();
  uint64_t size = 0;
  absl::StatusOr<UniqueFd> fd =
      node.ok() ? OpenRegularFileAt(node->get(), part.heap + kRecipeSuffix, &size) : node.status();
  if (!fd.ok()) {
    if (fd.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat("the store has no part ", where));
    }
    return fd.status();
  }
  if (size > kMaxRecipeBytes) {
    return absl::DataLossError(absl::StrCat("recipe ", where, " is larger than 64 MiB"));
  }
  if (owner != nullptr) {
    struct stat st;
    if (fstat(fd->get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat recipe ", where));
    *owner = st.st_uid;
  }
  uint64_t length = size;
  if (header_only) {
    char head[12];
    if (size < sizeof(head) || !ReadAllAt(fd->get(), head, sizeof(head), 0)) {
      return absl::DataLossError(absl::StrCat("recipe ", where, ": not a recipe file"));
    }
    absl::StatusOr<uint64_t> header =
        RecipeHeaderBytes(absl::string_view(head, sizeof(head)), where);
    if (!header.ok()) return header.status();
    length = std::min(size, *header);
  }
  std::string bytes(static_cast<size_t>(length), '\0');
  if (!ReadAllAt(fd->get(), bytes.data(), bytes.size(), 0)) {
    return absl::DataLossError(absl::StrCat("recipe ", where, " cannot be read whole"));
  }
  return bytes;
}

absl::StatusOr<std::vector<PartRef>> ListParts(int root, const std::string& name,
                                               size_t max_parts) {
  std::vector<PartRef> parts;
  absl::StatusOr<UniqueFd> versions = OpenDirectoryAt(root, kVersions);
  if (!versions.ok()) {
    if (versions.status().code() == absl::StatusCode::kNotFound) return parts;  // empty store
    return versions.status();
  }
  std::vector<std::string> names{name};
  if (name.empty()) {
    absl::StatusOr<std::vector<std::string>> all = ListDirectory(versions->get(), kMaxEntries);
    if (!all.ok()) return all.status();
    names = *std::move(all);
  }
  // Only a directory that is gone (removed meanwhile) is passed over: one
  // that cannot be read fails the listing, or gc would take its blocks.
  auto gone = [](const absl::Status& status) {
    return status.code() == absl::StatusCode::kNotFound;
  };
  for (const std::string& version : names) {
    if (!ValidateHeapName(version, "version").ok()) continue;  // not a version's
    absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(versions->get(), version);
    if (!dir.ok()) {
      if (!gone(dir.status())) return dir.status();
      if (!name.empty()) {
        return absl::NotFoundError(absl::StrCat("the store has no version ", name));
      }
      continue;
    }
    absl::StatusOr<std::vector<std::string>> nodes = ListDirectory(dir->get(), kMaxEntries);
    if (!nodes.ok()) return nodes.status();
    for (const std::string& node : *nodes) {
      if (!ValidateHeapName(node, "node").ok()) continue;
      absl::StatusOr<UniqueFd> node_dir = OpenDirectoryAt(dir->get(), node);
      if (!node_dir.ok()) {
        if (!gone(node_dir.status())) return node_dir.status();
        continue;
      }
      absl::StatusOr<std::vector<std::string>> files = ListDirectory(node_dir->get(), kMaxEntries);
      if (!files.ok()) return files.status();
      for (const std::string& file : *files) {
        if (!absl::EndsWith(file, kRecipeSuffix)) continue;
        PartRef part{version, node, file.substr(0, file.size() - (sizeof(kRecipeSuffix) - 1))};
        if (!ValidatePartRef(part).ok()) continue;
        if (parts.size() == max_parts) {
          return absl::ResourceExhaustedError(
              absl::StrCat("the store has more than ", max_parts, " parts"));
        }
        parts.push_back(std::move(part));
      }
    }
  }
  return parts;
}

absl::Status RemovePart(int root, const PartRef& part) {
  if (absl::Status s = ValidatePartRef(part); !s.ok()) return s;
  absl::StatusOr<UniqueFd> versions = OpenDirectoryAt(root, kVersions);
  absl::StatusOr<UniqueFd> version =
      versions.ok() ? OpenDirectoryAt(versions->get(), part.name) : versions.status();
  absl::StatusOr<UniqueFd> node =
      version.ok() ? OpenDirectoryAt(version->get(), part.node) : version.status();
  const std::string recipe = part.heap + kRecipeSuffix;
  if (!node.ok() || unlinkat(node->get(), recipe.c_str(), 0) != 0) {
    if (!node.ok() ? node.status().code() == absl::StatusCode::kNotFound : errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("the store has no part ", part.ToString()));
    }
    return node.ok() ? ErrnoStatus(errno, absl::StrCat("remove part ", part.ToString()))
                     : node.status();
  }
  if (fsync(node->get()) != 0) return ErrnoStatus(errno, "fsync after removing a part");
  // Empty directories go (another node may be adding a part: then rmdir
  // fails, or its mkdirat is retried by its create's next step failing).
  if (unlinkat(version->get(), part.node.c_str(), AT_REMOVEDIR) == 0) {
    (void)unlinkat(versions->get(), part.name.c_str(), AT_REMOVEDIR);
    (void)fsync(versions->get());
  }
  return absl::OkStatus();
}

absl::Status FetchBlocks(int root, const std::vector<WantedBlock>& wanted, int data_fd,
                         const std::string& what, MessageSink& out, int threads) {
  if (wanted.empty()) return absl::OkStatus();
  auto fetch = [&](BlockStore& blocks, const WantedBlock& block) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> bytes = blocks.Get(block.id);
    if (bytes.status().code() == absl::StatusCode::kNotFound) {
      return absl::DataLossError(
          absl::StrCat(what, " names block ", block.id.Hex(), ", which the store lacks"));
    }
    return bytes;
  };
  // Data blocks by `threads` workers (reading, decompressing and hashing
  // are the cost), written in place; metadata blocks sent, in order.
  threads = std::max(1, threads);
  std::vector<absl::Status> statuses(threads);
  std::atomic<bool> failed{false};  // one worker's failure stops the others
  NextIndex next_block(wanted.size());
  auto work = [&](int worker) {
    absl::StatusOr<BlockStore> blocks = BlockStore::At(root, {}, /*create=*/false);
    if (!blocks.ok()) {
      statuses[worker] =
          blocks.status().code() == absl::StatusCode::kNotFound
              ? absl::DataLossError(absl::StrCat(what, " names blocks; the store has none"))
              : blocks.status();
      return;
    }
    for (uint64_t i = 0; statuses[worker].ok() && !failed && next_block.Take(&i);) {
      const WantedBlock& block = wanted[i];
      if (block.offset < 0) continue;
      absl::StatusOr<std::string> bytes = fetch(*blocks, block);
      if (!bytes.ok()) {
        statuses[worker] = bytes.status();
      } else if (bytes->size() != block.length) {
        statuses[worker] =
            absl::DataLossError(absl::StrCat(what, ": the data block at ", block.offset, " has ",
                                             bytes->size(), " bytes, not ", block.length));
      } else if (data_fd >= 0 && !WriteAllAt(data_fd, *bytes, block.offset)) {
        statuses[worker] = ErrnoStatus(errno, absl::StrCat("write the data of ", what));
      }
    }
    if (!statuses[worker].ok()) failed = true;
  };
  RunWorkers(threads, work);
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  absl::StatusOr<BlockStore> blocks = BlockStore::At(root, {}, /*create=*/false);
  if (!blocks.ok()) return blocks.status();
  for (const WantedBlock& block : wanted) {
    if (block.offset >= 0) continue;
    absl::StatusOr<std::string> bytes = fetch(*blocks, block);
    if (!bytes.ok()) return bytes.status();
    std::string message(1, 'b');
    message.append(reinterpret_cast<const char*>(block.id.hash.data()), kBlockIdBytes);
    message += *bytes;
    if (absl::Status s = out.Send(message); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GcStoreResponse> CollectGarbage(int root, const GcOptions& options) {
  // The store's own clock: the time of a file made now (a shared file
  // system stamps it as it stamps blocks).
  absl::StatusOr<UniqueFd> leases = MakeDirectoryAt(root, kLeases);
  if (!leases.ok()) return leases.status();
  const std::string probe = absl::StrCat("gc-", RandomName());
  if (absl::Status s = WriteNewFileAt(leases->get(), probe, ""); !s.ok()) return s;
  absl::Cleanup remove_probe = [&] { unlinkat(leases->get(), probe.c_str(), 0); };
  struct stat st;
  if (fstatat(leases->get(), probe.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoStatus(errno, "stat gc's probe");
  }
  const int64_t now = ModifiedNs(st);
  const int64_t grace = absl::ToInt64Nanoseconds(options.grace);
  const int64_t expiry = absl::ToInt64Nanoseconds(options.lease_expiry);
  // First the creates in flight, then the recipes: a create that publishes
  // after the listing below began after its lease was seen.
  int64_t cutoff = now - grace;
  absl::StatusOr<std::vector<std::string>> held = ListDirectory(leases->get(), kMaxEntries);
  if (!held.ok()) return held.status();
  for (const std::string& lease : *held) {
    if (lease == probe || fstatat(leases->get(), lease.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      continue;
    }
    if (ModifiedNs(st) < now - expiry) {
      if (!options.dry_run) unlinkat(leases->get(), lease.c_str(), 0);  // a crashed create's
      continue;
    }
    cutoff = std::min(cutoff, ModifiedNs(st) - grace);
  }
  v1::GcStoreResponse result;
  std::set<BlockId> named;
  absl::StatusOr<std::vector<PartRef>> parts = ListParts(root, "", options.max_parts);
  if (!parts.ok()) return parts.status();
  uint64_t recipe_bytes = 0;
  for (const PartRef& part : *parts) {
    absl::StatusOr<RecipeFile> recipe = ReadRecipe(root, part, &recipe_bytes);
    if (recipe.status().code() == absl::StatusCode::kNotFound) continue;  // removed meanwhile
    // A recipe that cannot be read stops gc: its blocks are not swept.
    if (!recipe.ok()) return recipe.status();
    CollectIds(recipe->recipe, &named);
    result.set_versions(result.versions() + 1);
  }
  absl::StatusOr<BlockStore> blocks = BlockStore::At(root);
  if (!blocks.ok()) return blocks.status();
  using Kind = BlockStore::Kind;
  std::vector<BlockStore::Entry> candidates;
  absl::Status listed = blocks->ForEach([&](const BlockStore::Entry& entry) {
    const bool is_named = entry.kind != Kind::kTemporary && named.count(entry.id) != 0;
    if (entry.kind == Kind::kAside && (is_named || entry.modified_ns >= cutoff)) {
      // A crashed gc's, marked or named since: back in place.
      return options.dry_run ? absl::OkStatus() : blocks->PutBack(entry);
    }
    if (is_named) {
      result.set_blocks_kept(result.blocks_kept() + 1);
    } else if (entry.modified_ns >= cutoff) {
      if (entry.kind == Kind::kBlock) result.set_blocks_young(result.blocks_young() + 1);
    } else {
      candidates.push_back(entry);
    }
    return absl::OkStatus();
  });
  if (!listed.ok()) return listed;
  for (const BlockStore::Entry& entry : candidates) {
    bool removed = true;  // (in a dry run: would be)
    if (!options.dry_run && entry.kind != Kind::kBlock) {
      // Leftovers of a crashed writer or gc, old and unnamed.
      if (absl::Status s = blocks->Remove(entry); !s.ok()) return s;
    } else if (!options.dry_run) {
      absl::StatusOr<bool> gone = blocks->RemoveUnlessMarked(entry, cutoff);
      if (!gone.ok()) return gone.status();
      removed = *gone;
    }
    if (entry.kind == Kind::kTemporary) continue;  // not counted as blocks
    if (removed) {
      result.set_blocks_removed(result.blocks_removed() + 1);
      result.set_bytes_removed(result.bytes_removed() + entry.bytes);
    } else {
      result.set_blocks_young(result.blocks_young() + 1);
    }
  }
  if (absl::Status s = blocks->Commit(); !s.ok()) return s;
  return result;
}

absl::StatusOr<StoreTotals> AddUpUsage(int root, size_t max_parts, std::vector<PartUsage>* parts) {
  absl::StatusOr<std::vector<PartRef>> refs = ListParts(root, "", max_parts);
  if (!refs.ok()) return refs.status();
  StoreTotals totals;
  absl::StatusOr<BlockStore> blocks = BlockStore::At(root, {}, /*create=*/false);
  if (blocks.status().code() == absl::StatusCode::kNotFound && refs->empty()) return totals;
  if (!blocks.ok()) return blocks.status();
  // Each part's distinct ids, sorted; how many parts name each id.
  std::map<BlockId, uint32_t> parts_naming;
  std::vector<std::vector<BlockId>> ids;
  uint64_t recipe_bytes = 0;
  for (const PartRef& ref : *refs) {
    absl::StatusOr<RecipeFile> recipe = ReadRecipe(root, ref, &recipe_bytes);
    if (recipe.status().code() == absl::StatusCode::kNotFound) continue;  // removed meanwhile
    if (!recipe.ok()) return recipe.status();
    std::set<BlockId> named;
    CollectIds(recipe->recipe, &named);
    for (const BlockId& id : named) ++parts_naming[id];
    ids.emplace_back(named.begin(), named.end());
    PartUsage part;
    part.part = ref;
    part.header = EncodeRecipeFile({recipe->manifest_json, recipe->usage, {}});
    part.usage = recipe->usage;
    parts->push_back(std::move(part));
  }
  std::map<BlockId, uint64_t> sizes;
  for (const auto& [id, count] : parts_naming) {
    absl::StatusOr<uint64_t> size = blocks->StoredBytes(id);
    sizes[id] = size.ok() ? *size : 0;  // a missing block: verify says which
  }
  for (size_t i = 0; i < parts->size(); ++i) {
    v1::StoreUsage& usage = (*parts)[i].usage;
    uint64_t stored = 0, exclusive = 0;
    for (const BlockId& id : ids[i]) {
      stored += sizes[id];
      if (parts_naming[id] == 1) exclusive += sizes[id];
    }
    usage.set_blocks(ids[i].size());
    usage.set_stored_bytes(stored);
    usage.set_exclusive_bytes(exclusive);
  }
  absl::Status listed = blocks->ForEach([&](const BlockStore::Entry& entry) {
    if (entry.kind != BlockStore::Kind::kBlock) return absl::OkStatus();
    totals.stored_bytes += entry.bytes;
    ++totals.blocks;
    return absl::OkStatus();
  });
  if (!listed.ok()) return listed;
  return totals;
}

}  // namespace heapd
