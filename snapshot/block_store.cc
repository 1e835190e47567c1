#include "snapshot/block_store.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "heap/data_file.h"
#include "heap/metadata_store.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr char kMagic[4] = {'H', 'B', 'K', '1'};
constexpr size_t kHeaderBytes = 24;

void PutLe64(char* at, uint64_t value) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>(value >> (8 * i));
}

uint64_t GetLe64(const char* at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<uint8_t>(at[i])} << (8 * i);
  return value;
}

bool WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

absl::Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return ErrnoStatus(errno, absl::StrCat("make ", path));
}

// Whether `path` holds a block file whose header fits its size (its hash
// is checked when it is read): then Put need not write it again.
bool LooksWhole(const std::string& path, uint64_t* size) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  char header[kHeaderBytes];
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      pread(fd.get(), header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return false;
  }
  *size = static_cast<uint64_t>(st.st_size);
  return std::memcmp(header, kMagic, sizeof(kMagic)) == 0 &&
         GetLe64(header + 12) == *size - kHeaderBytes;
}

}  // namespace

std::string RandomName() {
  uint64_t random[2];
  while (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
  }
  return absl::StrCat(absl::Hex(random[0], absl::kZeroPad16),
                      absl::Hex(random[1], absl::kZeroPad16));
}

BlockId BlockId::Of(absl::string_view bytes) {
  BlockId id;
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), id.hash.data(), &length, EVP_sha256(), nullptr);
  return id;
}

absl::StatusOr<BlockId> BlockId::FromHex(absl::string_view hex) {
  if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CHexEscape(hex.substr(0, 80)), "' is not a block name"));
  }
  BlockId id;
  const std::string bytes = absl::HexStringToBytes(hex);
  std::memcpy(id.hash.data(), bytes.data(), id.hash.size());
  return id;
}

std::string BlockId::Hex() const {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(hash.data()), hash.size()));
}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const std::string& dir,
                                                             BlockStoreOptions options) {
  for (const std::string& path : {dir, dir + "/blocks"}) {
    if (absl::Status s = MakeDirectory(path); !s.ok()) return s;
  }
  return std::unique_ptr<BlockStore>(new BlockStore(dir, options));
}

std::string BlockStore::PathOf(const BlockId& id) const {
  const std::string hex = id.Hex();
  return absl::StrCat(dir_, "/blocks/", hex.substr(0, 2), "/", hex);
}

bool BlockStore::Has(const BlockId& id) const {
  struct stat st;
  return stat(PathOf(id).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<BlockStore::Stored> BlockStore::Put(absl::string_view bytes) const {
  if (bytes.size() > options_.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of ", bytes.size(),
                                                   " bytes is larger than the store's ",
                                                   options_.max_block_bytes));
  }
  Stored stored;
  stored.id = BlockId::Of(bytes);
  const std::string path = PathOf(stored.id);
  const std::string parent = path.substr(0, path.rfind('/'));
  if (LooksWhole(path, &stored.stored_bytes)) {
    // Another writer's, perhaps not yet durable in its directory.
    if (absl::Status s = SyncDirectory(parent); !s.ok()) return s;
    return stored;
  }
  // Missing, or damaged (then replaced by the rename below).
  std::string file(kHeaderBytes + ZSTD_compressBound(bytes.size()), '\0');
  const size_t compressed = ZSTD_compress(file.data() + kHeaderBytes, file.size() - kHeaderBytes,
                                          bytes.data(), bytes.size(), options_.zstd_level);
  if (ZSTD_isError(compressed)) {
    return absl::InternalError(
        absl::StrCat("compress block ", stored.id.Hex(), ": ", ZSTD_getErrorName(compressed)));
  }
  file.resize(kHeaderBytes + compressed);
  std::memcpy(file.data(), kMagic, sizeof(kMagic));
  PutLe64(file.data() + 4, bytes.size());
  PutLe64(file.data() + 12, compressed);
  std::memset(file.data() + 20, 0, 4);
  if (absl::Status s = MakeDirectory(parent); !s.ok()) return s;
  const std::string temporary = absl::StrCat(parent, "/.tmp-", RandomName());
  {
    UniqueFd fd(
        open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("create ", temporary));
    if (!WriteAll(fd.get(), file) || fsync(fd.get()) != 0) {
      const absl::Status failed = ErrnoStatus(errno, absl::StrCat("write ", temporary));
      unlink(temporary.c_str());
      return failed;
    }
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    const absl::Status failed = ErrnoStatus(errno, absl::StrCat("rename into ", path));
    unlink(temporary.c_str());
    return failed;
  }
  if (absl::Status s = SyncDirectory(parent); !s.ok()) return s;
  stored.written = true;
  stored.stored_bytes = file.size();
  return stored;
}

absl::StatusOr<std::string> BlockStore::Get(const BlockId& id) const {
  const std::string path = PathOf(id);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("block ", path, ": ", why));
  };
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no block ", path));
    return ErrnoStatus(errno, absl::StrCat("open ", path));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  const uint64_t max_file = kHeaderBytes + ZSTD_compressBound(options_.max_block_bytes);
  if (!S_ISREG(st.st_mode)) return bad("not a regular file");
  if (static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
      static_cast<uint64_t>(st.st_size) > max_file) {
    return bad(absl::StrCat(st.st_size, " bytes"));
  }
  std::string file(static_cast<size_t>(st.st_size), '\0');
  if (pread(fd.get(), file.data(), file.size(), 0) != static_cast<ssize_t>(file.size())) {
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
  if (!(BlockId::Of(bytes) == id)) return bad("its bytes do not have its hash");
  return bytes;
}

}  // namespace heapd
