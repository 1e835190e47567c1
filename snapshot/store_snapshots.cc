#include "snapshot/store_snapshots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "allocator/chunk_directory.h"
#include "allocator/size_class.h"
#include "heap/data_file.h"
#include "heap/heap_name.h"
#include "snapshot/block_store.h"
#include "snapshot/snapshot_format.h"
#include "snapshot/version_store.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/run_as.h"
#include "util/run_workers.h"

namespace heapd {
namespace {

// What work in a store sends back, one message each; the first byte says
// what it is.
constexpr char kUsageMessage = 'u';   // v1::StoreUsage
constexpr char kPartMessage = 'p';    // name\0node\0heap\0 recipe header [usage override]
constexpr char kRecipeMessage = 'r';  // name\0node\0heap\0 whole recipe file
constexpr char kBlockMessage = 'b';   // raw id, bytes (FetchBlocks)
constexpr char kTotalsMessage = 't';  // stored bytes u64, blocks u64
constexpr char kGcMessage = 'g';      // v1::GcStoreResponse
constexpr char kOthersMessage = 'o';  // parts of the version not selected, decimal
// What a listing or du may send back (a few KiB per part): heapd holds it
// while it builds the answer, outside the reading budget.
constexpr uint64_t kMaxListingBytes = uint64_t{64} << 20;

std::string Tagged(char kind, const PartRef& part) {
  std::string out(1, kind);
  for (const std::string* field : {&part.name, &part.node, &part.heap}) {
    out += *field;
    out.push_back('\0');
  }
  return out;
}

// Splits a Tagged message: the part, and what follows.
bool ParseTagged(absl::string_view in, PartRef* part, absl::string_view* rest) {
  in.remove_prefix(1);
  for (std::string* field : {&part->name, &part->node, &part->heap}) {
    const size_t zero = in.find('\0');
    if (zero == absl::string_view::npos) return false;
    *field = std::string(in.substr(0, zero));
    in.remove_prefix(zero + 1);
  }
  *rest = in;
  return ValidatePartRef(*part).ok();
}

// What a cached block file takes on disk, at least: whole 4 KiB blocks
// (a cache of tiny files must not run the file system out of inodes or
// space while its byte count looks small).
uint64_t CachedBytes(uint64_t file_bytes) { return (file_bytes + 4095) / 4096 * 4096 + 4096; }

// There is no default store: an empty directory would be heapd's own.
absl::Status CheckStoreDir(const std::string& store_dir) {
  if (store_dir.empty()) return absl::InvalidArgumentError("no snapshot store named");
  return absl::OkStatus();
}

absl::Status Malformed(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": malformed answer from its worker"));
}

// The one message of `kind` a worker had to send (kind byte included).
absl::StatusOr<absl::string_view> OnlyMessage(const std::vector<ChildMessage>& messages, char kind,
                                              const std::string& what) {
  if (messages.size() != 1 || messages[0].bytes.empty() || messages[0].bytes[0] != kind) {
    return Malformed(what);
  }
  return absl::string_view(messages[0].bytes);
}

std::string Describe(const PartSelector& which) {
  std::string out = absl::StrCat("version ", which.name);
  if (!which.node.empty()) absl::StrAppend(&out, " node ", which.node);
  if (!which.heap.empty()) absl::StrAppend(&out, " heap ", which.heap);
  return absl::StrCat(out, " in ", which.store_dir);
}

bool Matches(const PartRef& part, const PartSelector& which) {
  return (which.node.empty() || part.node == which.node) &&
         (which.heap.empty() || part.heap == which.heap);
}

// The one part `which` means.
absl::StatusOr<PartRef> PickPart(int root, const PartSelector& which, const std::string& this_node,
                                 size_t max_parts) {
  absl::StatusOr<std::vector<PartRef>> parts = ListParts(root, which.name, max_parts);
  if (!parts.ok()) return parts.status();
  std::vector<PartRef> matching;
  for (const PartRef& part : *parts) {
    if (Matches(part, which)) matching.push_back(part);
  }
  if (matching.size() > 1 && which.node.empty()) {
    std::vector<PartRef> here;
    for (const PartRef& part : matching) {
      if (part.node == this_node) here.push_back(part);
    }
    if (here.size() == 1) matching = here;
  }
  if (matching.size() == 1) return matching[0];
  if (matching.empty()) {
    return absl::NotFoundError(absl::StrCat("the store has no part matching ", Describe(which)));
  }
  std::vector<std::string> names;
  for (const PartRef& part : matching) names.push_back(absl::StrCat(part.node, "/", part.heap));
  return absl::FailedPreconditionError(absl::StrCat(Describe(which), " has ", matching.size(),
                                                    " parts (", absl::StrJoin(names, ", "),
                                                    "); name one with --from_node=NODE and "
                                                    "--from_heap=HEAP (from_node, from_heap)"));
}

// The work in a store, run by SnapshotStore::RunIn as the caller. Each job
// reads its arguments in the order its caller below writes them.

ArgsWriter& AddSelector(ArgsWriter& args, const PartSelector& which) {
  return args.Add(which.name).Add(which.node).Add(which.heap);
}

bool NextSelector(ArgsReader& args, PartSelector* which) {
  return args.Next(&which->name) && args.Next(&which->node) && args.Next(&which->heap);
}

std::string EncodePartSource(const PartSource& source) {
  ArgsWriter args;
  args.Add(source.part.name).Add(source.part.node).Add(source.part.heap);
  args.Add(source.manifest_json).Add(source.data_bytes);
  args.Add(std::string(source.used_chunks.begin(), source.used_chunks.end()));
  args.Add(source.metadata_files).Add(uint64_t{source.block_bytes});
  args.Add(static_cast<uint64_t>(static_cast<int64_t>(source.zstd_level)));
  args.Add(uint64_t{source.deltas});
  args.Add(static_cast<uint64_t>(source.threads)).Add(source.unchanged_token);
  const ChunkChanges none;
  const ChunkChanges& changes = source.changes.has_value() ? *source.changes : none;
  args.Add(uint64_t{source.changes.has_value()}).Add(changes.source).Add(changes.mark);
  args.Add(changes.changed_at).Add(changes.all_changed_at).Add(uint64_t{source.max_parts});
  return args.Take();
}

// Stores the part described by the arguments from the lent data file;
// sends kUsageMessage.
absl::Status WritePartJob(JobInput& input, MessageSink& out) {
  PartSource source;
  std::string used_chunks;
  uint64_t block_bytes = 0, zstd_level = 0, deltas = 0, threads = 0, has_changes = 0, max_parts = 0;
  ChunkChanges changes;
  ArgsReader& args = input.args;
  if (!args.Next(&source.part.name) || !args.Next(&source.part.node) ||
      !args.Next(&source.part.heap) || !args.Next(&source.manifest_json) ||
      !args.Next(&source.data_bytes) || !args.Next(&used_chunks) ||
      !args.Next(&source.metadata_files) || !args.Next(&block_bytes) || !args.Next(&zstd_level) ||
      !args.Next(&deltas) || !args.Next(&threads) || !args.Next(&source.unchanged_token) ||
      !args.Next(&has_changes) || !args.Next(&changes.source) || !args.Next(&changes.mark) ||
      !args.Next(&changes.changed_at) || !args.Next(&changes.all_changed_at) ||
      !args.Next(&max_parts) || !args.Done() || input.fds.size() != 1) {
    return MalformedJobArgs();
  }
  source.data_fd = input.fds[0];
  for (char used : used_chunks) source.used_chunks.push_back(used != 0);
  source.block_bytes = static_cast<uint32_t>(block_bytes);
  source.zstd_level = static_cast<int>(static_cast<int64_t>(zstd_level));
  source.deltas = deltas != 0;
  source.threads = static_cast<int>(threads);
  if (has_changes != 0) source.changes = std::move(changes);
  source.max_parts = max_parts;
  absl::StatusOr<v1::StoreUsage> usage = WritePart(input.dir, source);
  if (!usage.ok()) return usage.status();
  return out.Send(std::string(1, kUsageMessage) + usage->SerializeAsString());
}
HEAPD_RUN_AS_JOB(kWritePartJob, "store.write_part", WritePartJob);

// Sends each part's recipe header (kPartMessage) of version `name` (all
// versions if empty).
absl::Status ListPartsJob(JobInput& input, MessageSink& out) {
  std::string name;
  uint64_t max_parts = 0;
  if (!input.args.Next(&name) || !input.args.Next(&max_parts) || !input.args.Done()) {
    return MalformedJobArgs();
  }
  const int root = input.dir;
  absl::StatusOr<std::vector<PartRef>> parts = ListParts(root, name, max_parts);
  if (!parts.ok()) return parts.status();
  for (const PartRef& part : *parts) {
    absl::StatusOr<std::string> header = ReadRecipeFile(root, part, /*header_only=*/true);
    if (!header.ok()) continue;  // removed meanwhile, or damaged: left out
    if (absl::Status s = out.Send(Tagged(kPartMessage, part) + *header); !s.ok()) return s;
  }
  return absl::OkStatus();
}
HEAPD_RUN_AS_JOB(kListPartsJob, "store.list_parts", ListPartsJob);

// Sends the whole recipe file of the one part the selector picks
// (kRecipeMessage).
absl::Status ReadRecipeJob(JobInput& input, MessageSink& out) {
  PartSelector which;
  std::string this_node;
  uint64_t max_parts = 0;
  if (!NextSelector(input.args, &which) || !input.args.Next(&this_node) ||
      !input.args.Next(&max_parts) || !input.args.Done()) {
    return MalformedJobArgs();
  }
  absl::StatusOr<PartRef> part = PickPart(input.dir, which, this_node, max_parts);
  if (!part.ok()) return part.status();
  absl::StatusOr<std::string> recipe = ReadRecipeFile(input.dir, *part, /*header_only=*/false);
  if (!recipe.ok()) return recipe.status();
  return out.Send(Tagged(kRecipeMessage, *part) + *recipe);
}
HEAPD_RUN_AS_JOB(kReadRecipeJob, "store.read_recipe", ReadRecipeJob);

// Fetches blocks into the lent data file, or as messages (FetchBlocks).
absl::Status FetchBlocksJob(JobInput& input, MessageSink& out) {
  uint64_t count = 0, threads = 0;
  std::string where;
  ArgsReader& args = input.args;
  if (!args.Next(&count) || input.fds.size() > 1) return MalformedJobArgs();
  std::vector<WantedBlock> wanted;
  for (uint64_t i = 0; i < count; ++i) {
    std::string id;
    uint64_t offset = 0;
    WantedBlock block;
    if (!args.Next(&id) || id.size() != kBlockIdBytes || !args.Next(&offset) ||
        !args.Next(&block.length)) {
      return MalformedJobArgs();
    }
    block.id = BlockId::FromRaw(id.data());
    block.offset = static_cast<int64_t>(offset);
    wanted.push_back(block);
  }
  if (!args.Next(&where) || !args.Next(&threads) || !args.Done()) return MalformedJobArgs();
  return FetchBlocks(input.dir, wanted, input.fds.empty() ? -1 : input.fds[0], where, out,
                     static_cast<int>(threads));
}
HEAPD_RUN_AS_JOB(kFetchBlocksJob, "store.fetch_blocks", FetchBlocksJob);

// Sends each part the selector picks (kPartMessage), removing it first if
// asked, then how many parts of the version it did not pick
// (kOthersMessage).
absl::Status SelectPartsJob(JobInput& input, MessageSink& out) {
  PartSelector which;
  uint64_t max_parts = 0, remove = 0;
  if (!NextSelector(input.args, &which) || !input.args.Next(&max_parts) ||
      !input.args.Next(&remove) || !input.args.Done()) {
    return MalformedJobArgs();
  }
  const int root = input.dir;
  absl::StatusOr<std::vector<PartRef>> parts = ListParts(root, which.name, max_parts);
  if (!parts.ok()) return parts.status();
  size_t unselected = 0;
  for (const PartRef& part : *parts) {
    if (!Matches(part, which)) {
      ++unselected;
      continue;
    }
    if (remove) {
      if (absl::Status s = RemovePart(root, part); !s.ok()) return s;
    }
    if (absl::Status s = out.Send(Tagged(kPartMessage, part)); !s.ok()) return s;
  }
  return out.Send(absl::StrCat(std::string(1, kOthersMessage), unselected));
}
HEAPD_RUN_AS_JOB(kSelectPartsJob, "store.select_parts", SelectPartsJob);

// Collects the store's garbage; sends kGcMessage.
absl::Status CollectGarbageJob(JobInput& input, MessageSink& out) {
  uint64_t grace_ns = 0, lease_expiry_ns = 0, dry_run = 0, max_parts = 0;
  if (!input.args.Next(&grace_ns) || !input.args.Next(&lease_expiry_ns) ||
      !input.args.Next(&dry_run) || !input.args.Next(&max_parts) || !input.args.Done()) {
    return MalformedJobArgs();
  }
  GcOptions gc;
  gc.grace = absl::Nanoseconds(static_cast<int64_t>(grace_ns));
  gc.lease_expiry = absl::Nanoseconds(static_cast<int64_t>(lease_expiry_ns));
  gc.dry_run = dry_run != 0;
  gc.max_parts = max_parts;
  absl::StatusOr<v1::GcStoreResponse> result = heapd::CollectGarbage(input.dir, gc);
  if (!result.ok()) return result.status();
  return out.Send(std::string(1, kGcMessage) + result->SerializeAsString());
}
HEAPD_RUN_AS_JOB(kCollectGarbageJob, "store.gc", CollectGarbageJob);

// Sends each part's header with its usage (kPartMessage), then the
// store's totals (kTotalsMessage).
absl::Status StoreUsageJob(JobInput& input, MessageSink& out) {
  uint64_t max_parts = 0;
  if (!input.args.Next(&max_parts) || !input.args.Done()) return MalformedJobArgs();
  const int root = input.dir;
  std::vector<PartUsage> parts;
  absl::StatusOr<StoreTotals> totals = AddUpUsage(root, max_parts, &parts);
  if (!totals.ok()) return totals.status();
  for (const PartUsage& part : parts) {
    const std::string usage = part.usage.SerializeAsString();
    std::string message = Tagged(kPartMessage, part.part) + part.header;
    // The usage in the store follows, after a zero byte.
    if (absl::Status s = out.Send(message + std::string(1, '\0') + usage); !s.ok()) return s;
  }
  std::string message(1, kTotalsMessage);
  message.append(reinterpret_cast<const char*>(&totals->stored_bytes), 8);
  message.append(reinterpret_cast<const char*>(&totals->blocks), 8);
  return out.Send(message);
}
HEAPD_RUN_AS_JOB(kStoreUsageJob, "store.usage", StoreUsageJob);

// A distinct data block of a part being restored: written at `at` (its
// other offsets are copies).
struct DataBlock {
  BlockId id;
  uint64_t at = 0;
  uint64_t length = 0;
  bool cached = false;  // written from the cache
};

// What a restore reads, and where it goes.
struct BlockPlan {
  uint64_t block_bytes = 0;
  std::map<BlockId, std::string> metadata_blocks;  // empty: to fetch
  std::vector<WantedBlock> wanted;                 // from the store
  std::vector<DataBlock> distinct;
  std::vector<std::pair<uint64_t, size_t>> copies;  // offset, index in distinct
};

// "part NAME/NODE/HEAP in STORE", for errors.
std::string PartWhere(const PartRef& part, const std::string& store_dir) {
  return absl::StrCat("part ", part.ToString(), " in ", store_dir);
}

// The fetch job's arguments (FetchBlocksJob reads them).
std::string EncodeWantedBlocks(const std::vector<WantedBlock>& wanted, const std::string& where,
                               int threads) {
  ArgsWriter fetch;
  fetch.Add(uint64_t{wanted.size()});
  for (const WantedBlock& block : wanted) {
    fetch.Add(absl::string_view(reinterpret_cast<const char*>(block.id.hash.data()), kBlockIdBytes))
        .Add(static_cast<uint64_t>(block.offset))
        .Add(block.length);
  }
  fetch.Add(where).Add(static_cast<uint64_t>(threads));
  return fetch.Take();
}

// Runs work(worker, block) over `distinct` on `threads` workers (each
// taking the next block); the first failure stops them all and is
// returned.
absl::Status ForEachDataBlock(int threads, std::vector<DataBlock>& distinct,
                              const std::function<absl::Status(int worker, DataBlock&)>& work) {
  std::vector<absl::Status> failures(threads);
  std::atomic<bool> failed{false};
  NextIndex next_block(distinct.size());
  RunWorkers(threads, [&](int worker) {
    for (uint64_t k = 0; failures[worker].ok() && !failed && next_block.Take(&k);) {
      failures[worker] = work(worker, distinct[k]);
    }
    if (!failures[worker].ok()) failed = true;
  });
  for (const absl::Status& failure : failures) {
    if (!failure.ok()) return failure;
  }
  return absl::OkStatus();
}

// What a restore reads of `recipe`: its metadata blocks, from `cache`
// (null: none) or wanted from the store, each once; its data blocks, each
// distinct one once at its first offset, and where copies of them go.
BlockPlan PlanBlocks(const v1::StoreRecipe& recipe, BlockStore* cache) {
  BlockPlan plan;
  plan.block_bytes = recipe.block_bytes();
  for (const v1::StoreFile& stored : recipe.metadata()) {
    for (size_t i = 0; i * kBlockIdBytes < stored.blocks().size(); ++i) {
      const BlockId id = BlockId::FromRaw(PackedId(stored.blocks(), i).data());
      if (plan.metadata_blocks.count(id) != 0) continue;
      absl::StatusOr<std::string> cached =
          cache != nullptr ? cache->Get(id) : absl::NotFoundError("no cache");
      if (cached.ok()) {
        plan.metadata_blocks[id] = *std::move(cached);
      } else {
        plan.metadata_blocks[id];  // wanted once
        plan.wanted.push_back({id, -1, 0});
      }
    }
  }
  std::map<BlockId, size_t> index_of;
  for (size_t i = 0; i * kBlockIdBytes < recipe.data_blocks().size(); ++i) {
    const BlockId id = BlockId::FromRaw(PackedId(recipe.data_blocks(), i).data());
    if (id.IsZero()) continue;
    const uint64_t at = i * plan.block_bytes;
    auto [it, added] = index_of.emplace(id, plan.distinct.size());
    if (!added) {
      plan.copies.emplace_back(at, it->second);
      continue;
    }
    plan.distinct.push_back({id, at, std::min(plan.block_bytes, recipe.data_bytes() - at)});
  }
  return plan;
}

// Each metadata file of `recipe` from its blocks. Each piece is a whole
// block but the last: a file is never assembled past the size its recipe
// gives (and was charged).
absl::Status AssembleMetadata(const v1::StoreRecipe& recipe,
                              std::map<BlockId, std::string>& metadata_blocks,
                              const std::string& where, std::map<std::string, std::string>* files) {
  for (const v1::StoreFile& stored : recipe.metadata()) {
    std::string& bytes = (*files)[stored.name()];
    for (size_t i = 0; i * kBlockIdBytes < stored.blocks().size(); ++i) {
      const std::string& piece =
          metadata_blocks[BlockId::FromRaw(PackedId(stored.blocks(), i).data())];
      if (piece.size() != std::min<uint64_t>(recipe.block_bytes(), stored.bytes() - bytes.size())) {
        return absl::DataLossError(absl::StrCat(where, ": block ", i, " of its file ",
                                                stored.name(), " has ", piece.size(), " bytes"));
      }
      bytes += piece;
    }
  }
  return absl::OkStatus();
}

// Writes each repeated data block at its other offsets, from where it was
// restored first.
absl::Status CopyRepeatedBlocks(int data_fd, const v1::StoreRecipe& recipe, const BlockPlan& plan,
                                const std::string& where) {
  std::string block;
  for (const auto& [at, k] : plan.copies) {
    const DataBlock& first = plan.distinct[k];
    const uint64_t length = std::min<uint64_t>(recipe.block_bytes(), recipe.data_bytes() - at);
    if (length != first.length) {
      return absl::DataLossError(absl::StrCat(where, ": block ", first.id.Hex(), " named at ",
                                              first.at, " and at ", at, " with other sizes"));
    }
    block.resize(length);
    if (!ReadAllAt(data_fd, block.data(), length, first.at) || !WriteAllAt(data_fd, block, at)) {
      return ErrnoStatus(errno, absl::StrCat("copy a repeated block restored from ", where));
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct StoreSnapshots::ReadPart {
  // What heapd holds of it, counted against its reading budget.
  std::optional<SnapshotStore::ReadingCharge> charge;
  PartRef part;
  std::string manifest_json;
  v1::SnapshotManifest manifest;
  std::map<std::string, std::string> metadata_files;
  uint64_t fetched_blocks = 0;
};

absl::StatusOr<std::unique_ptr<StoreSnapshots>> StoreSnapshots::Open(
    SnapshotStore* snapshots, StoreSnapshotsOptions options) {
  if (absl::Status s = ValidateHeapName(options.node, "node"); !s.ok()) return s;
  if (!ValidBlockBytes(options.block_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a block size of ", options.block_bytes,
                     " bytes is not a power of two from 64 KiB to 2 MiB"));
  }
  UniqueFd cache;
  if (!options.cache_dir.empty()) {
    if (mkdir(options.cache_dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("create block cache ", options.cache_dir));
    }
    cache.reset(open(options.cache_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (!cache.valid() || fstat(cache.get(), &st) != 0) {
      return ErrnoStatus(errno, absl::StrCat("open block cache ", options.cache_dir));
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("block cache ", options.cache_dir,
                                                        " must be this user's and no one else's"));
    }
  }
  std::unique_ptr<StoreSnapshots> store(
      new StoreSnapshots(snapshots, std::move(options), std::move(cache)));
  if (store->cache_.valid()) {
    // What the cache holds (each user's blocks apart), and no leftovers.
    absl::StatusOr<std::vector<std::string>> uids = ListDirectory(store->cache_.get(), 1 << 20);
    if (!uids.ok()) return uids.status();
    uint64_t bytes = 0;
    for (const std::string& uid : *uids) {
      absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(store->cache_.get(), uid);
      absl::StatusOr<BlockStore> blocks =
          dir.ok() ? BlockStore::At(dir->get(), {}, /*create=*/false) : dir.status();
      if (!blocks.ok()) continue;
      absl::Status counted = blocks->ForEach([&](const BlockStore::Entry& entry) {
        if (entry.kind != BlockStore::Kind::kBlock) return blocks->Remove(entry);
        bytes += CachedBytes(entry.bytes);
        return absl::OkStatus();
      });
      if (!counted.ok()) return counted;
    }
    store->cache_bytes_ = bytes;
    store->TrimCache();
  }
  return store;
}

absl::StatusOr<v1::SnapshotManifest> StoreSnapshots::Create(
    const SnapshotCaller& caller, PersistentHeap& heap, const std::string& heap_name,
    const v1::HeapInfo& source, const std::string& store_dir, const std::string& name,
    const std::map<std::string, std::string>& labels,
    const std::function<std::string()>& unchanged_token) {
  if (absl::Status s = CheckStoreDir(store_dir); !s.ok()) return s;
  const PartRef part{name, options_.node, heap_name};
  if (absl::Status s = ValidatePartRef(part); !s.ok()) return s;
  if (absl::Status s = ValidateLabels(labels); !s.ok()) return s;
  const std::string what = absl::StrCat("store part ", part.ToString(), " in ", store_dir);
  const absl::Time start = absl::Now();
  v1::SnapshotManifest manifest;
  manifest.set_name(name);
  manifest.set_heap(heap_name);
  manifest.mutable_labels()->insert(labels.begin(), labels.end());
  *manifest.mutable_source() = source;
  manifest.set_created_by_uid(caller.credentials.uid);
  manifest.set_node(options_.node);
  absl::Status status = heap.WithCommittedState([&](const CommittedState& state) -> absl::Status {
    manifest.set_epoch(state.epoch);
    manifest.set_data_bytes(state.data_bytes);
    manifest.set_created_unix_ns(absl::ToUnixNanos(absl::Now()));
    for (const auto& [file, bytes] : state.metadata_files) {
      (*manifest.mutable_metadata_crc32())[file] = MetadataCrc32(bytes);
    }
    PartSource stored;
    stored.part = part;
    stored.manifest_json = ManifestToJson(manifest);
    // The chunks to store are those of the committed epoch, as its
    // metadata says (checked as a snapshot's would be).
    absl::StatusOr<VerifiedSnapshot> verified =
        VerifySnapshotFiles(what, stored.manifest_json, state.metadata_files, state.data_bytes);
    if (!verified.ok()) return verified.status();
    absl::StatusOr<std::vector<bool>> used = UsedChunks(verified->metadata.state);
    if (!used.ok()) return used.status();
    stored.used_chunks = *std::move(used);
    // The helper gets only a read-only descriptor of the heap's data.
    absl::StatusOr<int> data = heap.OpenCommittedData();
    if (!data.ok()) return data.status();
    UniqueFd data_fd(*data);
    stored.data_fd = data_fd.get();
    stored.data_bytes = state.data_bytes;
    for (const auto& [file, bytes] : state.metadata_files) stored.metadata_files[file] = bytes;
    stored.block_bytes = options_.block_bytes;
    stored.zstd_level = options_.zstd_level;
    stored.deltas = options_.deltas;
    stored.threads = options_.threads;
    stored.max_parts = options_.max_parts;
    stored.changes = state.changes;
    if (const std::string token = unchanged_token ? unchanged_token() : ""; !token.empty()) {
      stored.unchanged_token = absl::StrCat(token, "/", state.epoch);
    }
    absl::StatusOr<std::vector<ChildMessage>> messages = snapshots_->RunIn(
        caller, store_dir, kWritePartJob, EncodePartSource(stored), {data_fd.get()}, what);
    if (!messages.ok()) return messages.status();
    absl::StatusOr<absl::string_view> usage = OnlyMessage(*messages, kUsageMessage, what);
    if (!usage.ok()) return usage.status();
    if (!manifest.mutable_store()->ParseFromArray(usage->data() + 1,
                                                  static_cast<int>(usage->size() - 1))) {
      return Malformed(what);
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  manifest.mutable_store()->set_duration_us(absl::ToInt64Microseconds(absl::Now() - start));
  return manifest;
}

absl::StatusOr<std::vector<v1::SnapshotManifest>> StoreSnapshots::List(const SnapshotCaller& caller,
                                                                       const std::string& store_dir,
                                                                       const std::string& name) {
  if (absl::Status s = CheckStoreDir(store_dir); !s.ok()) return s;
  const std::string what = absl::StrCat("list store ", store_dir);
  const size_t max_parts = options_.max_parts;
  absl::StatusOr<std::vector<ChildMessage>> messages = snapshots_->RunIn(
      caller, store_dir, kListPartsJob, ArgsWriter().Add(name).Add(uint64_t{max_parts}).Take(), {},
      what, kMaxListingBytes);
  if (!messages.ok()) return messages.status();
  std::vector<v1::SnapshotManifest> manifests;
  for (const ChildMessage& message : *messages) {
    PartRef part;
    absl::string_view header;
    if (message.bytes.empty() || message.bytes[0] != kPartMessage ||
        !ParseTagged(message.bytes, &part, &header)) {
      return Malformed(what);
    }
    absl::StatusOr<RecipeFile> file =
        DecodeRecipeFile(header, part.ToString(), /*header_only=*/true);
    if (!file.ok()) continue;
    absl::StatusOr<v1::SnapshotManifest> manifest =
        ParseManifest(file->manifest_json, part.ToString());
    if (!manifest.ok() || manifest->name() != part.name || manifest->heap() != part.heap ||
        manifest->node() != part.node) {
      continue;  // damaged or misplaced: left out, as damaged snapshots are
    }
    *manifest->mutable_store() = file->usage;
    manifests.push_back(*std::move(manifest));
  }
  std::sort(manifests.begin(), manifests.end(), [](const auto& a, const auto& b) {
    return std::tie(a.name(), a.node(), a.heap()) < std::tie(b.name(), b.node(), b.heap());
  });
  return manifests;
}

absl::StatusOr<v1::StoreRecipe> StoreSnapshots::ReadRecipe(const SnapshotCaller& caller,
                                                           const PartSelector& which,
                                                           uint64_t max_data_bytes,
                                                           ReadPart* read) {
  const std::string what = absl::StrCat("read ", Describe(which));
  ArgsWriter args;
  AddSelector(args, which).Add(options_.node).Add(uint64_t{options_.max_parts});
  absl::StatusOr<std::vector<ChildMessage>> messages =
      snapshots_->RunIn(caller, which.store_dir, kReadRecipeJob, args.Take(), {}, what);
  if (!messages.ok()) return messages.status();
  absl::string_view bytes;
  absl::StatusOr<absl::string_view> recipe_message = OnlyMessage(*messages, kRecipeMessage, what);
  if (!recipe_message.ok()) return recipe_message.status();
  if (!ParseTagged(*recipe_message, &read->part, &bytes) || !Matches(read->part, which)) {
    return Malformed(what);
  }
  const std::string where = PartWhere(read->part, which.store_dir);
  absl::StatusOr<RecipeFile> file = DecodeRecipeFile(bytes, where);
  if (!file.ok()) return file.status();
  // Held until the caller is done: the metadata it assembles (a recipe may
  // name one block many times: it is assembled up to the sizes the recipe
  // gives, no further) and tables of the recipe's ids, a dozen times its
  // size.
  uint64_t held = 12 * bytes.size();
  for (const v1::StoreFile& stored : file->recipe.metadata()) held += stored.bytes();
  absl::StatusOr<SnapshotStore::ReadingCharge> charge = snapshots_->ChargeReading(held, what);
  if (!charge.ok()) return charge.status();
  read->charge.emplace(*std::move(charge));
  absl::StatusOr<v1::SnapshotManifest> manifest = ParseManifest(file->manifest_json, where);
  if (!manifest.ok()) return manifest.status();
  const v1::StoreRecipe& recipe = file->recipe;
  if (manifest->name() != read->part.name || manifest->heap() != read->part.heap ||
      manifest->node() != read->part.node || manifest->data_bytes() != recipe.data_bytes()) {
    return absl::DataLossError(absl::StrCat(where, ": its manifest describes another part"));
  }
  if (recipe.data_bytes() > max_data_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(where, " holds ", recipe.data_bytes(),
                                                     " bytes of data; at most ", max_data_bytes,
                                                     " are allowed here"));
  }
  read->manifest_json = std::move(file->manifest_json);
  read->manifest = *std::move(manifest);
  read->manifest.set_node(read->part.node);
  *read->manifest.mutable_store() = file->usage;
  return std::move(file->recipe);
}

absl::StatusOr<std::vector<BlockId>> StoreSnapshots::FetchFromStore(
    const SnapshotCaller& caller, const PartSelector& which, const std::vector<WantedBlock>& wanted,
    uint64_t block_bytes, int data_fd, const std::string& where,
    std::map<BlockId, std::string>* metadata_blocks) {
  const std::string what = absl::StrCat("read ", Describe(which));
  std::vector<int> keep;
  if (data_fd >= 0) keep.push_back(data_fd);
  absl::StatusOr<std::vector<ChildMessage>> messages = snapshots_->RunIn(
      caller, which.store_dir, kFetchBlocksJob,
      EncodeWantedBlocks(wanted, where, std::max(1, options_.threads)), keep, what);
  if (!messages.ok()) return messages.status();
  std::vector<BlockId> fetched_metadata;
  for (ChildMessage& message : *messages) {
    if (message.bytes.size() < 1 + kBlockIdBytes || message.bytes[0] != kBlockMessage) {
      return Malformed(what);
    }
    const BlockId id = BlockId::FromRaw(message.bytes.data() + 1);
    auto slot = metadata_blocks->find(id);
    message.bytes.erase(0, 1 + kBlockIdBytes);
    if (slot == metadata_blocks->end() || message.bytes.size() > block_bytes ||
        BlockId::Of(message.bytes) != id) {
      return Malformed(what);
    }
    slot->second = std::move(message.bytes);
    fetched_metadata.push_back(id);
  }
  return fetched_metadata;
}

absl::StatusOr<StoreSnapshots::ReadPart> StoreSnapshots::ReadWhole(const SnapshotCaller& caller,
                                                                   const PartSelector& which,
                                                                   int data_fd,
                                                                   uint64_t max_data_bytes) {
  if (absl::Status s = CheckStoreDir(which.store_dir); !s.ok()) return s;
  ReadPart read;
  absl::StatusOr<v1::StoreRecipe> recipe = ReadRecipe(caller, which, max_data_bytes, &read);
  if (!recipe.ok()) return recipe.status();
  const std::string where = PartWhere(read.part, which.store_dir);

  // What to fetch: what the caller's part of the cache lacks (everything,
  // to verify), each block once; data blocks the cache has are written now.
  // A restore larger than half the cache would only churn it. The cache is
  // read and filled by `threads` workers, each with its own BlockStore.
  const int threads = std::max(1, options_.threads);
  std::vector<std::optional<BlockStore>> caches(threads);
  if (data_fd >= 0 && recipe->data_bytes() <= options_.cache_bytes / 2) {
    for (std::optional<BlockStore>& cache : caches) cache = CacheOf(caller.credentials.uid);
  }
  const bool use_cache = std::all_of(caches.begin(), caches.end(),
                                     [](const auto& cache) { return cache.has_value(); });
  BlockPlan plan = PlanBlocks(*recipe, use_cache ? &*caches[0] : nullptr);
  if (data_fd >= 0 && ftruncate(data_fd, static_cast<off_t>(recipe->data_bytes())) != 0) {
    return ErrnoStatus(errno, absl::StrCat("size the data file restored from ", where));
  }
  if (use_cache) {
    absl::Status written =
        ForEachDataBlock(threads, plan.distinct, [&](int worker, DataBlock& block) {
          absl::StatusOr<std::string> cached = caches[worker]->Get(block.id);
          if (!cached.ok() || cached->size() != block.length) return absl::OkStatus();  // fetched
          if (!WriteAllAt(data_fd, *cached, block.at)) {
            return ErrnoStatus(errno, absl::StrCat("write the data restored from ", where));
          }
          block.cached = true;
          return absl::OkStatus();
        });
    if (!written.ok()) return written;
  }
  for (const DataBlock& block : plan.distinct) {
    if (!block.cached) {
      plan.wanted.push_back({block.id, static_cast<int64_t>(block.at), block.length});
    }
  }
  read.fetched_blocks = plan.wanted.size();
  absl::StatusOr<std::vector<BlockId>> fetched_metadata = FetchFromStore(
      caller, which, plan.wanted, plan.block_bytes, data_fd, where, &plan.metadata_blocks);
  if (!fetched_metadata.ok()) return fetched_metadata.status();
  if (absl::Status s = AssembleMetadata(*recipe, plan.metadata_blocks, where, &read.metadata_files);
      !s.ok()) {
    return s;
  }
  if (data_fd < 0) return read;
  // Fetched blocks enter the cache only once the part is checked whole
  // (a restore that fails leaves nothing cached), and only as heapd itself
  // hashed them.
  if (use_cache) {
    absl::StatusOr<VerifiedSnapshot> checked = VerifySnapshotFiles(
        where, read.manifest_json, read.metadata_files, read.manifest.data_bytes());
    if (!checked.ok()) return checked.status();
    for (const BlockId& id : *fetched_metadata) Cache(*caches[0], plan.metadata_blocks[id]);
    absl::Status cached =
        ForEachDataBlock(threads, plan.distinct, [&](int worker, DataBlock& block) {
          if (block.cached) return absl::OkStatus();
          std::string bytes(block.length, '\0');
          if (!ReadAllAt(data_fd, bytes.data(), bytes.size(), block.at)) {
            return ErrnoStatus(errno, absl::StrCat("read back the data restored from ", where));
          }
          if (BlockId::Of(bytes) != block.id) {
            return absl::DataLossError(absl::StrCat(where, ": block ", block.id.Hex(),
                                                    " as restored does not have its hash"));
          }
          Cache(*caches[worker], bytes);
          return absl::OkStatus();
        });
    if (!cached.ok()) return cached;
    for (std::optional<BlockStore>& cache : caches) (void)cache->Commit();
  }
  if (absl::Status s = CopyRepeatedBlocks(data_fd, *recipe, plan, where); !s.ok()) return s;
  if (fdatasync(data_fd) != 0) {
    return ErrnoStatus(errno, absl::StrCat("sync the data restored from ", where));
  }
  return read;
}

std::optional<BlockStore> StoreSnapshots::CacheOf(uint32_t uid) {
  if (!cache_.valid()) return std::nullopt;
  const std::string name = absl::StrCat(uid);
  if (mkdirat(cache_.get(), name.c_str(), 0700) != 0 && errno != EEXIST) return std::nullopt;
  absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(cache_.get(), name);
  if (!dir.ok()) return std::nullopt;
  BlockStoreOptions options;
  options.durable = false;  // a cache: what a crash damages is found when read
  absl::StatusOr<BlockStore> blocks = BlockStore::At(dir->get(), options);
  // The store keeps its own descriptors of blocks/; the uid's directory
  // itself is not needed after this.
  if (!blocks.ok()) return std::nullopt;
  return *std::move(blocks);
}

void StoreSnapshots::Cache(BlockStore& cache, absl::string_view bytes) {
  // Best effort: a full or failing cache slows later restores, no more.
  absl::StatusOr<BlockStore::Stored> stored = cache.Put(bytes);
  if (!stored.ok() || !stored->written) return;
  const uint64_t taken = CachedBytes(stored->stored_bytes);
  if (cache_bytes_.fetch_add(taken) + taken > options_.cache_bytes) TrimCache();
}

void StoreSnapshots::TrimCache() {
  absl::MutexLock lock(&trim_mu_);
  if (cache_bytes_.load() <= options_.cache_bytes) return;
  absl::StatusOr<std::vector<std::string>> uids = ListDirectory(cache_.get(), 1 << 20);
  if (!uids.ok()) return;
  // Every cached block, one uid's directory open at a time.
  struct Cached {
    int64_t modified_ns;
    uint64_t bytes;
    std::string path;  // relative to the cache directory (heapd's own)
  };
  std::vector<Cached> entries;
  uint64_t total = 0;
  for (const std::string& uid : *uids) {
    absl::StatusOr<UniqueFd> dir = OpenDirectoryAt(cache_.get(), uid);
    absl::StatusOr<BlockStore> blocks =
        dir.ok() ? BlockStore::At(dir->get(), {}, /*create=*/false) : dir.status();
    if (!blocks.ok()) continue;
    (void)blocks->ForEach([&](const BlockStore::Entry& entry) {
      const uint64_t bytes = CachedBytes(entry.bytes);
      entries.push_back({entry.modified_ns, bytes,
                         absl::StrCat(uid, "/blocks/", absl::Hex(entry.directory, absl::kZeroPad2),
                                      "/", entry.name)});
      total += bytes;
      return absl::OkStatus();
    });
  }
  std::sort(entries.begin(), entries.end(),
            [](const Cached& a, const Cached& b) { return a.modified_ns < b.modified_ns; });
  // Down to 90%: a trim is a scan; not one per block.
  const uint64_t goal = options_.cache_bytes / 10 * 9;
  for (const Cached& entry : entries) {
    if (total <= goal) break;
    if (unlinkat(cache_.get(), entry.path.c_str(), 0) == 0 || errno == ENOENT) {
      total -= entry.bytes;
    }
  }
  cache_bytes_ = total;
}

absl::StatusOr<std::vector<PartRef>> StoreSnapshots::SelectParts(const SnapshotCaller& caller,
                                                                 const PartSelector& which,
                                                                 const std::string& what,
                                                                 bool remove, size_t* others) {
  if (absl::Status s = CheckStoreDir(which.store_dir); !s.ok()) return s;
  const size_t max_parts = options_.max_parts;
  ArgsWriter args;
  AddSelector(args, which).Add(uint64_t{max_parts}).Add(uint64_t{remove});
  absl::StatusOr<std::vector<ChildMessage>> messages =
      snapshots_->RunIn(caller, which.store_dir, kSelectPartsJob, args.Take(), {}, what);
  if (!messages.ok()) return messages.status();
  std::vector<PartRef> parts;
  for (const ChildMessage& message : *messages) {
    PartRef part;
    absl::string_view rest;
    if (!message.bytes.empty() && message.bytes[0] == kOthersMessage) {
      size_t count;
      if (!absl::SimpleAtoi(absl::string_view(message.bytes).substr(1), &count)) {
        return Malformed(what);
      }
      if (others != nullptr) *others = count;
      continue;
    }
    if (message.bytes.empty() || message.bytes[0] != kPartMessage ||
        !ParseTagged(message.bytes, &part, &rest) || !rest.empty() || !Matches(part, which)) {
      return Malformed(what);
    }
    parts.push_back(std::move(part));
  }
  if (parts.empty()) {
    return absl::NotFoundError(absl::StrCat("the store has no part matching ", Describe(which)));
  }
  return parts;
}

absl::StatusOr<std::vector<PartRef>> StoreSnapshots::Parts(const SnapshotCaller& caller,
                                                           const PartSelector& which) {
  return SelectParts(caller, which, absl::StrCat("list ", Describe(which)), /*remove=*/false);
}

absl::StatusOr<std::vector<v1::SnapshotManifest>> StoreSnapshots::Verify(
    const SnapshotCaller& caller, const PartSelector& which) {
  absl::StatusOr<std::vector<PartRef>> parts = Parts(caller, which);
  if (!parts.ok()) return parts.status();
  std::vector<v1::SnapshotManifest> verified;
  for (const PartRef& part : *parts) {
    absl::StatusOr<ReadPart> read =
        ReadWhole(caller, {which.store_dir, part.name, part.node, part.heap}, -1, kMaxHeapBytes);
    if (!read.ok()) return read.status();
    const std::string where = PartWhere(part, which.store_dir);
    absl::StatusOr<VerifiedSnapshot> checked = VerifySnapshotFiles(
        where, read->manifest_json, read->metadata_files, read->manifest.data_bytes());
    if (!checked.ok()) return checked.status();
    verified.push_back(std::move(read->manifest));
  }
  return verified;
}

absl::StatusOr<StoreSnapshots::Removed> StoreSnapshots::Remove(const SnapshotCaller& caller,
                                                               const PartSelector& which) {
  size_t others = 0;
  absl::StatusOr<std::vector<PartRef>> removed = SelectParts(
      caller, which, absl::StrCat("remove ", Describe(which)), /*remove=*/true, &others);
  if (!removed.ok()) return removed.status();
  return Removed{*std::move(removed), others};
}

absl::StatusOr<std::unique_ptr<RestoredHeapDir>> StoreSnapshots::Restore(
    const SnapshotCaller& caller, const PartSelector& which, const std::string& heaps_dir,
    const std::string& heap_name, const RestoreOptions& options, v1::SnapshotManifest* manifest) {
  uint64_t fetched = 0;
  std::optional<SnapshotStore::ReadingCharge> charge;  // until the restore is checked
  absl::StatusOr<std::unique_ptr<RestoredHeapDir>> restored = snapshots_->RestoreWith(
      caller, Describe(which), /*own_dir=*/false,
      [&](int data_fd) -> absl::StatusOr<SnapshotStore::RestoreSource> {
        absl::StatusOr<ReadPart> read = ReadWhole(caller, which, data_fd, options.max_bytes);
        if (!read.ok()) return read.status();
        fetched = read->fetched_blocks;
        charge.emplace(std::move(*read->charge));
        SnapshotStore::RestoreSource source;
        source.manifest_json = std::move(read->manifest_json);
        source.metadata_files = std::move(read->metadata_files);
        source.data_bytes = read->manifest.data_bytes();
        return source;
      },
      heaps_dir, heap_name, options, manifest);
  if (restored.ok()) manifest->mutable_store()->set_fetched_blocks(fetched);
  return restored;
}

absl::StatusOr<v1::GcStoreResponse> StoreSnapshots::CollectGarbage(
    const SnapshotCaller& caller, const std::string& store_dir, std::optional<absl::Duration> grace,
    bool dry_run) {
  if (absl::Status s = CheckStoreDir(store_dir); !s.ok()) return s;
  GcOptions gc;
  if (grace.has_value()) gc.grace = *grace;
  gc.dry_run = dry_run;
  gc.max_parts = options_.max_parts;
  const std::string what = absl::StrCat("gc store ", store_dir);
  absl::StatusOr<std::vector<ChildMessage>> messages =
      snapshots_->RunIn(caller, store_dir, kCollectGarbageJob,
                        ArgsWriter()
                            .Add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(gc.grace)))
                            .Add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(gc.lease_expiry)))
                            .Add(uint64_t{gc.dry_run})
                            .Add(uint64_t{gc.max_parts})
                            .Take(),
                        {}, what);
  if (!messages.ok()) return messages.status();
  absl::StatusOr<absl::string_view> answer = OnlyMessage(*messages, kGcMessage, what);
  if (!answer.ok()) return answer.status();
  v1::GcStoreResponse response;
  if (!response.ParseFromArray(answer->data() + 1, static_cast<int>(answer->size() - 1))) {
    return Malformed(what);
  }
  return response;
}

absl::StatusOr<v1::StoreUsageResponse> StoreSnapshots::Usage(const SnapshotCaller& caller,
                                                             const std::string& store_dir) {
  if (absl::Status s = CheckStoreDir(store_dir); !s.ok()) return s;
  const std::string what = absl::StrCat("du store ", store_dir);
  const size_t max_parts = options_.max_parts;
  absl::StatusOr<std::vector<ChildMessage>> messages =
      snapshots_->RunIn(caller, store_dir, kStoreUsageJob,
                        ArgsWriter().Add(uint64_t{max_parts}).Take(), {}, what, kMaxListingBytes);
  if (!messages.ok()) return messages.status();
  v1::StoreUsageResponse response;
  bool totals_seen = false;
  for (const ChildMessage& message : *messages) {
    if (!message.bytes.empty() && message.bytes[0] == kTotalsMessage &&
        message.bytes.size() == 17) {
      uint64_t stored = 0, blocks = 0;
      std::memcpy(&stored, message.bytes.data() + 1, 8);
      std::memcpy(&blocks, message.bytes.data() + 9, 8);
      response.set_stored_bytes(stored);
      response.set_blocks(blocks);
      totals_seen = true;
      continue;
    }
    PartRef part;
    absl::string_view rest;
    if (message.bytes.empty() || message.bytes[0] != kPartMessage ||
        !ParseTagged(message.bytes, &part, &rest)) {
      return Malformed(what);
    }
    absl::StatusOr<uint64_t> header_bytes = RecipeHeaderBytes(rest, part.ToString());
    if (!header_bytes.ok() || rest.size() < *header_bytes + 1) return Malformed(what);
    absl::StatusOr<RecipeFile> file =
        DecodeRecipeFile(rest.substr(0, *header_bytes), part.ToString(), /*header_only=*/true);
    if (!file.ok()) return file.status();
    absl::StatusOr<v1::SnapshotManifest> manifest =
        ParseManifest(file->manifest_json, part.ToString());
    if (!manifest.ok()) return manifest.status();
    v1::StoreUsage usage;
    if (!usage.ParseFromString(std::string(rest.substr(*header_bytes + 1)))) return Malformed(what);
    manifest->set_node(part.node);
    *manifest->mutable_store() = usage;
    response.set_logical_bytes(response.logical_bytes() + usage.logical_bytes());
    *response.add_parts() = *std::move(manifest);
  }
  if (!totals_seen) return Malformed(what);
  return response;
}

}  // namespace heapd
