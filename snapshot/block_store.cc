#include "snapshot/block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/random_name.h"

namespace heapd {
namespace {

constexpr char kMagic[4] = {'H', 'B', 'K', '1'};
constexpr size_t kHeaderBytes = 24;
constexpr char kTemporaryPrefix[] = ".tmp-";
constexpr char kAsidePrefix[] = ".trash-";

void PutLe64(char* at, uint64_t value) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>(value >> (8 * i));
}

uint64_t GetLe64(const char* at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<uint8_t>(at[i])} << (8 * i);
  return value;
}

std::string DirectoryName(int index) { return absl::StrCat(absl::Hex(index, absl::kZeroPad2)); }

// Whether `name` in `dir` is a block file this user wrote whose header
// fits its size (its hash is checked whenever it is read): then Put marks
// it used (its modification time, through the descriptor) and need not
// write it again, provided the name still leads to that file afterwards
// (gc may have set it aside meanwhile: then it is written anew). A file
// another user put there is not trusted to be the block.
bool MarkIfWhole(int dir, const std::string& name, uint64_t* size) {
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  char header[kHeaderBytes];
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      pread(fd.get(), header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return false;
  }
  *size = static_cast<uint64_t>(st.st_size);
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0 ||
      GetLe64(header + 12) != *size - kHeaderBytes || futimens(fd.get(), nullptr) != 0) {
    return false;
  }
  struct stat now;
  return fstatat(dir, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == st.st_ino &&
         now.st_dev == st.st_dev;
}

}  // namespace

int64_t ModifiedNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

BlockId BlockId::Of(absl::string_view bytes) {
  // Fetched once: an implicit fetch per block would look the provider up
  // under its lock each time.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  BlockId id;
  if (sha256 == nullptr ||
      EVP_Digest(bytes.data(), bytes.size(), id.hash.data(), nullptr, sha256, nullptr) != 1) {
    // Only a broken OpenSSL installation: no block could be named.
    std::fprintf(stderr, "heapd: OpenSSL cannot compute SHA-256\n");
    std::abort();
  }
  return id;
}

absl::StatusOr<BlockId> BlockId::FromHex(absl::string_view hex) {
  if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CHexEscape(hex.substr(0, 80)), "' is not a block name"));
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  return FromRaw(bytes.data());
}

BlockId BlockId::FromRaw(const char* raw) {
  BlockId id;
  std::memcpy(id.hash.data(), raw, id.hash.size());
  return id;
}

std::string BlockId::Hex() const {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(hash.data()), hash.size()));
}

absl::StatusOr<BlockStore> BlockStore::At(int root, BlockStoreOptions options, bool create) {
  if (create && mkdirat(root, "blocks", 0755) == 0) {
    if (options.durable && fsync(root) != 0) return ErrnoStatus(errno, "fsync the store");
  } else if (create && errno != EEXIST) {
    return ErrnoStatus(errno, "make the store's blocks directory");
  }
  UniqueFd blocks(openat(root, "blocks", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!blocks.valid()) return ErrnoStatus(errno, "open the store's blocks directory");
  return BlockStore(std::move(blocks), options);
}

int BlockStore::Directory(int index, bool create) {
  UniqueFd& dir = directories_[index];
  if (dir.valid()) return dir.get();
  const std::string name = DirectoryName(index);
  if (create && mkdirat(blocks_.get(), name.c_str(), 0755) == 0) {
    // A new directory is an entry of blocks/ that must be durable too.
    if (options_.durable && fsync(blocks_.get()) != 0) return -1;
  } else if (create && errno != EEXIST) {
    return -1;
  }
  dir.reset(openat(blocks_.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  return dir.get();
}

absl::StatusOr<BlockStore::Stored> BlockStore::Put(absl::string_view bytes) {
  if (bytes.size() > options_.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", bytes.size(),
                                                   " bytes is larger than the store's ",
                                                   options_.max_block_bytes));
  }
  Stored stored;
  stored.id = BlockId::Of(bytes);
  if (auto pending = pending_bytes_.find(stored.id); pending != pending_bytes_.end()) {
    stored.stored_bytes = pending->second;  // written by this store already
    return stored;
  }
  const std::string name = stored.id.Hex();
  const int index = stored.id.hash[0];
  const int dir = Directory(index, /*create=*/true);
  if (dir < 0) return ErrnoStatus(errno, absl::StrCat("open blocks/", DirectoryName(index)));
  // Another create's, perhaps not yet durable in its directory; marked in
  // use (gc keeps young blocks).
  if (MarkIfWhole(dir, name, &stored.stored_bytes)) {
    unsynced_.set(index);
    return stored;
  }
  if (options_.claim && !options_.claim(stored.id)) return stored;  // another worker's
  // Missing, damaged or not markable (then replaced by the rename below).
  std::string file(kHeaderBytes + ZSTD_compressBound(bytes.size()), '\0');
  const size_t compressed = ZSTD_compress(file.data() + kHeaderBytes, file.size() - kHeaderBytes,
                                          bytes.data(), bytes.size(), options_.zstd_level);
  if (ZSTD_isError(compressed)) {
    return absl::InternalError(
        absl::StrCat("compress block ", name, ": ", ZSTD_getErrorName(compressed)));
  }
  file.resize(kHeaderBytes + compressed);
  std::memcpy(file.data(), kMagic, sizeof(kMagic));
  PutLe64(file.data() + 4, bytes.size());
  PutLe64(file.data() + 12, compressed);
  std::memset(file.data() + 20, 0, 4);
  const std::string temporary = absl::StrCat(kTemporaryPrefix, RandomName());
  {
    UniqueFd fd(
        openat(dir, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create block ", name));
    // Writeback starts now; Commit waits for it (one block at a time
    // would wait for each in turn).
    if (!WriteAllAt(fd.get(), file, 0) ||
        (options_.durable && sync_file_range(fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE) != 0 &&
         errno != ESPIPE && errno != EINVAL) ||
        close(fd.release()) != 0) {
      const absl::Status failed = ErrnoStatus(errno, absl::StrCat("write block ", name));
      unlinkat(dir, temporary.c_str(), 0);
      return failed;
    }
  }
  pending_.push_back({index, temporary, name});
  pending_bytes_[stored.id] = file.size();
  stored.written = true;
  stored.stored_bytes = file.size();
  return stored;
}

BlockStore::~BlockStore() {
  for (const Pending& block : pending_) {
    unlinkat(directories_[block.directory].get(), block.temporary.c_str(), 0);
  }
}

absl::Status BlockStore::Commit() {
  // Each block's bytes durable before its name: a name never leads to
  // bytes a crash could lose.
  for (const Pending& block : pending_) {
    const int dir = directories_[block.directory].get();
    if (options_.durable) {
      UniqueFd fd(openat(dir, block.temporary.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid() || fdatasync(fd.get()) != 0) {
        return ErrnoStatus(errno, absl::StrCat("sync block ", block.name));
      }
    }
    unsynced_.set(block.directory);
    if (renameat2(dir, block.temporary.c_str(), dir, block.name.c_str(), RENAME_NOREPLACE) == 0) {
      continue;
    }
    if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("rename block ", block.name));
    // Another writer's arrived meanwhile: it stays (its mark with it) if it
    // is sound, else this one replaces it.
    uint64_t size = 0;
    if (MarkIfWhole(dir, block.name, &size)) {
      unlinkat(dir, block.temporary.c_str(), 0);
    } else if (renameat(dir, block.temporary.c_str(), dir, block.name.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename block ", block.name));
    }
  }
  pending_.clear();
  pending_bytes_.clear();
  if (!options_.durable) {
    unsynced_.reset();
    return absl::OkStatus();
  }
  for (int index = 0; index < 256; ++index) {
    if (!unsynced_.test(index)) continue;
    if (fsync(directories_[index].get()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("fsync blocks/", DirectoryName(index)));
    }
    unsynced_.reset(index);
  }
  return absl::OkStatus();
}

bool BlockStore::Mark(const BlockId& id) {
  const int dir = Directory(id.hash[0], /*create=*/false);
  uint64_t size = 0;
  if (dir < 0 || !MarkIfWhole(dir, id.Hex(), &size)) return false;
  unsynced_.set(id.hash[0]);
  return true;
}

absl::StatusOr<std::string> BlockStore::Get(const BlockId& id) {
  const std::string name = id.Hex();
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("block ", name, ": ", why));
  };
  const int dir = Directory(id.hash[0], /*create=*/false);
  UniqueFd fd(dir < 0 ? -1
                      : openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid() && errno == ENOENT && dir >= 0) {
    // Set aside by a gc that was killed before it put the block back.
    fd.reset(openat(dir, absl::StrCat(kAsidePrefix, name).c_str(),
                    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) errno = ENOENT;
  }
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no block ", name));
    return ErrnoStatus(errno, absl::StrCat("open block ", name));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat block ", name));
  const uint64_t max_file = kHeaderBytes + ZSTD_compressBound(options_.max_block_bytes);
  if (!S_ISREG(st.st_mode)) return bad("not a regular file");
  if (static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      static_cast<uint64_t>(st.st_size) > max_file) {
    return bad(absl::StrCat(st.st_size, " bytes"));
  }
  std::string file(static_cast<size_t>(st.st_size), '\0');
  if (!ReadAllAt(fd.get(), file.data(), file.size(), 0)) {
    return bad("cannot be read whole");
  }
  const uint64_t size = GetLe64(file.data() + 4);
  const uint64_t compressed = GetLe64(file.data() + 12);
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0 ||
      compressed != file.size() - kHeaderBytes || size > options_.max_block_bytes) {
    return bad("its header does not fit it");
  }
  std::string bytes(size, '\0');
  const size_t got =
      ZSTD_decompress(bytes.data(), bytes.size(), file.data() + kHeaderBytes, compressed);
  if (ZSTD_isError(got) || got != size) return bad("does not decompress to its size");
  if (BlockId::Of(bytes) != id) return bad("its bytes do not have its hash");
  return bytes;
}

absl::StatusOr<uint64_t> BlockStore::StoredBytes(const BlockId& id) {
  const std::string name = id.Hex();
  const int dir = Directory(id.hash[0], /*create=*/false);
  struct stat st;
  if (dir < 0 || fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no block ", name));
    return ErrnoStatus(errno, absl::StrCat("stat block ", name));
  }
  return static_cast<uint64_t>(st.st_size);
}

absl::Status BlockStore::ForEach(const std::function<absl::Status(const Entry&)>& visit) {
  for (int index = 0; index < 256; ++index) {
    const int dir = Directory(index, /*create=*/false);
    if (dir < 0) {
      if (errno == ENOENT) continue;
      return ErrnoStatus(errno, absl::StrCat("open blocks/", DirectoryName(index)));
    }
    UniqueFd listing(dup(dir));
    DIR* stream = listing.valid() ? fdopendir(listing.get()) : nullptr;
    if (stream == nullptr)
      return ErrnoStatus(errno, absl::StrCat("list blocks/", DirectoryName(index)));
    listing.release();
    rewinddir(stream);
    absl::Status status;
    while (status.ok()) {
      errno = 0;
      const dirent* entry = readdir(stream);
      if (entry == nullptr) {
        if (errno != 0) status = ErrnoStatus(errno, "list blocks");
        break;
      }
      absl::string_view name = entry->d_name;
      Entry found;
      if (absl::StartsWith(name, kTemporaryPrefix)) {
        found.kind = Kind::kTemporary;
      } else {
        if (absl::ConsumePrefix(&name, kAsidePrefix)) found.kind = Kind::kAside;
        absl::StatusOr<BlockId> id = BlockId::FromHex(name);
        if (!id.ok() || id->hash[0] != index) continue;  // not a block's: left alone
        found.id = *id;
      }
      struct stat st;
      if (fstatat(dir, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      found.name = entry->d_name;
      found.directory = index;
      found.bytes = static_cast<uint64_t>(st.st_size);
      found.modified_ns = ModifiedNs(st);
      status = visit(found);
    }
    closedir(stream);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status BlockStore::Remove(const Entry& entry) {
  const int dir = Directory(entry.directory, /*create=*/false);
  if (dir < 0 || (unlinkat(dir, entry.name.c_str(), 0) != 0 && errno != ENOENT)) {
    return ErrnoStatus(errno, absl::StrCat("remove block ", entry.name));
  }
  unsynced_.set(entry.directory);
  return absl::OkStatus();
}

absl::StatusOr<bool> BlockStore::RemoveUnlessMarked(const Entry& entry, int64_t cutoff_ns) {
  const int dir = Directory(entry.directory, /*create=*/false);
  const std::string aside = absl::StrCat(kAsidePrefix, entry.name);
  if (dir < 0 || renameat(dir, entry.name.c_str(), dir, aside.c_str()) != 0) {
    if (errno == ENOENT) return false;  // gone already
    return ErrnoStatus(errno, absl::StrCat("set block ", entry.name, " aside"));
  }
  unsynced_.set(entry.directory);
  struct stat st;
  if (fstatat(dir, aside.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat block ", entry.name, " set aside"));
  }
  Entry set_aside = entry;
  set_aside.kind = Kind::kAside;
  set_aside.name = aside;
  if (ModifiedNs(st) >= cutoff_ns) {
    if (absl::Status s = PutBack(set_aside); !s.ok()) return s;
    return false;
  }
  if (absl::Status s = Remove(set_aside); !s.ok()) return s;
  return true;
}

absl::Status BlockStore::PutBack(const Entry& aside) {
  const int dir = Directory(aside.directory, /*create=*/false);
  const std::string name = aside.id.Hex();
  if (dir < 0 || (renameat2(dir, aside.name.c_str(), dir, name.c_str(), RENAME_NOREPLACE) != 0 &&
                  (errno != EEXIST || unlinkat(dir, aside.name.c_str(), 0) != 0))) {
    return ErrnoStatus(errno, absl::StrCat("put block ", name, " back"));
  }
  unsynced_.set(aside.directory);
  return absl::OkStatus();
}

}  // namespace heapd
