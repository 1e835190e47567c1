// The growth fault handler maps a heap's growth on first touch, and waits
// while another thread maps that heap (GrowthMappingLock), except on the
// thread that holds the lock; growth is write-protected before a store can
// reach it, and mapped privately once the session is fenced.
#include "client/growth_fault_handler.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "client/write_tracker.h"
#include "gtest/gtest.h"
#include "heap/fault_point.h"
#include "heap/heap_mapping.h"
#include "heap/test_dir.h"
#include "heap/undo_record.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// A heap's data file of 2 MiB, mapped in a 64 MiB reservation.
class GrowthFaultHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd.reset(open(dir.Sub("data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(ftruncate(fd.get(), 2 * kMiB), 0);
    auto mapped_file = HeapMapping::Map(fd.get(), 64 * kMiB, 2 * kMiB, /*writable=*/true);
    ASSERT_TRUE(mapped_file.ok()) << mapped_file.status();
    mapping = *std::move(mapped_file);
  }
  GrowingHeap Heap() {
    return GrowingHeap{mapping->base(),    64 * kMiB, fd.get(), /*writable=*/true,
                       /*map_sync=*/false, &mapped};
  }

  TestDir dir{"/dev/shm"};
  UniqueFd fd;
  std::unique_ptr<HeapMapping> mapping;
  std::atomic<uint64_t> mapped{2 * kMiB};
};

TEST_F(GrowthFaultHandlerTest, AFaultWaitsForAnotherThreadMappingButNotForItsOwn) {
  volatile char* base = mapping->base();
  const int slot = RegisterHeapForGrowthFaults(Heap());
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

// Another writer of the data file gives it a size that is not a whole
// number of chunks: the handler maps whole chunks only, so that later
// growth (mapped at a chunk's offset) still maps.
TEST_F(GrowthFaultHandlerTest, AFileSizeOffChunksMapsWholeChunksOnly) {
  volatile char* base = mapping->base();
  const int slot = RegisterHeapForGrowthFaults(Heap());
  ASSERT_GE(slot, 0);
  const char a = 'a', b = 'b';
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(4 * kMiB + 4097)), 0);
  ASSERT_EQ(pwrite(fd.get(), &a, 1, static_cast<off_t>(3 * kMiB)), 1);
  EXPECT_EQ(base[3 * kMiB], 'a');
  EXPECT_EQ(mapped.load(), 4 * kMiB);
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(6 * kMiB)), 0);
  ASSERT_EQ(pwrite(fd.get(), &b, 1, static_cast<off_t>(5 * kMiB)), 1);
  EXPECT_EQ(base[5 * kMiB], 'b');  // before: mapping at 4 MiB + 4097 failed, a crash
  EXPECT_EQ(mapped.load(), 6 * kMiB);
  UnregisterHeapForGrowthFaults(slot);
}

// Growth mapped after the session's end (heapd gone: the mapping fenced)
// is mapped privately, whoever maps it: stores stay in this process.
TEST_F(GrowthFaultHandlerTest, GrowthMappedAfterAFenceIsPrivate) {
  ASSERT_EQ(ftruncate(fd.get(), 4 * kMiB), 0);
  std::atomic<bool> fenced{true};
  GrowingHeap heap = Heap();
  heap.fenced = &fenced;
  ASSERT_EQ(MapHeapGrowth(heap, /*slot=*/-1, 4 * kMiB), 0);
  EXPECT_EQ(mapped.load(), 4 * kMiB);
  heap.base[3 * kMiB] = 'z';
  char byte = 0;
  ASSERT_EQ(pread(fd.get(), &byte, 1, 3 * kMiB), 1);
  EXPECT_EQ(byte, 0) << "a store after the fence reached the heap";
}

// Set by the test below: the fault point between mapping tracked growth
// and protecting it waits there (up to 300 ms) for another thread's store.
std::atomic<bool> in_window{false};
std::atomic<bool> stored{false};

void WaitInTheWindow(const char* point) {  // async-signal-safe
  if (std::string_view(point) != "client.growth.mapped_before_protected" ||
      in_window.exchange(true)) {
    return;
  }
  timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (!stored.load() &&
           (now.tv_sec - start.tv_sec) * 1000000000 + (now.tv_nsec - start.tv_nsec) < 300000000);
}

// A store by another thread into growth that a fault is mapping, before
// it is write-protected, must not go through without a pre-image: it waits
// until the growth is protected, then takes one.
TEST_F(GrowthFaultHandlerTest, TrackedGrowthIsProtectedBeforeAnyStoreReachesIt) {
  char* base = mapping->base();
  const std::string journal_path = dir.Sub("journal");
  UniqueFd journal(open(journal_path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  ASSERT_TRUE(journal.valid());
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd lifeline(pair[0]), heapd_end(pair[1]);
  auto tracker = WriteTracker::Start(base, &mapped, fd.get(), std::move(journal), lifeline.get(),
                                     /*heapd_revision_2=*/true);
  if (!tracker.ok()) GTEST_SKIP() << tracker.status();
  GrowingHeap heap = Heap();
  heap.uffd = (*tracker)->fd();
  heap.fenced = (*tracker)->fencing();
  heap.unprotected = (*tracker)->unprotected_growth();
  const int slot = RegisterHeapForGrowthFaults(heap);
  ASSERT_GE(slot, 0);

  // Another process grew the heap and wrote there.
  ASSERT_EQ(ftruncate(fd.get(), 4 * kMiB), 0);
  const char old_byte = 'g';
  ASSERT_EQ(pwrite(fd.get(), &old_byte, 1, 3 * kMiB), 1);
  SetFaultHandler(WaitInTheWindow);
  char got = 0;
  std::thread reader([&] { got = static_cast<volatile char*>(base)[3 * kMiB]; });
  for (int i = 0; i < 10000 && !in_window.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!in_window.load()) {
    reader.join();
    SetFaultHandler(nullptr);
    UnregisterHeapForGrowthFaults(slot);
    FAIL() << "the read's fault never reached the point between mapping and protecting";
  }
  static_cast<volatile char*>(base)[3 * kMiB] = 'x';
  stored = true;
  reader.join();
  SetFaultHandler(nullptr);
  UnregisterHeapForGrowthFaults(slot);
  EXPECT_TRUE(got == 'g' || got == 'x') << got;  // the read races with the store
  EXPECT_TRUE((*tracker)->error().ok()) << (*tracker)->error();
  tracker->reset();

  // The store's page went to the journal as it was before the store.
  std::string record(kUndoImageRecordBytes, '\0');
  UniqueFd written(open(journal_path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(pread(written.get(), record.data(), record.size(), 0),
            static_cast<ssize_t>(record.size()))
      << "the store took no pre-image";
  UndoRecordHeader header;
  std::memcpy(&header, record.data(), sizeof(header));
  EXPECT_EQ(header.page, 3 * kMiB);
  EXPECT_EQ(record[kUndoHeaderBytes], 'g');
}

}  // namespace
}  // namespace heapd
