// BlockStore: content-addressed, compressed blocks in a directory that
// several heapds (nodes) may share — the foundation of incremental,
// deduplicated snapshots (snapshot/store_snapshots.h).
//
// A block is named by the SHA-256 of its bytes and stored once, compressed
// with zstd, as blocks/XX/<64 hex digits> (XX: the first two) under the
// store's root: a 24-byte header (magic "HBK1", the block's size, the
// compressed size, little endian) and one zstd frame. A block is written
// under a random temporary name (.tmp-RANDOM) beside it (its writeback
// started at once); Commit makes each durable (fdatasync) and only then
// renames it into place without replacing a sound block another writer put
// there first, so a reader never sees part of one, a name never leads to
// bytes a crash can lose, and writers of the same block on several nodes
// all succeed (the bytes are the same). A crashed writer leaves only a .tmp- file, which no one
// reads and gc removes. A file already there is taken as the block if this
// user wrote it and its header fits its size (its hash is checked whenever
// it is read), and its modification time is set to now, which tells gc a
// create is using it; else it is replaced. (A block whose bytes rotted
// under a sound header is found by verify and reads, not by creates.)
//
// A block may instead be stored as the 512-byte sectors where it differs from
// an earlier version of it, a full block (its *base*): Put with a base
// does so when at most half its sectors differ. Such a file ("HBD1") has
// the same header, then the base's id, then one zstd frame of a bitmap of
// the sectors it holds and those sectors; the base is always a full block (a
// delta's delta is taken against the first's base), so reading one needs
// at most two files. A delta is whole only with its base: Put and Mark
// mark both and say the base (Stored::base; Commit the bases of blocks
// another writer put first), which whoever names the block must keep too
// (a recipe's delta_bases: store_recipe.h). A delta only takes a free name;
// a file that is not whole is only replaced by the full block, and of a
// block set aside and one written meanwhile the full one stays: a name
// that held a full block never holds a delta while anyone names it.
//
// Nothing read is trusted: the file's size is capped before it is read,
// the header must match it, the block decompresses to exactly its size (a
// delta: its bitmap and sectors, then the base's sectors where it holds none),
// and its hash must be its name; else DATA_LOSS naming the block.
//
// Everything is done relative to the store's root descriptor, one path
// component at a time without following symlinks: a RunAs helper uses it
// with the caller's rights (util/run_as.h). Not thread-safe (it remembers
// which directories need an fsync); make one per operation.
#ifndef HEAPD_SNAPSHOT_BLOCK_STORE_H_
#define HEAPD_SNAPSHOT_BLOCK_STORE_H_

#include <sys/stat.h>

#include <array>
#include <bitset>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/unique_fd.h"

struct ZSTD_DCtx_s;  // zstd.h's ZSTD_DCtx

namespace heapd {

// SHA-256 of a block's bytes.
struct BlockId {
  std::array<uint8_t, 32> hash{};

  static BlockId Of(absl::string_view bytes);
  // From 64 lowercase hex digits; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<BlockId> FromHex(absl::string_view hex);
  // From 32 raw bytes (a recipe's packed ids).
  static BlockId FromRaw(const char* raw);
  std::string Hex() const;
  bool IsZero() const { return hash == std::array<uint8_t, 32>{}; }
  bool operator==(const BlockId& other) const { return hash == other.hash; }
  bool operator!=(const BlockId& other) const { return hash != other.hash; }
  bool operator<(const BlockId& other) const { return hash < other.hash; }
};

// A file's modification time in nanoseconds since the epoch.
int64_t ModifiedNs(const struct stat& st);

struct BlockStoreOptions {
  int zstd_level = 1;
  // Blocks larger than this are refused (Put) and not read (Get).
  uint64_t max_block_bytes = uint64_t{2} << 20;
  // false: a cache, not a store: no fsync at all (whatever a crash loses
  // or damages is found missing or wrong when read, and fetched again).
  bool durable = true;
  // false: no delta is written, and one found is not taken as the block
  // (written whole over it), so what this store names reads without
  // deltas (HRC1 recipes, for heapd from before them).
  bool deltas = true;
  // Stores of one operation working in parallel: Put writes a block the
  // store lacks only if claim(id) says no other has (it must be thread-safe).
  std::function<bool(const BlockId&)> claim;
};

class BlockStore {
 public:
  // The blocks under the store directory `root` (borrowed; it must outlive
  // this), making root/blocks if missing and `create`, else NOT_FOUND.
  static absl::StatusOr<BlockStore> At(int root, BlockStoreOptions options = {},
                                       bool create = true);
  BlockStore(BlockStore&&) = default;
  BlockStore& operator=(BlockStore&&) = default;
  // Blocks Put wrote and Commit did not rename are removed.
  ~BlockStore();

  struct Stored {
    BlockId id;
    bool written = false;       // false: the store had it already
    uint64_t stored_bytes = 0;  // its file's size
    BlockId base;               // not zero: it is a delta against this block
  };
  // A full block a new version of it may be stored against: its size and
  // its file's zstd frame, decompressed (and its hash checked) by Put only
  // as far as the diff needs.
  struct Base {
    BlockId id;
    uint64_t size = 0;
    std::string frame;
  };
  // Stores `bytes` unless a block of the same hash is there (then marks it
  // used now). A block written is readable and durable once Commit returns.
  // If it must be written, its name is free and `base` gives one, it is
  // stored as a delta against it when at most half its sectors differ.
  absl::StatusOr<Stored> Put(absl::string_view bytes,
                             const std::function<std::optional<Base>()>& base = nullptr);
  // The full block behind `id`, to store a new version of it against: the
  // block itself, or a delta's base. Its header is checked here; its bytes
  // by Put, before a delta against it is kept.
  absl::StatusOr<Base> BaseFor(const BlockId& id);
  // Makes the blocks Put wrote durable, renames them into place and fsyncs
  // the directories changed since the last call (Put's, Remove's). Where
  // another writer's block got there first and stays, a delta's base is
  // added to `adopted_bases`: the caller names it as it names Put's.
  absl::Status Commit(std::set<BlockId>* adopted_bases = nullptr);

  // Marks the block in use as Put does when it finds it (a delta: its base
  // too, said in `*base`, else zero); false if it is not there (whole,
  // this user's) to be marked.
  bool Mark(const BlockId& id, BlockId* base);

  // The block's bytes, checked (see above). NOT_FOUND if it is not there.
  absl::StatusOr<std::string> Get(const BlockId& id);
  // Its file's size, or NOT_FOUND (not checked: du).
  absl::StatusOr<uint64_t> StoredBytes(const BlockId& id);

  // Every block file, leftover .tmp- file (a crashed writer's; zero id)
  // and block set aside by a crashed gc (.trash-ID): its id, size and
  // modification time. Stops at the first error `visit` returns.
  enum class Kind { kBlock, kTemporary, kAside };
  struct Entry {
    Kind kind = Kind::kBlock;
    BlockId id;
    std::string name;   // its name in its directory
    int directory = 0;  // XX as a number
    uint64_t bytes = 0;
    int64_t modified_ns = 0;  // since the epoch
  };
  absl::Status ForEach(const std::function<absl::Status(const Entry&)>& visit);
  // Removes the file of `entry` (ForEach's), durably once Commit returns.
  absl::Status Remove(const Entry& entry);
  // gc's removal of the block of `entry` (version_store.h): sets it aside
  // (.trash-ID), then removes it unless it was marked used at or after
  // `cutoff_ns` meanwhile (then it goes back). True if removed.
  absl::StatusOr<bool> RemoveUnlessMarked(const Entry& entry, int64_t cutoff_ns);
  // Puts a block set aside back in place (or drops it if the block was
  // written anew meanwhile).
  absl::Status PutBack(const Entry& aside);

 private:
  BlockStore(UniqueFd blocks, BlockStoreOptions options)
      : blocks_(std::move(blocks)), options_(options) {}
  // blocks/XX, made if `create` and missing; -1 with errno otherwise.
  int Directory(int index, bool create);
  // Whether `id`'s file is whole (see MarkFile in block_store.cc) and, if a
  // delta, its base too; marks both, and says the base.
  bool MarkIfWhole(int dir, const BlockId& id, uint64_t* size, BlockId* base);
  // Writes `file` under a temporary name in `dir`; returns that name.
  absl::StatusOr<std::string> WriteTemporary(int dir, const std::string& name,
                                             absl::string_view file);
  struct Pending;
  // The bytes of the pending delta `block`, read back from its file.
  absl::StatusOr<std::string> PendingBytes(int dir, const Pending& block);
  // Writes `bytes` as the full block `id` over whatever file has its name
  // in `dir`, durably.
  absl::Status WriteWholeOver(int dir, const BlockId& id, absl::string_view bytes);
  // The file of `id` (set aside by a crashed gc: found there), or the open
  // `fd`, read whole and its header checked.
  struct File;
  absl::StatusOr<File> Load(const BlockId& id);
  absl::StatusOr<File> Read(int fd, const std::string& name);
  // The bytes of block `id` from its `file`, checked; DecodeFull refuses a
  // delta (`what` names the block in errors).
  absl::StatusOr<std::string> Decode(const BlockId& id, const File& file);
  absl::StatusOr<std::string> DecodeFull(const BlockId& id, const File& file,
                                         const std::string& what);
  // A delta of `bytes` against `base` (see block_store.cc), if one pays.
  std::optional<std::string> DeltaOf(absl::string_view bytes, const Base& base);

  UniqueFd blocks_;
  BlockStoreOptions options_;
  std::array<UniqueFd, 256> directories_;
  std::bitset<256> unsynced_;
  // Blocks written under temporary names, to be renamed by Commit.
  struct Pending {
    int directory;
    std::string temporary;
    BlockId id;
    bool delta;
  };
  std::vector<Pending> pending_;
  struct Written {
    uint64_t bytes;  // its file's size
    BlockId base;    // a delta's
  };
  std::map<BlockId, Written> written_;  // the pending blocks, by id
  std::set<BlockId> marked_bases_;      // deltas' bases marked in use
  // Reused by every diff of this store (one worker's) rather than made
  // for each: the decompression context and the base's bytes.
  struct DecoderFree {
    void operator()(ZSTD_DCtx_s* decoder) const;
  };
  std::unique_ptr<ZSTD_DCtx_s, DecoderFree> decoder_;
  std::string base_bytes_;
};

}  // namespace heapd

#endif  // HEAPD_SNAPSHOT_BLOCK_STORE_H_
