#include "heap/heap_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

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

// A mapping that fails must not leave a hole in the reservation: another
// thread's mmap could land there and be unmapped or overwritten with heap
// bytes later.
TEST(HeapMappingTest, AFailedMapLeavesTheRangeReserved) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 4 * kMiB);
  ASSERT_TRUE(file.ok());
  if (FileTakesMapSync((*file)->fd())) GTEST_SKIP() << "the test directory is on fs-dax";
  auto mapping = HeapMapping::Map((*file)->fd(), 8 * kMiB, 0, true);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  char* at = (*mapping)->base() + 2 * kMiB;
  // Refused by the file system's mmap hook on ext4 and XFS (after the range
  // was unmapped), or before that on tmpfs.
  EXPECT_NE(MapFileAt(at, 2 * kMiB, true, /*map_sync=*/true, (*file)->fd(), 0), 0);
  unsigned char pages[2 * kMiB / 4096];
  EXPECT_EQ(mincore(at, 2 * kMiB, pages), 0) << "a hole at " << static_cast<void*>(at);
}

// Growing mappings while another thread maps and uses memory of its own:
// that memory is never replaced by heap bytes (Linux 6.12 and later leave a
// hole where a MAP_FIXED mmap failed in the file system's hook, and a
// second attempt over it would take whatever landed there meanwhile).
TEST(HeapMappingTest, OtherThreadsMemoryNeverLandsInAReservation) {
  TestDir dir;
  auto file = DataFile::Create(dir.Sub("data"), 16 * kMiB);
  ASSERT_TRUE(file.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> clobbered{0};
  std::thread other([&] {
    constexpr size_t kBytes = 8 * kMiB;  // fits no hole but one 16 MiB wide
    while (!stop.load()) {
      void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) continue;
      volatile char* bytes = static_cast<char*>(p);
      bytes[0] = 'o';
      for (int i = 0; i < 100; ++i) std::this_thread::yield();
      if (bytes[0] != 'o') clobbered.fetch_add(1);
      munmap(p, kBytes);
    }
  });
  for (int i = 0; i < 3000; ++i) {
    auto mapping = HeapMapping::Map((*file)->fd(), 64 * kMiB, 16 * kMiB, true);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
  }
  stop = true;
  other.join();
  EXPECT_EQ(clobbered.load(), 0);
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
