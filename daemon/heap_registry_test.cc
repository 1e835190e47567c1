#include "daemon/heap_registry.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

HeapConfig Config() {
  HeapConfig config;
  config.max_size = 64 << 20;
  return config;
}

TEST(HeapRegistryTest, HeapNamesAreValidated) {
  EXPECT_TRUE(ValidateHeapName("graph-2026_v1.0").ok());
  for (const char* bad : {"", ".hidden", "a/b", "a b", "..", "é"}) {
    EXPECT_EQ(ValidateHeapName(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(ValidateHeapName(std::string(65, 'a')).ok());
}

TEST(HeapRegistryTest, CreateGetListRemoveAndReopen) {
  TestDir dir;
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_TRUE((*registry)->Create("a", Config()).ok());
  ASSERT_TRUE((*registry)->Create("b", Config()).ok());
  EXPECT_EQ((*registry)->Create("a", Config()).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*registry)->Create("../x", Config()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*registry)->Get("c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*registry)->List().size(), 2u);
  ASSERT_TRUE((*registry)->Remove("b").ok());
  EXPECT_EQ((*registry)->Remove("b").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("heaps/b")));
  ASSERT_TRUE((*registry)->SyncAll().ok());
  registry->reset();

  auto reopened = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(reopened.ok());
  ASSERT_EQ((*reopened)->List().size(), 1u);
  EXPECT_EQ((*reopened)->List()[0]->name, "a");
}

TEST(HeapRegistryTest, ABrokenHeapIsReportedAndLeftAlone) {
  TestDir dir;
  {
    auto registry = HeapRegistry::Open(dir.path());
    ASSERT_TRUE(registry.ok());
    ASSERT_TRUE((*registry)->Create("good", Config()).ok());
    ASSERT_TRUE((*registry)->Create("bad", Config()).ok());
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir.Sub("heaps/bad"))) {
    if (entry.path().filename().string().rfind("checkpoint", 0) == 0) {
      std::ofstream(entry.path(), std::ios::trunc) << "garbage";
    }
  }
  auto registry = HeapRegistry::Open(dir.path());
  ASSERT_TRUE(registry.ok());
  EXPECT_TRUE((*registry)->Get("good").ok());
  EXPECT_EQ((*registry)->Broken().count("bad"), 1u);
  EXPECT_FALSE((*registry)->Get("bad").ok());
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("heaps/bad")));
}

}  // namespace
}  // namespace heapd
