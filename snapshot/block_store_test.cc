#include "snapshot/block_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
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
  absl::StatusOr<BlockStore::Stored> Put(absl::string_view bytes) {
    absl::StatusOr<BlockStore::Stored> stored = store_->Put(bytes);
    if (stored.ok()) {
      if (absl::Status s = store_->Commit(); !s.ok()) return s;
    }
    return stored;
  }
  std::string PathOf(const BlockId& id) {
    return dir_.Sub("store/blocks/" + id.Hex().substr(0, 2) + "/" + id.Hex());
  }

  TestDir dir_;
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

}  // namespace
}  // namespace heapd
