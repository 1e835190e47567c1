// BlockStore: content-addressed, compressed blocks in a directory that
// several heapds (nodes) may share — the foundation of incremental,
// deduplicated snapshots (issue 12; the versions' recipes and the commands
// that use them are not built yet).
//
// A block is named by the SHA-256 of its bytes and stored once, compressed
// with zstd, as blocks/XX/<64 hex digits> (XX: the first two): a 24-byte
// header (magic "HBK1", the block's size, the compressed size, little
// endian) and one zstd frame. A block is written under a random temporary
// name (.tmp-RANDOM) beside it and renamed into place, so a reader never
// sees part of one, and writers of the same block on several nodes all
// succeed (the bytes are the same; one rename wins). A crashed writer
// leaves only a .tmp- file, which no one reads. A file already there is
// taken as the block if its header fits its size (its hash is checked when
// it is read); else it is replaced.
//
// Nothing read is trusted: the file's size is capped before it is read,
// the header must match it, the block decompresses to exactly its size,
// and its hash must be its name; else DATA_LOSS naming the block.
//
// Thread-safe (no state beyond the directory).
#ifndef HEAPD_SNAPSHOT_BLOCK_STORE_H_
#define HEAPD_SNAPSHOT_BLOCK_STORE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace heapd {

// SHA-256 of a block's bytes.
struct BlockId {
  std::array<uint8_t, 32> hash{};

  static BlockId Of(absl::string_view bytes);
  // From 64 lowercase hex digits; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<BlockId> FromHex(absl::string_view hex);
  std::string Hex() const;
  bool operator==(const BlockId& other) const { return hash == other.hash; }
  bool operator<(const BlockId& other) const { return hash < other.hash; }
};

// 128 random bits in hex: temporary names unique across the nodes that
// share a store (pids are not).
std::string RandomName();

struct BlockStoreOptions {
  int zstd_level = 3;
  // Blocks larger than this are refused (Put) and not read (Get).
  uint64_t max_block_bytes = uint64_t{64} << 20;
};

class BlockStore {
 public:
  // Opens the store in `dir`, making dir and dir/blocks if missing.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const std::string& dir,
                                                          BlockStoreOptions options = {});

  struct Stored {
    BlockId id;
    bool written = false;       // false: the store had it already
    uint64_t stored_bytes = 0;  // its file's size
  };
  // Stores `bytes` unless a block of the same hash is there; durable
  // (fsync of the file and its directory) before it returns.
  absl::StatusOr<Stored> Put(absl::string_view bytes) const;

  // The block's bytes, checked (see above). NOT_FOUND if it is not there.
  absl::StatusOr<std::string> Get(const BlockId& id) const;
  bool Has(const BlockId& id) const;

  const std::string& dir() const { return dir_; }
  std::string PathOf(const BlockId& id) const;

 private:
  BlockStore(std::string dir, BlockStoreOptions options)
      : dir_(std::move(dir)), options_(options) {}

  const std::string dir_;
  const BlockStoreOptions options_;
};

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_BLOCK_STORE_H_
