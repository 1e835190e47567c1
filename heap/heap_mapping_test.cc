#include "heap/heap_mapping.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "heap/data_file.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(HeapMappingTest, GrowthKeepsTheBaseAndSharesTheFile) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 2 * kMiB);
  ASSERT_TRUE(file.ok());
  auto a = HeapMapping::Map((*file)->fd(), 64 * kMiB, 2 * kMiB, true);
  auto b = HeapMapping::Map((*file)->fd(), 64 * kMiB, 2 * kMiB, true);
  ASSERT_TRUE(a.ok() && b.ok());
  char* base = (*a)->base();
  std::strcpy(base + 100, "hello");
  EXPECT_STREQ((*b)->base() + 100, "hello");  // two views, one file
  ASSERT_TRUE((*file)->Grow(6 * kMiB).ok());
  ASSERT_TRUE((*a)->Extend(6 * kMiB).ok());
  EXPECT_EQ((*a)->base(), base);
  std::strcpy(base + 5 * kMiB, "grown");
  ASSERT_TRUE((*b)->Extend(6 * kMiB).ok());
  EXPECT_STREQ((*b)->base() + 5 * kMiB, "grown");
  ASSERT_TRUE((*a)->Flush().ok());
  char check[6] = {};
  ASSERT_EQ(pread((*file)->fd(), check, 5, 5 * kMiB), 5);
  EXPECT_STREQ(check, "grown");
  EXPECT_EQ((*a)->Extend(65 * kMiB).code(), absl::StatusCode::kInvalidArgument);
}

TEST(HeapMappingTest, ReadOnlyMappingFaultsOnWrite) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 2 * kMiB);
  ASSERT_TRUE(file.ok());
  const int ro = open(dir.Sub("data").c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  auto mapping = HeapMapping::Map(ro, 4 * kMiB, 2 * kMiB, false);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EXPECT_FALSE((*mapping)->map_sync());
  EXPECT_EQ((*mapping)->base()[10], 0);
  EXPECT_DEATH({ (*mapping)->base()[10] = 1; }, "");
  char byte = 1;
  ASSERT_EQ(pread((*file)->fd(), &byte, 1, 10), 1);
  EXPECT_EQ(byte, 0);
  close(ro);
}

TEST(HeapMappingTest, PrefixIsPrivateMemoryJustBeforeTheBase) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 2 * kMiB);
  ASSERT_TRUE(file.ok());
  const uint64_t prefix = 4096;
  auto a = HeapMapping::Map((*file)->fd(), 4 * kMiB, 2 * kMiB, true, prefix);
  auto b = HeapMapping::Map((*file)->fd(), 4 * kMiB, 2 * kMiB, true, prefix);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->base()[-1] = 'a';
  (*b)->base()[-1] = 'b';
  (*a)->base()[0] = 'x';
  EXPECT_EQ((*a)->base()[-1], 'a');  // private per mapping
  EXPECT_EQ((*b)->base()[0], 'x');   // the file is shared
  ASSERT_TRUE((*a)->Extend(2 * kMiB).ok());
}

TEST(HeapMappingTest, RejectsASizeBeyondTheReservation) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 2 * kMiB);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(HeapMapping::Map((*file)->fd(), kMiB, 2 * kMiB, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace heapd
