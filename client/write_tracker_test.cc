// WriteTracker on a real tmpfs file and mapping, without heapd: what a store
// to a protected page waits for, and what the journal receives.
#include "client/write_tracker.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/string_view.h"
#include "client/growth_fault_handler.h"
#include "gtest/gtest.h"
#include "heap/fault_point.h"
#include "heap/test_dir.h"
#include "heap/undo_record.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

constexpr uint64_t kBytes = 16 * kUndoPageBytes;

// Each test with a journal appended through a mapping (revision 2) and one
// appended with write() (heapd 0.4).
class WriteTrackerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    data_.reset(open(dir_.Sub("data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(data_.valid());
    ASSERT_EQ(ftruncate(data_.get(), kBytes), 0);
    void* at = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, data_.get(), 0);
    ASSERT_NE(at, MAP_FAILED);
    base_ = static_cast<char*>(at);
    mapped_.store(kBytes);
    UniqueFd journal(
        open(dir_.Sub("journal").c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    ASSERT_TRUE(journal.valid());
    if (GetParam()) {  // as heapd of revision 2 makes it: its control page first
      const std::string control = EncodeJournalControl();
      ASSERT_EQ(write(journal.get(), control.data(), control.size()),
                static_cast<ssize_t>(control.size()));
    }
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    lifeline_.reset(pair[0]);
    heapd_end_.reset(pair[1]);
    auto tracker =
        WriteTracker::Start(base_, &mapped_, data_.get(), std::move(journal), lifeline_.get(),
                            /*heapd_revision_2=*/GetParam());
    if (!tracker.ok()) GTEST_SKIP() << tracker.status();
    tracker_ = *std::move(tracker);
  }
  void TearDown() override {
    tracker_.reset();
    if (base_ != nullptr) munmap(base_, kBytes);
  }

  // The whole records in the journal, as heapd reads them; each checked
  // with what the heapd of the parameter reads.
  uint64_t JournalRecords() const {
    std::string bytes;
    UniqueFd journal(open(dir_.Sub("journal").c_str(), O_RDONLY | O_CLOEXEC));
    char buffer[1 << 16];
    for (ssize_t n; (n = read(journal.get(), buffer, sizeof(buffer))) > 0;) bytes.append(buffer, n);
    uint64_t records = 0;
    for (uint64_t at = GetParam() ? kJournalControlBytes : 0;;) {
      auto decoded = DecodeUndoRecord(absl::string_view(bytes).substr(at), at);
      EXPECT_TRUE(decoded.ok()) << decoded.status();
      if (!decoded.ok() || !decoded->has_value()) return records;
      EXPECT_EQ((*decoded)->header.magic, GetParam() ? kUndoMagic : kUndoMagicCrc32);
      ++records;
      at += (*decoded)->size;
    }
  }

  TestDir dir_{"/dev/shm"};
  UniqueFd data_;
  UniqueFd lifeline_;
  UniqueFd heapd_end_;
  char* base_ = nullptr;
  std::atomic<uint64_t> mapped_{0};
  std::unique_ptr<WriteTracker> tracker_;
};

TEST_P(WriteTrackerTest, AFirstStoreTakesOnePreImage) {
  base_[100] = 1;
  base_[200] = 2;
  EXPECT_EQ(JournalRecords(), 1u);
  base_[5 * kUndoPageBytes] = 3;  // not the next page: nothing taken ahead
  EXPECT_EQ(JournalRecords(), 2u);
  EXPECT_TRUE(tracker_->error().ok()) << tracker_->error();
}

// Between BeginSync and EndSync heapd reads the pages the sync commits: a
// store of the next generation waits until the sync is over.
TEST_P(WriteTrackerTest, AStoreDuringASyncWaitsForItsEnd) {
  base_[0] = 1;
  ASSERT_EQ(tracker_->BeginSync(), 1u);
  std::atomic<bool> stored{false};
  std::thread writer([&] {
    base_[8] = 2;
    stored.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(stored.load());
  char byte = 0;
  ASSERT_EQ(pread(data_.get(), &byte, 1, 8), 1);
  EXPECT_EQ(byte, 0);
  tracker_->EndSync();
  writer.join();
  EXPECT_TRUE(stored.load());
  EXPECT_EQ(JournalRecords(), 2u);  // one per generation
}

// heapd puts pages back while it holds the journal's OFD lock and the
// guard is closed: a first store waits for it, whichever way the tracker
// takes its pre-images. With the guard open, the OFD lock is not taken.
TEST_P(WriteTrackerTest, AFirstStoreWaitsWhileHeapdPutsPagesBack) {
  UniqueFd heapd_side(open(dir_.Sub("journal").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(heapd_side.valid());
  auto set_closed = [&](uint32_t closed) {
    ASSERT_EQ(pwrite(heapd_side.get(), &closed, sizeof(closed), kJournalClosedAt),
              static_cast<ssize_t>(sizeof(closed)));
  };
  auto lock = [&](short type) {
    struct flock l {};
    l.l_type = type;
    l.l_whence = SEEK_SET;
    l.l_len = 1;
    ASSERT_EQ(fcntl(heapd_side.get(), F_OFD_SETLK, &l), 0) << std::strerror(errno);
  };
  if (GetParam()) ASSERT_NO_FATAL_FAILURE(set_closed(1));
  ASSERT_NO_FATAL_FAILURE(lock(F_WRLCK));
  std::atomic<bool> stored{false};
  std::thread writer([&] {
    base_[kUndoPageBytes] = 5;
    stored.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(stored.load()) << "a store went through while heapd put pages back";
  if (GetParam()) ASSERT_NO_FATAL_FAILURE(set_closed(0));
  ASSERT_NO_FATAL_FAILURE(lock(F_UNLCK));
  writer.join();
  EXPECT_EQ(JournalRecords(), 1u);
  if (!GetParam()) return;
  // The guard open: heapd's OFD lock alone stops nothing (a revision 2 client
  // does not take it).
  ASSERT_NO_FATAL_FAILURE(lock(F_WRLCK));
  base_[4 * kUndoPageBytes] = 6;
  EXPECT_EQ(JournalRecords(), 2u);
  ASSERT_NO_FATAL_FAILURE(lock(F_UNLCK));
  uint32_t busy = 1;
  ASSERT_EQ(pread(heapd_side.get(), &busy, sizeof(busy), kJournalBusyAt),
            static_cast<ssize_t>(sizeof(busy)));
  EXPECT_EQ(busy, 0u);
}

// A sweep through the pages in order takes one pre-image per page, each
// at its own fault: pages the session has not stored into are never taken
// ahead of its stores (that would make it a writer of pages another
// session may be writing: their stores would be handed over to it).
TEST_P(WriteTrackerTest, ASequentialSweepTakesEachPageAtItsOwnStore) {
  constexpr uint64_t kPages = kBytes / kUndoPageBytes;
  for (uint64_t page = 0; page < kPages / 2; ++page) base_[page * kUndoPageBytes + 1] = '!';
  EXPECT_EQ(JournalRecords(), kPages / 2);
  EXPECT_TRUE(tracker_->error().ok()) << tracker_->error();
}

// The tracker takes pre-images inside its guard: at a fault point inside
// it, a reader of the control page (heapd's view) sees `busy` set; once
// the stores went through, clear.
std::atomic<const JournalControl*> control_seen_from_heapd{nullptr};
std::atomic<int> guard_points{0}, guard_points_busy{0};

TEST_P(WriteTrackerTest, PreImagesAreTakenInsideTheGuard) {
  if (!GetParam()) GTEST_SKIP() << "a 0.4 journal has no guard";
  UniqueFd control_fd(open(dir_.Sub("journal").c_str(), O_RDONLY | O_CLOEXEC));
  void* mapped = mmap(nullptr, kJournalControlBytes, PROT_READ, MAP_SHARED, control_fd.get(), 0);
  ASSERT_NE(mapped, MAP_FAILED);
  control_seen_from_heapd.store(static_cast<const JournalControl*>(mapped));
  SetFaultHandler(+[](const char* point) {
    if (std::string(point) != "client.tracker.in_guard") return;
    guard_points.fetch_add(1);
    if (__atomic_load_n(&control_seen_from_heapd.load()->busy, __ATOMIC_SEQ_CST) == 1) {
      guard_points_busy.fetch_add(1);
    }
  });
  base_[3] = 1;
  base_[5 * kUndoPageBytes] = 1;
  SetFaultHandler(nullptr);
  EXPECT_EQ(guard_points.load(), 2);
  EXPECT_EQ(guard_points_busy.load(), 2);
  EXPECT_EQ(__atomic_load_n(&control_seen_from_heapd.load()->busy, __ATOMIC_SEQ_CST), 0u);
  munmap(mapped, kJournalControlBytes);
}

// Two threads store into the same protected pages at once, generation
// after generation: each page's first pre-image of a generation holds the
// page as it was before either store (neither went through first).
TEST_P(WriteTrackerTest, StoresRacingIntoOnePageWaitForItsFirstPreImage) {
  constexpr int kGenerations = 20;
  constexpr uint64_t kPages = kBytes / kUndoPageBytes;
  auto pattern = [](int generation, uint64_t page) {
    return std::string(kUndoPageBytes, static_cast<char>('A' + (generation * 7 + page) % 50));
  };
  for (int g = 0; g < kGenerations; ++g) {
    // The generation's contents, then every page protected again.
    for (uint64_t page = 0; page < kPages; ++page) {
      const std::string bytes = pattern(g, page);
      ASSERT_EQ(pwrite(data_.get(), bytes.data(), bytes.size(), page * kUndoPageBytes),
                static_cast<ssize_t>(bytes.size()));
    }
    tracker_->BeginSync();
    tracker_->EndSync();
    std::atomic<int> ready{0};
    auto store = [&](int thread) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      for (uint64_t page = 0; page < kPages; ++page) {
        base_[page * kUndoPageBytes + 8 * thread] = static_cast<char>(thread + 1);
      }
    };
    std::thread first(store, 0), second(store, 1);
    first.join();
    second.join();
  }
  // The journal: per (generation, page), the first pre-image.
  std::string bytes;
  UniqueFd journal(open(dir_.Sub("journal").c_str(), O_RDONLY | O_CLOEXEC));
  char buffer[1 << 16];
  for (ssize_t n; (n = read(journal.get(), buffer, sizeof(buffer))) > 0;) bytes.append(buffer, n);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (uint64_t at = GetParam() ? kJournalControlBytes : 0;;) {
    auto decoded = DecodeUndoRecord(absl::string_view(bytes).substr(at), at);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (!decoded->has_value()) break;
    const DecodedUndoRecord& r = **decoded;
    // Generation 1 is the first BeginSync's: its pages were never written.
    const int g = static_cast<int>(r.header.generation) - 2;
    if (g >= 0 && seen.emplace(r.header.generation, r.header.page).second) {
      EXPECT_EQ(bytes.substr(r.image_at, kUndoPageBytes),
                pattern(g, r.header.page / kUndoPageBytes))
          << "generation " << g << ", page " << r.header.page / kUndoPageBytes;
    }
    at += r.size;
  }
  EXPECT_EQ(seen.size(), kGenerations * kPages);
  EXPECT_TRUE(tracker_->error().ok()) << tracker_->error();
}

// A forked child would store without pre-images: it has no mapping of the
// heap, and a store there kills it instead of reaching the heap.
TEST_P(WriteTrackerTest, AForkedChildCannotStoreIntoTheHeap) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGSEGV, SIG_DFL);
    base_[0] = 7;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  char byte = 1;
  ASSERT_EQ(pread(data_.get(), &byte, 1, 0), 1);
  EXPECT_EQ(byte, 0);
}

// heapd's end of the session: the mapping goes private, stores stay here.
TEST_P(WriteTrackerTest, TheSessionsEndFencesTheMapping) {
  base_[0] = 1;
  heapd_end_.reset();
  for (int i = 0; i < 1000 && !tracker_->fenced(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(tracker_->fenced());
  base_[0] = 9;
  char byte = 0;
  ASSERT_EQ(pread(data_.get(), &byte, 1, 0), 1);
  EXPECT_EQ(byte, 1);
}

// The fence waits for growth being mapped (the growth mapping lock held):
// otherwise it could miss growth mapped shared, or map privately a range
// its mapper maps privately again (dropping the stores in between).
TEST_P(WriteTrackerTest, TheFenceWaitsForGrowthBeingMapped) {
  const int slot = RegisterHeapForGrowthFaults(
      GrowingHeap{base_, kBytes, data_.get(), /*writable=*/true, /*map_sync=*/false, &mapped_});
  ASSERT_GE(slot, 0);
  tracker_->set_growth_slot(slot);
  {
    GrowthMappingLock mapping(slot);  // a mapper at work
    heapd_end_.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(tracker_->fenced()) << "the fence did not wait for the mapper";
  }
  for (int i = 0; i < 1000 && !tracker_->fenced(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(tracker_->fenced());
  UnregisterHeapForGrowthFaults(slot);
}

INSTANTIATE_TEST_SUITE_P(Journals, WriteTrackerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Mapped" : "Written";
                         });

}  // namespace
}  // namespace heapd
