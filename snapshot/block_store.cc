#include "snapshot/block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

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
constexpr char kDeltaMagic[4] = {'H', 'B', 'D', '1'};
constexpr size_t kHeaderBytes = 24;
// A delta's header: the block's, then its base's id.
constexpr size_t kDeltaHeaderBytes = kHeaderBytes + 32;
// A delta holds whole 512-byte sectors of its block (the last may be
// shorter): finer than a page, as a change to an object is.
constexpr size_t kSectorBytes = 512;
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

uint32_t GetLe32(const char* at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<uint8_t>(at[i])} << (8 * i);
  return value;
}

std::string DirectoryName(int index) { return absl::StrCat(absl::Hex(index, absl::kZeroPad2)); }

uint64_t SectorsOf(uint64_t size) { return (size + kSectorBytes - 1) / kSectorBytes; }

// The size of a block file's header: HBK1's or HBD1's, 0 if neither.
size_t HeaderBytesOf(const char* magic) {
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) == 0) return kHeaderBytes;
  if (std::memcmp(magic, kDeltaMagic, sizeof(kDeltaMagic)) == 0) return kDeltaHeaderBytes;
  return 0;
}

// Whether `name` in `dir` is a block file this user wrote whose header
// fits its size (its hash is checked whenever it is read): then Put marks
// it used (its modification time, through the descriptor) and need not
// write it again, provided the name still leads to that file afterwards
// (gc may have set it aside meanwhile: then it is written anew). A file
// another user put there is not trusted to be the block. `*base`: a
// delta's base, else zero.
bool MarkFile(int dir, const std::string& name, uint64_t* size, BlockId* base) {
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  char header[kDeltaHeaderBytes];
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      pread(fd.get(), header, kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes)) {
    return false;
  }
  *size = static_cast<uint64_t>(st.st_size);
  const size_t header_bytes = HeaderBytesOf(header);
  if (header_bytes == 0 || *size < header_bytes || GetLe64(header + 12) != *size - header_bytes) {
    return false;
  }
  *base = BlockId();
  if (header_bytes == kDeltaHeaderBytes) {
    // A delta of another sector size would not read: not whole.
    if (pread(fd.get(), header + kHeaderBytes, 32, kHeaderBytes) != 32 ||
        GetLe32(header + 20) != kSectorBytes) {
      return false;
    }
    *base = BlockId::FromRaw(header + kHeaderBytes);
  }
  if (futimens(fd.get(), nullptr) != 0) return false;
  struct stat now;
  return fstatat(dir, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == st.st_ino &&
         now.st_dev == st.st_dev;
}

// The one zstd frame of a block file, decompressed: at most `max_bytes`.
std::optional<std::string> Inflate(absl::string_view frame, uint64_t max_bytes) {
  const unsigned long long size = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN || size > max_bytes) {
    return std::nullopt;
  }
  std::string bytes(size, '\0');
  const size_t got = ZSTD_decompress(bytes.data(), bytes.size(), frame.data(), frame.size());
  if (ZSTD_isError(got) || got != size) return std::nullopt;
  return bytes;
}

// Whether an entry named `name` is in `dir`.
bool Exists(int dir, const std::string& name) {
  struct stat st;
  return fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// Whether block `name` is in `dir`, in place or set aside (.trash-NAME).
bool NameTaken(int dir, const std::string& name) {
  return Exists(dir, name) || Exists(dir, absl::StrCat(kAsidePrefix, name));
}

// Whether `name` in `dir` is a delta's file (by its magic).
bool IsDeltaFile(int dir, const std::string& name) {
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  char magic[4];
  return fd.valid() && pread(fd.get(), magic, sizeof(magic), 0) == sizeof(magic) &&
         std::memcmp(magic, kDeltaMagic, sizeof(magic)) == 0;
}

// A block file of `size` bytes holding `payload` (the block itself, or with
// a `base` a delta of it), compressed at `level`.
absl::StatusOr<std::string> EncodeFile(uint64_t size, absl::string_view payload,
                                       const BlockId* base, int level) {
  const size_t header_bytes = base != nullptr ? kDeltaHeaderBytes : kHeaderBytes;
  std::string file(header_bytes + ZSTD_compressBound(payload.size()), '\0');
  const size_t compressed = ZSTD_compress(file.data() + header_bytes, file.size() - header_bytes,
                                          payload.data(), payload.size(), level);
  if (ZSTD_isError(compressed)) {
    return absl::InternalError(absl::StrCat("compress: ", ZSTD_getErrorName(compressed)));
  }
  file.resize(header_bytes + compressed);
  std::memcpy(file.data(), base != nullptr ? kDeltaMagic : kMagic, sizeof(kMagic));
  PutLe64(file.data() + 4, size);
  PutLe64(file.data() + 12, compressed);
  // A delta's sector size, at bytes 20..23 (zero in a full block's header).
  const uint32_t sector = base != nullptr ? kSectorBytes : 0;
  for (int i = 0; i < 4; ++i) file[20 + i] = static_cast<char>(sector >> (8 * i));
  if (base != nullptr) std::memcpy(file.data() + kHeaderBytes, base->hash.data(), 32);
  return file;
}

}  // namespace

// A block file read whole, its header checked against its size.
struct BlockStore::File {
  uint64_t size = 0;  // the block's
  BlockId base;       // a delta's, else zero
  std::string bytes;  // the whole file
  size_t header_bytes = 0;
  absl::string_view frame() const { return absl::string_view(bytes).substr(header_bytes); }
};

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

void BlockStore::DecoderFree::operator()(ZSTD_DCtx_s* decoder) const { ZSTD_freeDCtx(decoder); }

// What a delta of `bytes` against the full block `base` holds before
// compression: a bit per sector of `bytes` (sector p: bit p % 8 of byte
// p / 8) set where it differs from `base` (or lies past its end), then
// those sectors in order. Nothing if more than half the sectors differ: a
// full block is then not much larger, reads without a base, and becomes
// the base of later deltas (a block drifting from its base does not keep an
// old base alive long). Nothing either if the base's frame does not
// decompress to bytes of its hash: that is checked only for a delta kept,
// so a block that changed all over (where deltas do not pay) costs about
// half a decompression and no hash.
std::optional<std::string> BlockStore::DeltaOf(absl::string_view bytes, const Base& base) {
  // The base is decompressed a step at a time, the sectors compared as they
  // come: a block that changed all over is given up at about half of it.
  constexpr size_t kStepBytes = 64 << 10;
  if (ZSTD_getFrameContentSize(base.frame.data(), base.frame.size()) != base.size) {
    return std::nullopt;
  }
  if (decoder_ == nullptr) decoder_.reset(ZSTD_createDCtx());
  if (decoder_ == nullptr ||
      ZSTD_isError(ZSTD_DCtx_reset(decoder_.get(), ZSTD_reset_session_only))) {
    return std::nullopt;
  }
  if (base_bytes_.size() < base.size) base_bytes_.resize(base.size);
  ZSTD_inBuffer in{base.frame.data(), base.frame.size(), 0};
  ZSTD_outBuffer out{base_bytes_.data(), 0, 0};
  size_t left = 1;  // ZSTD_decompressStream's: 0 once the frame is whole
  // Decompresses the base up to `end` (at most its size); false if its
  // frame is damaged or ends early.
  auto decode_to = [&](uint64_t end) {
    while (out.pos < end) {
      out.size = std::min<size_t>(base.size, std::max<size_t>(end, out.pos + kStepBytes));
      const size_t out_before = out.pos, in_before = in.pos;
      left = ZSTD_decompressStream(decoder_.get(), &out, &in);
      if (ZSTD_isError(left) || (out.pos == out_before && in.pos == in_before)) return false;
    }
    return true;
  };
  const absl::string_view before(base_bytes_.data(), base.size);
  const uint64_t sectors = SectorsOf(bytes.size());
  std::string delta((sectors + 7) / 8, '\0');
  uint64_t changed = 0;
  for (uint64_t sector = 0; sector < sectors; ++sector) {
    const absl::string_view mine = bytes.substr(sector * kSectorBytes, kSectorBytes);
    const uint64_t at = sector * kSectorBytes;
    if (!decode_to(std::min<uint64_t>(at + mine.size(), base.size))) return std::nullopt;
    if (at + mine.size() <= before.size() && before.substr(at, mine.size()) == mine) continue;
    if (++changed * 2 > sectors) return std::nullopt;
    delta[sector / 8] = static_cast<char>(delta[sector / 8] | (1 << (sector % 8)));
    delta.append(mine.data(), mine.size());
  }
  // Kept: the whole base must be the block of its name.
  if (!decode_to(base.size) || left != 0 || in.pos != in.size || BlockId::Of(before) != base.id) {
    return std::nullopt;
  }
  return delta;
}

absl::StatusOr<BlockStore::Stored> BlockStore::Put(
    absl::string_view bytes, const std::function<std::optional<Base>()>& base) {
  if (bytes.size() > options_.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", bytes.size(),
                                                   " bytes is larger than the store's ",
                                                   options_.max_block_bytes));
  }
  Stored stored;
  stored.id = BlockId::Of(bytes);
  if (auto pending = written_.find(stored.id); pending != written_.end()) {
    stored.stored_bytes = pending->second.bytes;  // written by this store already
    stored.base = pending->second.base;
    return stored;
  }
  const std::string name = stored.id.Hex();
  const int index = stored.id.hash[0];
  const int dir = Directory(index, /*create=*/true);
  if (dir < 0) return ErrnoStatus(errno, absl::StrCat("open blocks/", DirectoryName(index)));
  // Another create's, perhaps not yet durable in its directory; marked in
  // use (gc keeps young blocks).
  if (MarkIfWhole(dir, stored.id, &stored.stored_bytes, &stored.base)) {
    unsynced_.set(index);
    return stored;
  }
  if (options_.claim && !options_.claim(stored.id)) return stored;  // another worker's
  // Missing, damaged or not markable (then replaced by the rename below).
  // A delta only where no file has the name (set aside by gc included): a
  // name another file had is taken by a full block only, as whoever named
  // that file may not know of a delta's base (Commit keeps to this too).
  std::optional<std::string> delta;
  if (std::optional<Base> against = options_.deltas && base ? base() : std::nullopt;
      against.has_value() && against->id != stored.id && !NameTaken(dir, name)) {
    delta = DeltaOf(bytes, *against);
    const int base_dir = Directory(against->id.hash[0], /*create=*/false);
    uint64_t base_size = 0;
    BlockId base_of_base;
    if (delta.has_value() && base_dir >= 0 &&
        MarkIfWhole(base_dir, against->id, &base_size, &base_of_base) && base_of_base.IsZero()) {
      stored.base = against->id;
    } else {
      delta.reset();
    }
  }
  absl::StatusOr<std::string> file =
      EncodeFile(bytes.size(), delta.has_value() ? absl::string_view(*delta) : bytes,
                 delta.has_value() ? &stored.base : nullptr, options_.zstd_level);
  if (!file.ok())
    return absl::InternalError(absl::StrCat("block ", name, ": ", file.status().message()));
  absl::StatusOr<std::string> temporary = WriteTemporary(dir, name, *file);
  if (!temporary.ok()) return temporary.status();
  pending_.push_back({index, *std::move(temporary), stored.id, delta.has_value()});
  written_[stored.id] = {file->size(), stored.base};
  stored.written = true;
  stored.stored_bytes = file->size();
  return stored;
}

absl::StatusOr<std::string> BlockStore::WriteTemporary(int dir, const std::string& name,
                                                       absl::string_view file) {
  const std::string temporary = absl::StrCat(kTemporaryPrefix, RandomName());
  UniqueFd fd(
      openat(dir, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create block ", name));
  // Writeback starts now; Commit waits for it (one block at a time would
  // wait for each in turn).
  if (!WriteAllAt(fd.get(), file, 0) ||
      (options_.durable && sync_file_range(fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE) != 0 &&
       errno != ESPIPE && errno != EINVAL) ||
      close(fd.release()) != 0) {
    const absl::Status failed = ErrnoStatus(errno, absl::StrCat("write block ", name));
    unlinkat(dir, temporary.c_str(), 0);
    return failed;
  }
  return temporary;
}

bool BlockStore::MarkIfWhole(int dir, const BlockId& id, uint64_t* size, BlockId* base) {
  // Without deltas, a delta is not taken as the block: it is written whole
  // over it (readable by heapd from before deltas).
  if (!MarkFile(dir, id.Hex(), size, base) || (!base->IsZero() && !options_.deltas)) {
    *base = BlockId();
    return false;
  }
  if (base->IsZero() || marked_bases_.count(*base) != 0) return true;
  // A delta is whole only with its base, a full block.
  const int base_dir = Directory(base->hash[0], /*create=*/false);
  uint64_t base_size = 0;
  BlockId base_of_base;
  if (base_dir < 0 || !MarkFile(base_dir, base->Hex(), &base_size, &base_of_base) ||
      !base_of_base.IsZero()) {
    *base = BlockId();  // not whole: whoever writes it anew says its own
    return false;
  }
  unsynced_.set(base->hash[0]);
  marked_bases_.insert(*base);
  return true;
}

BlockStore::~BlockStore() {
  for (const Pending& block : pending_) {
    unlinkat(directories_[block.directory].get(), block.temporary.c_str(), 0);
  }
}

absl::Status BlockStore::Commit(std::set<BlockId>* adopted_bases) {
  // Each block's bytes durable before its name: a name never leads to
  // bytes a crash could lose.
  for (const Pending& block : pending_) {
    const int dir = directories_[block.directory].get();
    const std::string name = block.id.Hex();
    if (options_.durable) {
      UniqueFd fd(openat(dir, block.temporary.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid() || fdatasync(fd.get()) != 0) {
        return ErrnoStatus(errno, absl::StrCat("sync block ", name));
      }
    }
    unsynced_.set(block.directory);
    if (renameat2(dir, block.temporary.c_str(), dir, name.c_str(), RENAME_NOREPLACE) == 0) {
      // A delta whose name a gc had set aside meanwhile (Put saw none):
      // made whole, as the one put back may be named by others.
      if (block.delta && Exists(dir, absl::StrCat(kAsidePrefix, name))) {
        absl::StatusOr<std::string> bytes = Get(block.id);
        if (!bytes.ok()) return bytes.status();
        if (absl::Status s = WriteWholeOver(dir, block.id, *bytes); !s.ok()) return s;
      }
      continue;
    }
    if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("rename block ", name));
    // Another writer's arrived meanwhile: it stays (its mark with it) if it
    // is whole, whatever its form (a delta's base is said to the caller,
    // who names it too); else it is replaced, by a full block only (see
    // Put): a delta of this store's is made whole first.
    uint64_t size = 0;
    BlockId base;
    if (MarkIfWhole(dir, block.id, &size, &base)) {
      unlinkat(dir, block.temporary.c_str(), 0);
      if (!base.IsZero() && adopted_bases != nullptr) adopted_bases->insert(base);
      continue;
    }
    if (block.delta) {
      absl::StatusOr<std::string> bytes = PendingBytes(dir, block);
      if (!bytes.ok()) return bytes.status();
      unlinkat(dir, block.temporary.c_str(), 0);
      if (absl::Status s = WriteWholeOver(dir, block.id, *bytes); !s.ok()) return s;
    } else if (renameat(dir, block.temporary.c_str(), dir, name.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename block ", name));
    }
  }
  pending_.clear();
  written_.clear();
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

bool BlockStore::Mark(const BlockId& id, BlockId* base) {
  const int dir = Directory(id.hash[0], /*create=*/false);
  uint64_t size = 0;
  if (dir < 0 || !MarkIfWhole(dir, id, &size, base)) return false;
  unsynced_.set(id.hash[0]);
  return true;
}

absl::StatusOr<std::string> BlockStore::PendingBytes(int dir, const Pending& block) {
  UniqueFd fd(openat(dir, block.temporary.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("reopen block ", block.id.Hex()));
  absl::StatusOr<File> file = Read(fd.get(), block.id.Hex());
  if (!file.ok()) return file.status();
  return Decode(block.id, *file);
}

absl::Status BlockStore::WriteWholeOver(int dir, const BlockId& id, absl::string_view bytes) {
  const std::string name = id.Hex();
  absl::StatusOr<std::string> file = EncodeFile(bytes.size(), bytes, nullptr, options_.zstd_level);
  if (!file.ok()) return file.status();
  absl::StatusOr<std::string> temporary = WriteTemporary(dir, name, *file);
  if (!temporary.ok()) return temporary.status();
  UniqueFd written(openat(dir, temporary->c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!written.valid() || (options_.durable && fdatasync(written.get()) != 0) ||
      renameat(dir, temporary->c_str(), dir, name.c_str()) != 0) {
    const absl::Status failed = ErrnoStatus(errno, absl::StrCat("write block ", name, " whole"));
    unlinkat(dir, temporary->c_str(), 0);
    return failed;
  }
  unsynced_.set(id.hash[0]);
  return absl::OkStatus();
}

absl::StatusOr<BlockStore::File> BlockStore::Load(const BlockId& id) {
  const std::string name = id.Hex();
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
  return Read(fd.get(), name);
}

absl::StatusOr<BlockStore::File> BlockStore::Read(int fd, const std::string& name) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("block ", name, ": ", why));
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat block ", name));
  // A delta's frame holds its bitmap and at most every sector.
  const uint64_t max_file = kDeltaHeaderBytes + ZSTD_compressBound(options_.max_block_bytes +
                                                                   options_.max_block_bytes / 8);
  if (!S_ISREG(st.st_mode)) return bad("not a regular file");
  if (static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      static_cast<uint64_t>(st.st_size) > max_file) {
    return bad(absl::StrCat(st.st_size, " bytes"));
  }
  File file;
  file.bytes.assign(static_cast<size_t>(st.st_size), '\0');
  if (!ReadAllAt(fd, file.bytes.data(), file.bytes.size(), 0)) {
    return bad("cannot be read whole");
  }
  file.header_bytes = HeaderBytesOf(file.bytes.data());
  file.size = GetLe64(file.bytes.data() + 4);
  if (file.header_bytes == 0 || file.bytes.size() < file.header_bytes ||
      GetLe64(file.bytes.data() + 12) != file.bytes.size() - file.header_bytes ||
      file.size > options_.max_block_bytes) {
    return bad("its header does not fit it");
  }
  if (file.header_bytes == kDeltaHeaderBytes) {
    if (GetLe32(file.bytes.data() + 20) != kSectorBytes) {
      return bad("a delta of another sector size");
    }
    file.base = BlockId::FromRaw(file.bytes.data() + kHeaderBytes);
  }
  return file;
}

absl::StatusOr<std::string> BlockStore::DecodeFull(const BlockId& id, const File& file,
                                                   const std::string& what) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(what, id.Hex(), ": ", why));
  };
  if (!file.base.IsZero()) return bad("a delta, where a full block must be");
  std::optional<std::string> bytes = Inflate(file.frame(), file.size);
  if (!bytes.has_value() || bytes->size() != file.size) {
    return bad("does not decompress to its size");
  }
  if (BlockId::Of(*bytes) != id) return bad("its bytes do not have its hash");
  return *std::move(bytes);
}

absl::StatusOr<std::string> BlockStore::Decode(const BlockId& id, const File& file) {
  if (file.base.IsZero()) return DecodeFull(id, file, "block ");
  const std::string name = id.Hex();
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("block ", name, ": ", why));
  };
  absl::StatusOr<File> base_file = Load(file.base);
  if (base_file.status().code() == absl::StatusCode::kNotFound) {
    return bad(absl::StrCat("its base block ", file.base.Hex(), " is missing"));
  }
  absl::StatusOr<std::string> base =
      base_file.ok() ? DecodeFull(file.base, *base_file, "the base of block " + name + ", ")
                     : base_file.status();
  if (!base.ok()) return base.status();
  const uint64_t sectors = SectorsOf(file.size);
  const uint64_t bitmap = (sectors + 7) / 8;
  std::optional<std::string> delta = Inflate(file.frame(), bitmap + file.size);
  if (!delta.has_value() || delta->size() < bitmap) return bad("its delta does not decompress");
  std::string bytes;
  bytes.reserve(file.size);
  absl::string_view sectors_held = absl::string_view(*delta).substr(bitmap);
  for (uint64_t sector = 0; sector < sectors; ++sector) {
    const uint64_t at = sector * kSectorBytes;
    const uint64_t length = std::min<uint64_t>(kSectorBytes, file.size - at);
    const bool held = (static_cast<uint8_t>((*delta)[sector / 8]) >> (sector % 8)) & 1;
    absl::string_view from =
        held ? sectors_held : absl::string_view(*base).substr(std::min<uint64_t>(at, base->size()));
    if (from.size() < length) {
      return bad(absl::StrCat("sector ", sector, " is in neither it nor its base"));
    }
    bytes.append(from.data(), length);
    if (held) sectors_held.remove_prefix(length);
  }
  if (!sectors_held.empty()) return bad("its delta holds more sectors than its bitmap says");
  if (BlockId::Of(bytes) != id) return bad("its bytes do not have its hash");
  return bytes;
}

absl::StatusOr<std::string> BlockStore::Get(const BlockId& id) {
  absl::StatusOr<File> file = Load(id);
  if (!file.ok()) return file.status();
  return Decode(id, *file);
}

absl::StatusOr<BlockStore::Base> BlockStore::BaseFor(const BlockId& id) {
  absl::StatusOr<File> file = Load(id);
  if (!file.ok()) return file.status();
  Base base;
  base.id = file->base.IsZero() ? id : file->base;
  if (!file->base.IsZero()) file = Load(base.id);
  if (!file.ok()) return file.status();
  if (!file->base.IsZero()) {
    return absl::DataLossError(
        absl::StrCat("block ", base.id.Hex(), ": a delta, where a full block must be"));
  }
  base.size = file->size;
  base.frame = std::string(file->frame());
  return base;
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
  if (dir < 0) return ErrnoStatus(errno, absl::StrCat("put block ", name, " back"));
  if (renameat2(dir, aside.name.c_str(), dir, name.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("put block ", name, " back"));
    // Written anew meanwhile. A full block there stays; a delta gives way
    // to the full block (whoever named the one set aside may not know the
    // new one's base, and a base must stay a full block; see Put): the one
    // set aside if it is a sound full block, else the block made whole.
    if (IsDeltaFile(dir, name)) {
      UniqueFd fd(openat(dir, aside.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      absl::StatusOr<File> set_aside =
          fd.valid() ? Read(fd.get(), name) : ErrnoStatus(errno, "open " + aside.name);
      absl::StatusOr<std::string> bytes =
          set_aside.ok() ? Decode(aside.id, *set_aside) : set_aside.status();
      if (set_aside.ok() && bytes.ok() && set_aside->base.IsZero()) {
        if (renameat(dir, aside.name.c_str(), dir, name.c_str()) != 0) {
          return ErrnoStatus(errno, absl::StrCat("put block ", name, " back"));
        }
        unsynced_.set(aside.directory);
        return absl::OkStatus();
      }
      if (!bytes.ok()) bytes = Get(aside.id);  // the new one, through its base
      // Neither reads: both stay, for verify to report and gc to retry.
      if (!bytes.ok()) return bytes.status();
      if (absl::Status s = WriteWholeOver(dir, aside.id, *bytes); !s.ok()) return s;
    }
    if (unlinkat(dir, aside.name.c_str(), 0) != 0) {
      return ErrnoStatus(errno, absl::StrCat("put block ", name, " back"));
    }
  }
  unsynced_.set(aside.directory);
  return absl::OkStatus();
}

}  // namespace heapd
