// WritePart's reuse of an earlier part's blocks for chunks heapd knows
// unchanged (ChunkChanges), run in process on a store in a test directory.
#include "snapshot/version_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "allocator/size_class.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"
#include "snapshot/store_recipe.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr uint32_t kBlock = 1 << 20;

class VersionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_.reset(open(dir_.Sub("data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(data_.valid());
    ASSERT_EQ(ftruncate(data_.get(), 2 * kChunkSize), 0);
    Fill(0, 'a');
    ASSERT_EQ(mkdir(dir_.Sub("store").c_str(), 0700), 0);
    root_.reset(open(dir_.Sub("store").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_.valid());
  }

  void Fill(uint64_t chunk, char byte) {
    const std::string bytes(kChunkSize, byte);
    ASSERT_EQ(pwrite(data_.get(), bytes.data(), bytes.size(), chunk * kChunkSize),
              static_cast<ssize_t>(bytes.size()));
  }

  // Part `name` of the data file with chunks `used`, at `mark` with chunk
  // stamps `changed_at`.
  absl::StatusOr<v1::StoreUsage> Write(const std::string& name, std::vector<bool> used,
                                       uint64_t mark, std::vector<uint64_t> changed_at) {
    PartSource source;
    source.part = {name, "node", "h"};
    source.manifest_json = "{}";
    source.data_fd = data_.get();
    source.data_bytes = 2 * kChunkSize;
    source.used_chunks = std::move(used);
    for (const auto& [file, bytes] : metadata_) source.metadata_files[file] = bytes;
    source.block_bytes = kBlock;
    source.threads = 1;
    source.changes = ChunkChanges{"heap-life", mark, std::move(changed_at), 0};
    return WritePart(root_.get(), source);
  }

  // The data block ids of part `name`, packed.
  std::string DataIds(const std::string& name) {
    const PartRef part{name, "node", "h"};
    absl::StatusOr<std::string> bytes = ReadRecipeFile(root_.get(), part, false);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<RecipeFile> file = DecodeRecipeFile(bytes.ok() ? *bytes : "", name);
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? file->recipe.data_blocks() : "";
  }

  TestDir dir_{"/tmp"};
  UniqueFd data_, root_;
  const std::map<std::string, std::string> metadata_ = {{"checkpoint", "metadata"}};
};

TEST_F(VersionStoreTest, UnchangedChunksAreReusedUnread) {
  auto v1 = Write("v1", {true, true}, 1, {0, 0});
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->reused_blocks(), 0u);
  EXPECT_EQ(v1->hashed_bytes(), 2 * kChunkSize);
  // Chunk 1 changed after v1's mark: read; chunk 0 taken from v1.
  Fill(1, 'b');
  auto v2 = Write("v2", {true, true}, 2, {0, 2});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->reused_blocks(), 2u);
  EXPECT_EQ(v2->hashed_bytes(), kChunkSize);
  EXPECT_EQ(DataIds("v2").substr(0, 2 * kBlockIdBytes), DataIds("v1").substr(0, 2 * kBlockIdBytes));
  EXPECT_NE(DataIds("v2"), DataIds("v1"));
  // Nothing changed since v2's mark: all taken from v2, nothing read.
  auto v3 = Write("v3", {true, true}, 3, {0, 0});
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->reused_blocks(), 4u);
  EXPECT_EQ(v3->hashed_bytes(), 0u);
}

// A chunk free at the earlier part's mark (a hole there) but used now was
// perhaps written before that mark and committed after it, with no stamp
// since (a grant that ended before the mark): it is read, not taken as
// zeros.
TEST_F(VersionStoreTest, AChunkFreeAtTheEarlierMarkIsRead) {
  Fill(1, 'c');  // written while free (a grant's stores, not yet committed)
  auto v1 = Write("v1", {true, false}, 1, {0, 0});
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(DataIds("v1").substr(2 * kBlockIdBytes), std::string(2 * kBlockIdBytes, '\0'));
  auto v2 = Write("v2", {true, true}, 2, {0, 1});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->reused_blocks(), 2u);
  EXPECT_EQ(v2->hashed_bytes(), kChunkSize);
  EXPECT_NE(DataIds("v2").substr(2 * kBlockIdBytes), std::string(2 * kBlockIdBytes, '\0'));
  // A hole of a chunk used at the earlier mark is zeros, and stays a hole.
  const std::string zeros(kChunkSize, '\0');
  ASSERT_EQ(pwrite(data_.get(), zeros.data(), zeros.size(), kChunkSize),
            static_cast<ssize_t>(zeros.size()));
  auto v3 = Write("v3", {true, true}, 3, {0, 3});
  ASSERT_TRUE(v3.ok()) << v3.status();
  auto v4 = Write("v4", {true, true}, 4, {0, 3});
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->hashed_bytes(), 0u);
  EXPECT_EQ(DataIds("v4").substr(2 * kBlockIdBytes), std::string(2 * kBlockIdBytes, '\0'));
}

// Only the caller's own recipes are candidates: one another user put
// there, claiming the heap's changes, is not read.
TEST_F(VersionStoreTest, AnotherUsersRecipeIsNotReused) {
  auto v1 = Write("v1", {true, true}, 1, {0, 0});
  ASSERT_TRUE(v1.ok()) << v1.status();
  ASSERT_EQ(chown(dir_.Sub("store/versions/v1/node/h.recipe").c_str(), 61001, 61001), 0);
  auto v2 = Write("v2", {true, true}, 2, {0, 0});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->reused_blocks(), 0u);
  EXPECT_EQ(v2->hashed_bytes(), 2 * kChunkSize);
}

// A block that changed in a few pages since the earlier part is stored as
// a delta against that part's block; the recipe names the base (an HRC2
// file), gc keeps the base once the earlier part is removed, and the part
// reads back exactly.
TEST_F(VersionStoreTest, AChangedBlockIsADeltaWhoseBaseOutlivesItsPart) {
  const std::string other(kBlock, 'o');  // block 1 unlike block 0
  ASSERT_EQ(pwrite(data_.get(), other.data(), other.size(), kBlock),
            static_cast<ssize_t>(other.size()));
  auto v1 = Write("v1", {true, true}, 1, {0, 0});
  ASSERT_TRUE(v1.ok()) << v1.status();
  const std::string changed = "a few changed bytes";
  ASSERT_EQ(pwrite(data_.get(), changed.data(), changed.size(), 12345),
            static_cast<ssize_t>(changed.size()));
  auto v2 = Write("v2", {true, true}, 2, {2, 0});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->delta_blocks(), 1u);
  EXPECT_EQ(v2->blocks_written(), 1u);

  const PartRef part{"v2", "node", "h"};
  absl::StatusOr<std::string> bytes = ReadRecipeFile(root_.get(), part, false);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->substr(0, 4), "HRC2");
  absl::StatusOr<RecipeFile> recipe = DecodeRecipeFile(*bytes, "v2");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  ASSERT_EQ(recipe->recipe.delta_bases().size(), kBlockIdBytes);
  EXPECT_EQ(recipe->recipe.delta_bases(), DataIds("v1").substr(0, kBlockIdBytes));

  ASSERT_TRUE(RemovePart(root_.get(), {"v1", "node", "h"}).ok());
  GcOptions gc;
  gc.grace = absl::ZeroDuration();
  auto swept = CollectGarbage(root_.get(), gc);
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_EQ(swept->blocks_removed(), 0u);  // v1's blocks: v2's too, or its delta's base

  // v2 read into a new file, block by block, is the data file.
  const std::string restored = dir_.Sub("restored");
  UniqueFd out(open(restored.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(out.valid());
  std::vector<WantedBlock> wanted;
  const std::string& ids = recipe->recipe.data_blocks();
  ASSERT_EQ(ftruncate(out.get(), 2 * kChunkSize), 0);
  for (size_t i = 0; i * kBlockIdBytes < ids.size(); ++i) {
    const BlockId id = BlockId::FromRaw(PackedId(ids, i).data());
    if (!id.IsZero()) wanted.push_back({id, static_cast<int64_t>(i * kBlock), kBlock});
  }
  MessageList messages;
  absl::Status fetched = FetchBlocks(root_.get(), wanted, out.get(), "v2", messages);
  ASSERT_TRUE(fetched.ok()) << fetched;
  std::string expected(2 * kChunkSize, '\0'), got(2 * kChunkSize, '\0');
  ASSERT_EQ(pread(data_.get(), expected.data(), expected.size(), 0),
            static_cast<ssize_t>(expected.size()));
  ASSERT_EQ(pread(out.get(), got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == expected);

  // With deltas off, the next change is stored whole.
  ASSERT_EQ(pwrite(data_.get(), "x", 1, 3 * kBlock + 7), 1);
  PartSource source;
  source.part = {"v3", "node", "h"};
  source.manifest_json = "{}";
  source.data_fd = data_.get();
  source.data_bytes = 2 * kChunkSize;
  source.used_chunks = {true, true};
  source.block_bytes = kBlock;
  source.deltas = false;
  source.changes = ChunkChanges{"heap-life", 3, {2, 3}, 0};
  auto v3 = WritePart(root_.get(), source);
  ASSERT_TRUE(v3.ok()) << v3.status();
  // The block changed now, and v2's delta of block 0 written whole over it.
  EXPECT_EQ(v3->delta_blocks(), 0u);
  EXPECT_EQ(v3->blocks_written(), 2u);
  absl::StatusOr<std::string> v3_recipe = ReadRecipeFile(root_.get(), {"v3", "node", "h"}, false);
  ASSERT_TRUE(v3_recipe.ok()) << v3_recipe.status();
  EXPECT_EQ(v3_recipe->substr(0, 4), "HRC1");
}

}  // namespace
}  // namespace heapd
