#include "snapshot/version_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "heap/heap_name.h"
#include "heap/metadata_store.h"
#include "snapshot/snapshot_format.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr uint64_t kMaxRecipeBytes = uint64_t{64} << 20;

bool ValidBlockBytes(uint64_t bytes) {
  return bytes >= (64 << 10) && bytes <= kChunkSize && (bytes & (bytes - 1)) == 0;
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view bytes) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", path));
  while (!bytes.empty()) {
    const ssize_t n = write(fd.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(errno, absl::StrCat("write ", path));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (fsync(fd.get()) != 0) return ErrnoStatus(errno, absl::StrCat("sync ", path));
  return absl::OkStatus();
}

absl::Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return ErrnoStatus(errno, absl::StrCat("make ", path));
}

// The chunks the committed epoch uses (small chunk records, large runs).
std::vector<bool> UsedChunks(const Checkpoint& state) {
  std::vector<bool> used(state.capacity_chunks, false);
  for (const ChunkRecord& record : state.chunks) {
    const uint64_t length = record.kind == ChunkKind::kLargeHead ? record.run_chunks : 1;
    for (uint64_t c = record.chunk; c < record.chunk + length && c < used.size(); ++c) {
      used[c] = true;
    }
  }
  return used;
}

bool AllZero(absl::string_view bytes) {
  return bytes.find_first_not_of('\0') == absl::string_view::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<VersionStore>> VersionStore::Open(const std::string& dir,
                                                                 uint32_t block_bytes) {
  if (!ValidBlockBytes(block_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a block size of ", block_bytes, " bytes is not a power of two from 64 KiB to 2 MiB"));
  }
  BlockStoreOptions options;
  options.max_block_bytes = kChunkSize;
  absl::StatusOr<std::unique_ptr<BlockStore>> blocks = BlockStore::Open(dir, options);
  if (!blocks.ok()) return blocks.status();
  if (absl::Status s = MakeDirectory(dir + "/versions"); !s.ok()) return s;
  return std::unique_ptr<VersionStore>(new VersionStore(dir, *std::move(blocks), block_bytes));
}

std::string VersionStore::RecipePath(const std::string& heap, const std::string& name) const {
  return absl::StrCat(dir_, "/versions/", heap, "/", name, ".recipe");
}

absl::StatusOr<VersionStats> VersionStore::Create(const std::string& heap, const std::string& name,
                                                  const v1::HeapInfo& source,
                                                  const CommittedState& state) {
  if (absl::Status s = ValidateHeapName(heap); !s.ok()) return s;
  if (absl::Status s = ValidateHeapName(name, "version"); !s.ok()) return s;
  const std::string path = RecipePath(heap, name);
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("heap ", heap, " has a version ", name));
  }
  v1::StoreRecipe recipe;
  v1::SnapshotManifest& manifest = *recipe.mutable_manifest();
  manifest.set_name(name);
  manifest.set_heap(heap);
  manifest.set_epoch(state.epoch);
  manifest.set_data_bytes(state.data_bytes);
  manifest.set_created_unix_ns(absl::ToUnixNanos(absl::Now()));
  *manifest.mutable_source() = source;
  for (const auto& [file, bytes] : state.metadata_files) {
    (*manifest.mutable_metadata_crc32())[file] = MetadataCrc32(bytes);
  }
  // The chunks to store are those of the committed epoch, as its metadata
  // says (checked as a snapshot's would be).
  absl::StatusOr<VerifiedSnapshot> verified =
      VerifySnapshotFiles(path, ManifestToJson(manifest), state.metadata_files, state.data_bytes);
  if (!verified.ok()) return verified.status();
  const std::vector<bool> used = UsedChunks(verified->metadata.state);

  VersionStats stats;
  auto put = [&](absl::string_view bytes) -> absl::StatusOr<std::string> {
    absl::StatusOr<BlockStore::Stored> stored = blocks_->Put(bytes);
    if (!stored.ok()) return stored.status();
    ++stats.blocks;
    if (stored->written) {
      ++stats.blocks_written;
      stats.stored_bytes += stored->stored_bytes;
    }
    return stored->id.Hex();
  };
  recipe.set_block_bytes(block_bytes_);
  std::string block(block_bytes_, '\0');
  for (uint64_t at = 0; at < state.data_bytes; at += block_bytes_) {
    const uint64_t chunk = at / kChunkSize;
    if (chunk >= used.size() || !used[chunk]) {
      recipe.add_data_blocks("");  // free at this epoch: never read
      continue;
    }
    const size_t length =
        static_cast<size_t>(std::min<uint64_t>(block_bytes_, state.data_bytes - at));
    const ssize_t got = pread(state.data_fd, block.data(), length, static_cast<off_t>(at));
    if (got < 0)
      return ErrnoStatus(errno, absl::StrCat("read the data of heap ", heap, " at ", at));
    if (static_cast<size_t>(got) != length) {
      return absl::DataLossError(absl::StrCat("the data file of heap ", heap, " ends at ", at + got,
                                              ", before its ", state.data_bytes, " bytes"));
    }
    const absl::string_view bytes(block.data(), length);
    if (AllZero(bytes)) {
      recipe.add_data_blocks("");
      continue;
    }
    absl::StatusOr<std::string> id = put(bytes);
    if (!id.ok()) return id.status();
    recipe.add_data_blocks(*id);
  }
  stats.logical_bytes = state.data_bytes;
  for (const auto& [file, bytes] : state.metadata_files) {
    v1::StoreFile& stored = (*recipe.mutable_metadata())[file];
    stored.set_bytes(bytes.size());
    stats.logical_bytes += bytes.size();
    for (uint64_t at = 0; at < bytes.size(); at += block_bytes_) {
      absl::StatusOr<std::string> id = put(absl::string_view(bytes).substr(at, block_bytes_));
      if (!id.ok()) return id.status();
      stored.add_blocks(*id);
    }
  }
  // A recipe Read would refuse is an error now, not at restore.
  if (recipe.ByteSizeLong() > kMaxRecipeBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "version ", name, " of heap ", heap, " needs a recipe of ", recipe.ByteSizeLong(),
        " bytes, more than the ", kMaxRecipeBytes, " a store reads (use larger blocks)"));
  }
  // Published last: the blocks it names are durable already. Written under
  // a random name beside it, then linked to its name: link fails if the
  // name exists (two nodes creating one version: one wins), also on NFS.
  const std::string heap_dir = absl::StrCat(dir_, "/versions/", heap);
  if (absl::Status s = MakeDirectory(heap_dir); !s.ok()) return s;
  const std::string temporary = absl::StrCat(heap_dir, "/.tmp-", RandomName());
  absl::Status written = WriteFileDurably(temporary, recipe.SerializeAsString());
  const int linked = written.ok() ? link(temporary.c_str(), path.c_str()) : -1;
  const int err = errno;
  unlink(temporary.c_str());
  if (!written.ok()) return written;
  if (linked != 0) {
    if (err == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat("heap ", heap, " has a version ", name));
    }
    return ErrnoStatus(err, absl::StrCat("publish ", path));
  }
  if (absl::Status s = SyncDirectory(heap_dir); !s.ok()) return s;
  return stats;
}

absl::StatusOr<v1::StoreRecipe> VersionStore::Read(const std::string& heap,
                                                   const std::string& name) const {
  if (absl::Status s = ValidateHeapName(heap); !s.ok()) return s;
  if (absl::Status s = ValidateHeapName(name, "version"); !s.ok()) return s;
  const std::string path = RecipePath(heap, name);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("recipe ", path, ": ", why));
  };
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("heap ", heap, " has no version ", name));
    }
    return ErrnoStatus(errno, absl::StrCat("open ", path));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxRecipeBytes) {
    return bad("not a regular file of at most 64 MiB");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  if (pread(fd.get(), bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    return bad("cannot be read whole");
  }
  v1::StoreRecipe recipe;
  if (!recipe.ParseFromString(bytes)) return bad("does not parse");
  absl::StatusOr<v1::SnapshotManifest> manifest =
      ParseManifest(ManifestToJson(recipe.manifest()), path);
  if (!manifest.ok()) return manifest.status();
  if (recipe.manifest().heap() != heap || recipe.manifest().name() != name) {
    return bad("names another version");
  }
  const uint64_t block = recipe.block_bytes();
  if (!ValidBlockBytes(block)) return bad(absl::StrCat("a block size of ", block));
  const uint64_t data_bytes = recipe.manifest().data_bytes();
  if (static_cast<uint64_t>(recipe.data_blocks_size()) != (data_bytes + block - 1) / block) {
    return bad(absl::StrCat(recipe.data_blocks_size(), " data blocks for ", data_bytes, " bytes"));
  }
  auto check = [&](const std::string& id) { return id.empty() || BlockId::FromHex(id).ok(); };
  for (const std::string& id : recipe.data_blocks()) {
    if (!check(id)) return bad("a data block's name is not a block name");
  }
  uint64_t metadata_bytes = 0;
  for (const auto& [file, stored] : recipe.metadata()) {
    metadata_bytes += stored.bytes();
    if (!IsMetadataFileName(file) || recipe.manifest().metadata_crc32().count(file) == 0 ||
        metadata_bytes > kMaxMetadataBytes ||
        static_cast<uint64_t>(stored.blocks_size()) != (stored.bytes() + block - 1) / block) {
      return bad(absl::StrCat("its metadata file '", file.substr(0, 64), "' does not fit"));
    }
    for (const std::string& id : stored.blocks()) {
      if (id.empty() || !check(id)) return bad("a metadata block's name is not a block name");
    }
  }
  return recipe;
}

absl::Status VersionStore::Checkout(const std::string& heap, const std::string& name,
                                    const std::string& target, uint64_t max_data_bytes) const {
  // Built under a random name beside the target and renamed to it whole: a
  // failure leaves nothing under the target's name.
  const std::string partial = absl::StrCat(target, ".partial-", RandomName());
  absl::Status built = CheckoutInto(heap, name, partial, max_data_bytes);
  if (built.ok() &&
      renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
    built = ErrnoStatus(errno, absl::StrCat("rename the checkout to ", target));
  }
  if (!built.ok()) {
    std::error_code ignored;
    std::filesystem::remove_all(partial, ignored);
  }
  return built;
}

absl::Status VersionStore::CheckoutInto(const std::string& heap, const std::string& name,
                                        const std::string& target, uint64_t max_data_bytes) const {
  absl::StatusOr<v1::StoreRecipe> recipe = Read(heap, name);
  if (!recipe.ok()) return recipe.status();
  if (recipe->manifest().data_bytes() > max_data_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "version ", name, " of heap ", heap, " holds ", recipe->manifest().data_bytes(),
        " bytes of data, more than the ", max_data_bytes, " allowed"));
  }
  if (mkdir(target.c_str(), 0700) != 0) return ErrnoStatus(errno, absl::StrCat("make ", target));
  auto block = [&](const std::string& hex) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> bytes = blocks_->Get(*BlockId::FromHex(hex));
    if (bytes.status().code() == absl::StatusCode::kNotFound) {
      return absl::DataLossError(absl::StrCat("version ", name, " of heap ", heap, " names block ",
                                              hex, ", which the store lacks"));
    }
    if (bytes.ok() && bytes->size() > recipe->block_bytes()) {
      return absl::DataLossError(
          absl::StrCat("block ", hex, " is larger than its recipe's blocks"));
    }
    return bytes;
  };
  std::map<std::string, std::string> metadata_files;
  for (const auto& [file, stored] : recipe->metadata()) {
    std::string bytes;
    for (const std::string& hex : stored.blocks()) {
      absl::StatusOr<std::string> got = block(hex);
      if (!got.ok()) return got.status();
      bytes += *got;
    }
    if (bytes.size() != stored.bytes()) {
      return absl::DataLossError(absl::StrCat("version ", name, " of heap ", heap, ": file ", file,
                                              " has ", bytes.size(), " bytes, not ",
                                              stored.bytes()));
    }
    if (absl::Status s = WriteFileDurably(absl::StrCat(target, "/", file), bytes); !s.ok()) {
      return s;
    }
    metadata_files[file] = std::move(bytes);
  }
  const std::string manifest_json = ManifestToJson(recipe->manifest());
  const uint64_t data_bytes = recipe->manifest().data_bytes();
  // The whole snapshot checked as any other before its data is written.
  absl::StatusOr<VerifiedSnapshot> verified =
      VerifySnapshotFiles(target, manifest_json, metadata_files, data_bytes);
  if (!verified.ok()) return verified.status();
  const std::string data_path = absl::StrCat(target, "/", kSnapshotDataFile);
  UniqueFd data(
      open(data_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!data.valid() || ftruncate(data.get(), static_cast<off_t>(data_bytes)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("make ", data_path));
  }
  uint64_t at = 0;
  for (const std::string& hex : recipe->data_blocks()) {
    const uint64_t length = std::min<uint64_t>(recipe->block_bytes(), data_bytes - at);
    if (!hex.empty()) {
      absl::StatusOr<std::string> bytes = block(hex);
      if (!bytes.ok()) return bytes.status();
      if (bytes->size() != length) {
        return absl::DataLossError(absl::StrCat("version ", name, " of heap ", heap,
                                                ": the data block at ", at, " has ", bytes->size(),
                                                " bytes, not ", length));
      }
      if (pwrite(data.get(), bytes->data(), bytes->size(), static_cast<off_t>(at)) !=
          static_cast<ssize_t>(bytes->size())) {
        return ErrnoStatus(errno, absl::StrCat("write ", data_path));
      }
    }
    at += length;
  }
  if (fsync(data.get()) != 0) return ErrnoStatus(errno, absl::StrCat("sync ", data_path));
  if (absl::Status s = WriteFileDurably(absl::StrCat(target, "/", kManifestFile), manifest_json);
      !s.ok()) {
    return s;
  }
  return SyncDirectory(target);
}

}  // namespace heapd
