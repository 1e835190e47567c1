#include "snapshot/version_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "client/in_process.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"
#include "snapshot/snapshot_format.h"

namespace heapd {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class VersionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HeapConfig config;
    config.max_size = uint64_t{128} << 20;
    auto heap = PersistentHeap::Create(dir_.Sub("h"), config);
    ASSERT_TRUE(heap.ok()) << heap.status();
    heap_ = *std::move(heap);
    auto store = VersionStore::Open(dir_.Sub("store"), 256 << 10);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Runs `work` in a session of the real client, then detaches.
  void InSession(const std::function<void(Heap&)>& work) {
    auto session = AttachInProcess(heap_.get(), next_session_++);
    ASSERT_TRUE(session.ok()) << session.status();
    work(**session);
    ASSERT_TRUE((*session)->detach().ok());
  }

  absl::StatusOr<VersionStats> Create(const std::string& name) {
    absl::StatusOr<VersionStats> stats;
    const absl::Status copied = heap_->WithCommittedState([&](const CommittedState& state) {
      stats = store_->Create("h", name, v1::HeapInfo(), state);
      return stats.status();
    });
    if (!copied.ok()) return copied;
    return stats;
  }

  // Checks version `name` out and opens it: the heap it holds.
  std::unique_ptr<PersistentHeap> CheckOut(const std::string& name) {
    const std::string target = dir_.Sub("out-" + name);
    const absl::Status status = store_->Checkout("h", name, target, kMaxHeapBytes);
    EXPECT_TRUE(status.ok()) << status;
    std::map<std::string, std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(target)) {
      const std::string file = entry.path().filename().string();
      if (IsMetadataFileName(file)) files[file] = ReadFile(entry.path().string());
    }
    const std::string data = target + "/data";
    auto verified = VerifySnapshotFiles(target, ReadFile(target + "/manifest.json"), files,
                                        std::filesystem::file_size(data));
    EXPECT_TRUE(verified.ok()) << verified.status();
    if (!verified.ok()) return nullptr;
    auto opened = PersistentHeap::OpenSnapshot(name, UniqueFd(open(data.c_str(), O_RDONLY)),
                                               verified->metadata);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? *std::move(opened) : nullptr;
  }

  static std::string Object(const PersistentHeap& heap, const std::string& name) {
    absl::StatusOr<NameEntry> entry = heap.Lookup(name);
    EXPECT_TRUE(entry.ok()) << entry.status();
    if (!entry.ok()) return "";
    std::string bytes(entry->size, '\0');
    EXPECT_EQ(pread(heap.data_fd(), bytes.data(), bytes.size(), static_cast<off_t>(entry->offset)),
              static_cast<ssize_t>(bytes.size()));
    return bytes;
  }

  TestDir dir_;
  std::unique_ptr<PersistentHeap> heap_;
  std::unique_ptr<VersionStore> store_;
  ClientId next_session_ = 1;
};

TEST_F(VersionStoreTest, VersionsCheckOutExactlyAndShareTheirUnchangedBlocks) {
  InSession([](Heap& heap) {
    for (int i = 0; i < 20; ++i) {
      const uint64_t size = i % 5 == 4 ? (3 << 20) : 1000 + 300 * i;
      auto* object = static_cast<char*>(*heap.allocate(size));
      std::memset(object, 'a' + i, size);
      ASSERT_TRUE(heap.Bind("obj-" + std::to_string(i), object, size, "bytes").ok());
    }
    // A large object freed before the sync: its chunks are free, never stored.
    ASSERT_TRUE(heap.deallocate(*heap.allocate(20 << 20), 20 << 20).ok());
  });
  auto first = Create("v1");
  ASSERT_TRUE(first.ok()) << first.status();
  // Blocks of the same bytes (the large objects are one byte repeated) are
  // stored once even within a version.
  EXPECT_GT(first->blocks_written, 0u);
  EXPECT_LT(first->blocks_written, first->blocks);
  // Chunks free at the epoch and blocks of zeros are holes: far fewer
  // blocks than the data file has.
  EXPECT_LT(first->blocks * (256 << 10), heap_->capacity_bytes() / 2) << first->blocks;
  EXPECT_EQ(Create("v1").status().code(), absl::StatusCode::kAlreadyExists);

  InSession([](Heap& heap) {
    auto object = heap.Find("obj-3", "bytes", 1);
    ASSERT_TRUE(object.ok());
    std::memcpy(*object, "changed", 7);
  });
  auto second = Create("v2");
  ASSERT_TRUE(second.ok()) << second.status();
  // One data block changed, and the metadata.
  EXPECT_LE(second->blocks_written, 4u) << second->blocks_written << " of " << second->blocks;

  std::unique_ptr<PersistentHeap> v1 = CheckOut("v1");
  std::unique_ptr<PersistentHeap> v2 = CheckOut("v2");
  ASSERT_NE(v1, nullptr);
  ASSERT_NE(v2, nullptr);
  EXPECT_EQ(v1->ListNames("").size(), 20u);
  for (int i = 0; i < 20; ++i) {
    const std::string name = "obj-" + std::to_string(i);
    EXPECT_EQ(Object(*v2, name), Object(*heap_, name)) << name;
    if (i != 3) EXPECT_EQ(Object(*v1, name), Object(*heap_, name)) << name;
  }
  EXPECT_EQ(Object(*v1, "obj-3"), std::string(1900, 'a' + 3));
  EXPECT_EQ(Object(*v2, "obj-3").substr(0, 7), "changed");
}

// Nothing read from the store is trusted: a recipe that lies, a block that
// changed.
TEST_F(VersionStoreTest, ADamagedRecipeOrBlockIsDataLoss) {
  InSession([](Heap& heap) {
    auto* object = static_cast<char*>(*heap.allocate(5000));
    std::memset(object, 'x', 5000);
    ASSERT_TRUE(heap.Bind("x", object, 5000, "bytes").ok());
  });
  ASSERT_TRUE(Create("v1").ok());
  auto recipe = store_->Read("h", "v1");
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  const std::string recipe_path = dir_.Sub("store/versions/h/v1.recipe");
  const std::string good = ReadFile(recipe_path);

  v1::StoreRecipe lying = *recipe;
  lying.add_data_blocks("");  // more blocks than the data has
  std::ofstream(recipe_path, std::ios::binary | std::ios::trunc) << lying.SerializeAsString();
  EXPECT_EQ(store_->Read("h", "v1").status().code(), absl::StatusCode::kDataLoss);
  lying = *recipe;
  for (std::string& id : *lying.mutable_data_blocks()) {
    if (!id.empty()) id = "../../../etc/passwd";
  }
  std::ofstream(recipe_path, std::ios::binary | std::ios::trunc) << lying.SerializeAsString();
  EXPECT_EQ(store_->Read("h", "v1").status().code(), absl::StatusCode::kDataLoss);
  std::ofstream(recipe_path, std::ios::binary | std::ios::trunc) << "not a recipe";
  EXPECT_EQ(store_->Read("h", "v1").status().code(), absl::StatusCode::kDataLoss);
  std::ofstream(recipe_path, std::ios::binary | std::ios::trunc) << good;
  ASSERT_TRUE(store_->Read("h", "v1").ok());

  // A data block changed under its name.
  std::string data_block;
  for (const std::string& id : recipe->data_blocks()) {
    if (!id.empty()) data_block = id;
  }
  ASSERT_FALSE(data_block.empty());
  const std::string block_path =
      dir_.Sub("store/blocks/" + data_block.substr(0, 2) + "/" + data_block);
  {
    std::fstream file(block_path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(30);
    file.put('!');
  }
  EXPECT_EQ(store_->Checkout("h", "v1", dir_.Sub("small"), 1 << 20).code(),
            absl::StatusCode::kResourceExhausted);
  const absl::Status damaged = store_->Checkout("h", "v1", dir_.Sub("out"), kMaxHeapBytes);
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(damaged.message().find(data_block), std::string::npos) << damaged;
  // Nothing is left under the target's name, nor half-built beside it.
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("out")));
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".partial-"), std::string::npos);
  }
  // A block the store lost is data loss too.
  std::filesystem::remove(block_path);
  EXPECT_EQ(store_->Checkout("h", "v1", dir_.Sub("out"), kMaxHeapBytes).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->Read("h", "../h").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace heapd
