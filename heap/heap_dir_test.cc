#include "heap/heap_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

TEST(HeapDirTest, MetadataFileNames) {
  EXPECT_EQ(LogFileName(7), "log.7");
  EXPECT_EQ(LogGeneration("log.7"), 7u);
  EXPECT_EQ(LogGeneration("log.18446744073709551615"), UINT64_MAX);
  for (const char* not_a_log : {"log.", "log.+7", "log.-1", "log. 7", "log.7x", "log7", "data",
                                "log.184467440737095516150", "log.99999999999999999999"}) {
    EXPECT_FALSE(LogGeneration(not_a_log).has_value()) << not_a_log;
    EXPECT_FALSE(IsMetadataFileName(not_a_log)) << not_a_log;
  }
  EXPECT_TRUE(IsMetadataFileName(kCheckpointFileName));
  EXPECT_TRUE(IsMetadataFileName("log.0"));
  EXPECT_FALSE(IsMetadataFileName(kDataFileName));
  EXPECT_FALSE(IsMetadataFileName("checkpoint.tmp"));
}

TEST(HeapDirTest, HiddenNamesAreNeverHeapNamesAndNeverRepeat) {
  const std::string a = HiddenHeapDirName(HiddenPurpose::kCreating, "graph");
  const std::string b = HiddenHeapDirName(HiddenPurpose::kCreating, "graph");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(".creating.graph.", 0), 0u) << a;
  EXPECT_TRUE(IsHiddenHeapDirName(a));
  EXPECT_EQ(HiddenHeapDirName(HiddenPurpose::kRemoving, "g").rfind(".removing.g.", 0), 0u);
  EXPECT_FALSE(IsHiddenHeapDirName("graph"));
}

TEST(HeapDirTest, ABuiltDirectoryAppearsOnlyWhenCommittedAndNeverReplacesOne) {
  TestDir parent;
  {
    absl::StatusOr<std::unique_ptr<HeapDirBuilder>> building =
        HeapDirBuilder::Start(parent.path(), "h", HiddenPurpose::kCreating);
    ASSERT_TRUE(building.ok()) << building.status();
    struct stat st;
    ASSERT_EQ(stat((*building)->PathOf(kLockFileName).c_str(), &st), 0) << "no lock file";
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    ASSERT_EQ(stat((*building)->path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    EXPECT_TRUE(
        IsHiddenHeapDirName(std::filesystem::path((*building)->path()).filename().string()));
    std::ofstream((*building)->PathOf(kDataFileName)) << "bytes";
  }
  EXPECT_TRUE(std::filesystem::is_empty(parent.path())) << "an uncommitted build was left";

  absl::StatusOr<std::unique_ptr<HeapDirBuilder>> building =
      HeapDirBuilder::Start(parent.path(), "h", HiddenPurpose::kCreating);
  ASSERT_TRUE(building.ok()) << building.status();
  std::ofstream((*building)->PathOf(kDataFileName)) << "first";
  ASSERT_TRUE((*building)->Commit("h").ok());
  building->reset();
  EXPECT_TRUE(std::filesystem::exists(parent.Sub("h/data"))) << "the committed directory went";

  absl::StatusOr<std::unique_ptr<HeapDirBuilder>> second =
      HeapDirBuilder::Start(parent.path(), "h", HiddenPurpose::kRestoring);
  ASSERT_TRUE(second.ok()) << second.status();
  std::ofstream((*second)->PathOf(kDataFileName)) << "second";
  const absl::Status replaced = (*second)->Commit("h");
  EXPECT_EQ(replaced.code(), absl::StatusCode::kAlreadyExists) << replaced;
  second->reset();
  std::ifstream kept(parent.Sub("h/data"));
  std::string contents;
  kept >> contents;
  EXPECT_EQ(contents, "first") << "a commit replaced an existing heap";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(parent.path()), {}), 1)
      << "the refused build was left";
}

TEST(HeapDirTest, AParentThatIsASymlinkIsRefused) {
  TestDir parent;
  std::filesystem::create_directory(parent.Sub("real"));
  std::filesystem::create_directory_symlink(parent.Sub("real"), parent.Sub("link"));
  EXPECT_FALSE(HeapDirBuilder::Start(parent.Sub("link"), "h", HiddenPurpose::kCreating).ok());
  EXPECT_TRUE(std::filesystem::is_empty(parent.Sub("real")));
}

}  // namespace
}  // namespace heapd
