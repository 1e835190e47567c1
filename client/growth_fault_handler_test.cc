// The growth fault handler maps a heap's growth on first touch, and waits
// while another thread maps that heap (GrowthMappingLock), except on the
// thread that holds the lock.
#include "client/growth_fault_handler.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "heap/heap_mapping.h"
#include "heap/test_dir.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(GrowthFaultHandlerTest, AFaultWaitsForAnotherThreadMappingButNotForItsOwn) {
  TestDir dir("/dev/shm");
  UniqueFd fd(open(dir.Sub("data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), 2 * kMiB), 0);
  auto mapping = HeapMapping::Map(fd.get(), 64 * kMiB, 2 * kMiB, /*writable=*/true);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  volatile char* base = (*mapping)->base();
  std::atomic<uint64_t> mapped{2 * kMiB};
  const int slot =
      RegisterHeapForGrowthFaults((*mapping)->base(), 64 * kMiB, fd.get(), true, false, &mapped);
  ASSERT_GE(slot, 0);
  // Another process grew the heap and wrote there.
  auto grow_and_write = [&](uint64_t size, uint64_t at, char byte) {
    ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
    ASSERT_EQ(pwrite(fd.get(), &byte, 1, static_cast<off_t>(at)), 1);
  };
  ASSERT_NO_FATAL_FAILURE(grow_and_write(4 * kMiB, 3 * kMiB, 'g'));

  auto lock = std::make_unique<GrowthMappingLock>(slot);
  std::atomic<bool> read{false};
  char got = 0;
  std::thread reader([&] {
    got = base[3 * kMiB];
    read = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(read.load()) << "the fault mapped while another thread held the lock";
  lock.reset();
  reader.join();
  EXPECT_EQ(got, 'g');
  EXPECT_EQ(mapped.load(), 4 * kMiB);

  // On the thread holding it, a fault maps at once (no deadlock).
  ASSERT_NO_FATAL_FAILURE(grow_and_write(6 * kMiB, 5 * kMiB, 'h'));
  {
    GrowthMappingLock own(slot);
    EXPECT_EQ(base[5 * kMiB], 'h');
  }
  EXPECT_EQ(mapped.load(), 6 * kMiB);

  // A forked child gets no growth mapped (its stores would go untracked),
  // even while a thread of the parent holds the lock: it faults.
  ASSERT_NO_FATAL_FAILURE(grow_and_write(8 * kMiB, 7 * kMiB, 'i'));
  {
    GrowthMappingLock held(slot);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      _exit(base[7 * kMiB] == 'i' ? 0 : 2);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    // Killed by the fault (or, under ASan, ended by its report): never
    // the byte read.
    EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child read the growth";
  }
  UnregisterHeapForGrowthFaults(slot);
}

}  // namespace
}  // namespace heapd
