#include "snapshot/block_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

// Regular files under `dir`; with `temporary`, only those named .tmp-*.
size_t FilesUnder(const std::string& dir, bool temporary = false) {
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const bool is_temporary = entry.path().filename().string().rfind(".tmp-", 0) == 0;
    files += entry.is_regular_file() && (!temporary || is_temporary) ? 1 : 0;
  }
  return files;
}

class BlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.Sub("store"));
    root_.reset(open(dir_.Sub("store").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_.valid());
    auto store = BlockStore::At(root_.get());
    ASSERT_TRUE(store.ok()) << store.status();
    store_.emplace(*std::move(store));
  }
  // Put and Commit: the block durable and in place.
  absl::StatusOr<BlockStore::Stored> Put(absl::string_view bytes,
                                         std::optional<BlockId> against = std::nullopt) {
    absl::StatusOr<BlockStore::Stored> stored =
        store_->Put(bytes, [&]() -> std::optional<BlockStore::Base> {
          if (!against.has_value()) return std::nullopt;
          absl::StatusOr<BlockStore::Base> base = store_->BaseFor(*against);
          EXPECT_TRUE(base.ok()) << base.status();
          if (!base.ok()) return std::nullopt;
          return *std::move(base);
        });
    if (stored.ok()) {
      if (absl::Status s = store_->Commit(); !s.ok()) return s;
    }
    return stored;
  }
  std::string PathOf(const BlockId& id) {
    return dir_.Sub("store/blocks/" + id.Hex().substr(0, 2) + "/" + id.Hex());
  }

  TestDir dir_{"/tmp"};  // another user's files are made here
  UniqueFd root_;
  std::optional<BlockStore> store_;
};

TEST_F(BlockStoreTest, ABlockComesBackAsStoredAndIsStoredOnce) {
  const std::string zeros(1 << 20, '\0');
  auto first = Put(zeros);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->written);
  EXPECT_LT(first->stored_bytes, 4096u);  // compressed
  EXPECT_EQ(first->id.Hex().size(), 64u);
  auto again = Put(zeros);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->written);
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(FilesUnder(dir_.Sub("store/blocks")), 1u);
  auto got = store_->Get(first->id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, zeros);

  const std::string noise = RandomBytes(300000, 7);
  auto stored = Put(noise);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*store_->Get(stored->id), noise);
  EXPECT_EQ(FilesUnder(dir_.Sub("store/blocks")), 2u);
  EXPECT_EQ(FilesUnder(dir_.Sub("store/blocks"), /*temporary=*/true), 0u);
  auto hex = BlockId::FromHex(stored->id.Hex());
  ASSERT_TRUE(hex.ok());
  EXPECT_EQ(*hex, stored->id);
  EXPECT_EQ(BlockId::FromHex(std::string(30, '.') + "/" + std::string(33, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Get(BlockId::Of("absent")).status().code(), absl::StatusCode::kNotFound);
}

// Nothing read is trusted: a changed byte, a block under another's name, a
// header that lies, a FIFO where a block should be.
TEST_F(BlockStoreTest, ADamagedOrSwappedBlockIsDataLoss) {
  auto a = Put(RandomBytes(5000, 1));
  auto b = Put(RandomBytes(6000, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  {
    std::fstream file(PathOf(a->id), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('x');
  }
  EXPECT_EQ(store_->Get(a->id).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::copy_file(PathOf(b->id), PathOf(a->id),
                             std::filesystem::copy_options::overwrite_existing);
  const absl::Status swapped = store_->Get(a->id).status();
  EXPECT_EQ(swapped.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(swapped.message().find("hash"), std::string::npos) << swapped;
  std::filesystem::resize_file(PathOf(b->id), 30);
  EXPECT_EQ(store_->Get(b->id).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::remove(PathOf(b->id));
  ASSERT_EQ(mkfifo(PathOf(b->id).c_str(), 0600), 0);
  EXPECT_EQ(store_->Get(b->id).status().code(), absl::StatusCode::kDataLoss);
}

// A file planted or damaged where a block belongs is replaced by the next
// Put of that block, not taken as it.
TEST_F(BlockStoreTest, APlantedBlockFileIsReplaced) {
  const std::string bytes = RandomBytes(9000, 3);
  const BlockId id = BlockId::Of(bytes);
  std::filesystem::create_directories(std::filesystem::path(PathOf(id)).parent_path());
  std::ofstream(PathOf(id)) << "HBK1 but not a block";
  auto stored = Put(bytes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->written);
  EXPECT_EQ(*store_->Get(id), bytes);
  std::filesystem::remove(PathOf(id));
  std::filesystem::create_symlink("/etc/passwd", PathOf(id));
  stored = Put(bytes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->written);
  EXPECT_FALSE(std::filesystem::is_symlink(PathOf(id)));
  EXPECT_EQ(*store_->Get(id), bytes);
}

TEST_F(BlockStoreTest, BlocksAboveTheLimitAreRefused) {
  BlockStoreOptions options;
  options.max_block_bytes = 1000;
  auto small = BlockStore::At(root_.get(), options);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->Put(std::string(1001, 'a')).status().code(), absl::StatusCode::kInvalidArgument);
  // A block a store with a larger limit wrote is not read past this one's.
  auto big = Put(std::string(5000, 'b'));
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(small->Get(big->id).status().code(), absl::StatusCode::kDataLoss);
}

// Writers of the same blocks at once (as nodes sharing a store) all
// succeed and leave one copy each, readable.
TEST_F(BlockStoreTest, ConcurrentWritersOfTheSameBlocksLoseNothing) {
  std::vector<std::string> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(RandomBytes(40000 + i, 100 + i));
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&] {
      // One store each (a BlockStore is one operation's), as on nodes.
      auto mine = BlockStore::At(root_.get());
      for (const std::string& block : blocks) {
        if (!mine.ok() || !mine->Put(block).ok()) ++failures;
      }
      if (!mine.ok() || !mine->Commit().ok()) ++failures;
    });
  }
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(FilesUnder(dir_.Sub("store/blocks")), blocks.size());
  EXPECT_EQ(FilesUnder(dir_.Sub("store/blocks"), /*temporary=*/true), 0u);
  for (const std::string& block : blocks) {
    auto got = store_->Get(BlockId::Of(block));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, block);
  }
}

// A block that changed in a few sectors is stored as those against
// its earlier version, reads back whole, and a delta of it is taken
// against the same full block (never a delta's delta).
TEST_F(BlockStoreTest, AChangedBlockIsStoredAsItsChangedSectors) {
  const std::string first = RandomBytes(1 << 20, 1);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  std::string second = first;
  second[5] ^= 1;
  second[300 * 1024] ^= 1;
  auto delta = Put(second, base->id);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_TRUE(delta->written);
  EXPECT_EQ(delta->base, base->id);
  EXPECT_LT(delta->stored_bytes, 2048u);  // two sectors of random bytes, a bitmap, the header
  EXPECT_EQ(*store_->Get(delta->id), second);

  std::string third = second;
  third[600 * 1024] ^= 1;
  auto next = Put(third, delta->id);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->base, base->id);
  EXPECT_EQ(*store_->Get(next->id), third);
  auto behind = store_->BaseFor(next->id);
  ASSERT_TRUE(behind.ok()) << behind.status();
  EXPECT_EQ(behind->id, base->id);

  // Found again (Put of the same bytes, Mark): its base is said.
  auto again = Put(third);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->written);
  EXPECT_EQ(again->base, base->id);
  BlockId marked_base;
  EXPECT_TRUE(store_->Mark(next->id, &marked_base));
  EXPECT_EQ(marked_base, base->id);
  EXPECT_TRUE(store_->Mark(base->id, &marked_base));
  EXPECT_TRUE(marked_base.IsZero());
}

TEST_F(BlockStoreTest, ABlockThatChangedAllOverIsStoredWhole) {
  auto base = Put(RandomBytes(1 << 20, 2));
  ASSERT_TRUE(base.ok()) << base.status();
  auto changed = Put(RandomBytes(1 << 20, 3), base->id);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(changed->written);
  EXPECT_TRUE(changed->base.IsZero());
  // A longer version (a metadata log that grew) keeps the sectors it shares.
  std::string grown = RandomBytes(1 << 19, 5);
  auto small = Put(grown);
  ASSERT_TRUE(small.ok()) << small.status();
  grown += RandomBytes(1 << 17, 6);
  auto appended = Put(grown, small->id);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->base, small->id);
  EXPECT_EQ(*store_->Get(appended->id), grown);
}

// A delta is whole only with its base: without it, it reads as DATA_LOSS
// naming the base, is not taken as present (Put writes it anew, whole)
// and cannot be marked.
TEST_F(BlockStoreTest, ADeltaWithoutItsBaseIsDataLossAndWrittenAnew) {
  const std::string first = RandomBytes(1 << 20, 7);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  std::string second = first;
  second[0] ^= 1;
  auto delta = Put(second, base->id);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(delta->base, base->id);
  ASSERT_EQ(unlink(PathOf(base->id).c_str()), 0);

  auto lost = store_->Get(delta->id);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(lost.status().message().find(base->id.Hex()), std::string::npos) << lost.status();
  BlockId marked_base;
  EXPECT_FALSE(store_->Mark(delta->id, &marked_base));

  auto anew = Put(second);
  ASSERT_TRUE(anew.ok()) << anew.status();
  EXPECT_TRUE(anew->written);
  EXPECT_TRUE(anew->base.IsZero());
  EXPECT_EQ(*store_->Get(delta->id), second);
}

// A base whose file was damaged (its frame decompresses to other bytes) is
// no base: the block is stored whole, and still reads back.
TEST_F(BlockStoreTest, ADamagedBaseIsNoBase) {
  const std::string first = RandomBytes(1 << 20, 11);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  {
    // Random bytes are stored as raw zstd blocks: a byte flipped in the
    // middle of the frame decompresses without error, to other bytes.
    std::fstream file(PathOf(base->id), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(512 << 10);
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(512 << 10);
    byte = static_cast<char>(byte ^ 0x40);
    file.write(&byte, 1);
  }
  ASSERT_EQ(store_->Get(base->id).status().code(), absl::StatusCode::kDataLoss);
  std::string second = first;
  second[100] ^= 1;
  auto stored = Put(second, base->id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->written);
  EXPECT_TRUE(stored->base.IsZero());
  EXPECT_EQ(*store_->Get(stored->id), second);
}

// Delta files are not trusted: one whose base is itself a delta, or whose
// sectors do not fit its bitmap, reads as DATA_LOSS, not as other bytes.
TEST_F(BlockStoreTest, AForgedDeltaIsDataLoss) {
  const std::string first = RandomBytes(1 << 20, 8);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  std::string second = first;
  second[4096] ^= 1;
  auto delta = Put(second, base->id);
  ASSERT_TRUE(delta.ok()) << delta.status();
  std::string third = first;
  third[8192] ^= 1;
  auto other = Put(third, base->id);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->base, base->id);

  auto read_file = [&](const BlockId& id) {
    std::ifstream in(PathOf(id), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto write_file = [&](const BlockId& id, const std::string& bytes) {
    ASSERT_EQ(unlink(PathOf(id).c_str()), 0);
    std::ofstream(PathOf(id), std::ios::binary) << bytes;
  };
  // `other` names `delta` (a delta) as its base.
  std::string forged = read_file(other->id);
  std::memcpy(&forged[24], delta->id.hash.data(), 32);
  write_file(other->id, forged);
  auto deep = store_->Get(other->id);
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kDataLoss) << deep.status();
  EXPECT_NE(deep.status().message().find("a delta, where a full block must be"), std::string::npos)
      << deep.status();

  // `delta`'s frame swapped for `other`'s original one: a hash mismatch.
  std::string swapped = read_file(delta->id);
  write_file(other->id, swapped);
  auto wrong = store_->Get(other->id);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss) << wrong.status();

  // A truncated frame.
  swapped.resize(swapped.size() - 3);
  swapped[12] = static_cast<char>(swapped.size() - 56);
  write_file(delta->id, swapped);
  auto cut = store_->Get(delta->id);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
}

// The first 4 bytes of `id`'s file: "HBK1" (full) or "HBD1" (delta).
std::string MagicAt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string magic(4, '\0');
  in.read(magic.data(), 4);
  return magic;
}

// A delta never takes a name another file had, as whoever named that file
// may not know the delta's base: another writer's block that got there
// first stays (its base said to the caller if it is a delta), one that is
// not whole (here another user's) is replaced by the block made whole, and
// a name gc set aside is written whole.
TEST_F(BlockStoreTest, ADeltaTakesOnlyAFreeName) {
  const std::string first = RandomBytes(1 << 20, 9);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  std::string second = first;
  second[100] ^= 1;

  // Another writer commits the block whole between this Put and Commit.
  auto pending = store_->Put(
      second, [&]() -> std::optional<BlockStore::Base> { return *store_->BaseFor(base->id); });
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_EQ(pending->base, base->id);
  {
    auto other = BlockStore::At(root_.get());
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE(other->Put(second).ok());
    ASSERT_TRUE(other->Commit().ok());
  }
  std::set<BlockId> adopted;
  ASSERT_TRUE(store_->Commit(&adopted).ok());
  EXPECT_EQ(MagicAt(PathOf(pending->id)), "HBK1");
  EXPECT_TRUE(adopted.empty());

  // Another user's file at the name (not trusted): replaced, whole.
  std::string third = first;
  third[200] ^= 1;
  pending = store_->Put(
      third, [&]() -> std::optional<BlockStore::Base> { return *store_->BaseFor(base->id); });
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_EQ(pending->base, base->id);
  std::filesystem::copy_file(PathOf(base->id), PathOf(pending->id));
  ASSERT_EQ(chown(PathOf(pending->id).c_str(), 61001, 61001), 0);
  ASSERT_TRUE(store_->Commit(&adopted).ok());
  EXPECT_EQ(MagicAt(PathOf(pending->id)), "HBK1");
  struct stat st;
  ASSERT_EQ(stat(PathOf(pending->id).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(*store_->Get(pending->id), third);

  // Set aside by a gc: the block is written whole.
  std::string fourth = first;
  fourth[300] ^= 1;
  const BlockId fourth_id = BlockId::Of(fourth);
  const std::string aside =
      dir_.Sub("store/blocks/" + fourth_id.Hex().substr(0, 2) + "/.trash-" + fourth_id.Hex());
  std::filesystem::create_directories(std::filesystem::path(aside).parent_path());
  std::ofstream(aside) << "a crashed gc's";
  auto whole = Put(fourth, base->id);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->base.IsZero());
  EXPECT_EQ(MagicAt(PathOf(fourth_id)), "HBK1");
}

// A crashed gc's block put back where a delta of the same block was written
// meanwhile: the full one stays (a base must stay a full block).
TEST_F(BlockStoreTest, PutBackKeepsTheFullBlock) {
  const std::string first = RandomBytes(1 << 20, 10);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  std::string second = first;
  second[100] ^= 1;
  auto delta = Put(second, base->id);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(MagicAt(PathOf(delta->id)), "HBD1");
  // The full form of `second`, set aside as a crashed gc leaves it.
  auto other_root = dir_.Sub("other");
  std::filesystem::create_directories(other_root);
  UniqueFd other_fd(open(other_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto other = BlockStore::At(other_fd.get());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->Put(second).ok());
  ASSERT_TRUE(other->Commit().ok());
  const std::string name = delta->id.Hex();
  const std::string aside_name = ".trash-" + name;
  std::filesystem::copy_file(other_root + "/blocks/" + name.substr(0, 2) + "/" + name,
                             dir_.Sub("store/blocks/" + name.substr(0, 2) + "/" + aside_name));
  BlockStore::Entry aside;
  aside.kind = BlockStore::Kind::kAside;
  aside.id = delta->id;
  aside.name = aside_name;
  aside.directory = delta->id.hash[0];
  ASSERT_TRUE(store_->PutBack(aside).ok());
  EXPECT_EQ(MagicAt(PathOf(delta->id)), "HBK1");
  EXPECT_EQ(*store_->Get(delta->id), second);
}

// A store without deltas takes no delta it finds as the block: it writes
// the block whole over it, and cannot mark it (a reuse reads it instead).
TEST_F(BlockStoreTest, WithoutDeltasADeltaFoundIsWrittenWhole) {
  const std::string first = RandomBytes(1 << 20, 11);
  auto base = Put(first);
  ASSERT_TRUE(base.ok()) << base.status();
  std::string second = first;
  second[100] ^= 1;
  auto delta = Put(second, base->id);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(delta->base, base->id);
  BlockStoreOptions options;
  options.deltas = false;
  auto plain = BlockStore::At(root_.get(), options);
  ASSERT_TRUE(plain.ok());
  BlockId found_base;
  EXPECT_FALSE(plain->Mark(delta->id, &found_base));
  auto again = plain->Put(second);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->written);
  EXPECT_TRUE(again->base.IsZero());
  ASSERT_TRUE(plain->Commit().ok());
  EXPECT_EQ(MagicAt(PathOf(delta->id)), "HBK1");
}

// A gc puts back a delta set aside where another delta of the same block,
// on another base, was written meanwhile: the name gets the full block
// (those who named the one set aside named only its base). And a create
// whose delta took a name a gc had set aside makes it whole.
TEST_F(BlockStoreTest, TwoDeltasOfABlockAtOneNameBecomeTheFullBlock) {
  const std::string first = RandomBytes(1 << 20, 12);
  std::string other_base = first;
  other_base[500000] ^= 1;
  std::string block = first;
  block[100] ^= 1;
  auto b1 = Put(first);
  auto b2 = Put(other_base);
  ASSERT_TRUE(b1.ok() && b2.ok());
  auto on_b1 = Put(block, b1->id);
  ASSERT_TRUE(on_b1.ok()) << on_b1.status();
  ASSERT_EQ(on_b1->base, b1->id);
  // The same block as a delta on b2, made in another store and planted.
  const std::string other_root = dir_.Sub("other");
  std::filesystem::create_directories(other_root);
  UniqueFd other_fd(open(other_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto other = BlockStore::At(other_fd.get());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->Put(other_base).ok());
  ASSERT_TRUE(other->Commit().ok());
  auto on_b2 = other->Put(
      block, [&]() -> std::optional<BlockStore::Base> { return *other->BaseFor(b2->id); });
  ASSERT_TRUE(on_b2.ok() && on_b2->base == b2->id);
  ASSERT_TRUE(other->Commit().ok());
  const std::string name = on_b1->id.Hex();
  const std::string in_dir = dir_.Sub("store/blocks/" + name.substr(0, 2) + "/");
  ASSERT_EQ(rename((in_dir + name).c_str(), (in_dir + ".trash-" + name).c_str()), 0);
  std::filesystem::copy_file(other_root + "/blocks/" + name.substr(0, 2) + "/" + name,
                             in_dir + name);
  ASSERT_EQ(MagicAt(in_dir + name), "HBD1");
  BlockStore::Entry aside;
  aside.kind = BlockStore::Kind::kAside;
  aside.id = on_b1->id;
  aside.name = ".trash-" + name;
  aside.directory = on_b1->id.hash[0];
  ASSERT_TRUE(store_->PutBack(aside).ok());
  EXPECT_EQ(MagicAt(in_dir + name), "HBK1");
  EXPECT_FALSE(std::filesystem::exists(in_dir + ".trash-" + name));
  EXPECT_EQ(*store_->Get(on_b1->id), block);

  // A pending delta whose name is set aside before Commit: made whole.
  std::string next = first;
  next[700000] ^= 1;
  auto pending = store_->Put(
      next, [&]() -> std::optional<BlockStore::Base> { return *store_->BaseFor(b1->id); });
  ASSERT_TRUE(pending.ok() && pending->base == b1->id);
  const std::string next_name = pending->id.Hex();
  const std::string next_dir = dir_.Sub("store/blocks/" + next_name.substr(0, 2) + "/");
  std::ofstream(next_dir + ".trash-" + next_name) << "set aside by a gc";
  ASSERT_TRUE(store_->Commit().ok());
  EXPECT_EQ(MagicAt(next_dir + next_name), "HBK1");
  EXPECT_EQ(*store_->Get(pending->id), next);
}

// A delta of another sector size (another heapd's, or damaged) is not
// taken as the block: Put writes it whole, Mark refuses it.
TEST_F(BlockStoreTest, ADeltaOfAnotherSectorSizeIsNotWhole) {
  const std::string first = RandomBytes(1 << 20, 13);
  auto base = Put(first);
  ASSERT_TRUE(base.ok());
  std::string second = first;
  second[100] ^= 1;
  auto delta = Put(second, base->id);
  ASSERT_TRUE(delta.ok() && delta->base == base->id);
  {
    std::fstream file(PathOf(delta->id), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(20);
    file.write("\0\x10\0\0", 4);  // 4096-byte sectors
  }
  EXPECT_EQ(store_->Get(delta->id).status().code(), absl::StatusCode::kDataLoss);
  BlockId found_base;
  EXPECT_FALSE(store_->Mark(delta->id, &found_base));
  auto again = Put(second);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->written);
  EXPECT_EQ(*store_->Get(delta->id), second);
}

}  // namespace
}  // namespace heapd
