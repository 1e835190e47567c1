// Heaps with a working image (ImageMode::kWorkingImage) on a block file
// system (the test directory, ext4 here): clients map memory; the data
// file changes only through syncs' redo log; a heapd that dies (the heap
// closed without anything more) comes back at the last sync, every byte.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "heap/fault_point.h"
#include "heap/heap.h"
#include "heap/metadata_format.h"
#include "heap/test_dir.h"
#include "heap/test_files.h"
#include "testing/in_process.h"

namespace heapd {
namespace {

HeapConfig WorkingImageConfig(uint64_t chunks) {
  HeapConfig config;
  config.max_size = chunks * kChunkSize;
  config.owner_uid = 1000;
  config.owner_gid = 1000;
  config.mode = 0640;
  config.image = ImageMode::kWorkingImage;
  return config;
}

std::unique_ptr<Heap> Attach(PersistentHeap* heap, ClientId id,
                             InProcessSessionCalls** calls = nullptr) {
  absl::StatusOr<std::unique_ptr<Heap>> session =
      AttachInProcess(heap, id, {}, [calls](std::unique_ptr<InProcessSessionCalls> c) {
        if (calls != nullptr) *calls = c.get();
        return c;
      });
  EXPECT_TRUE(session.ok()) << session.status();
  return session.ok() ? *std::move(session) : nullptr;
}

uint64_t Allocate(Heap& session, uint64_t size) {
  absl::StatusOr<void*> object = session.allocate(size);
  EXPECT_TRUE(object.ok()) << object.status();
  return object.ok() ? session.offset_of(*object) : 0;
}

// `size` bytes at `offset` of the file `path`.
std::string ReadFile(const std::string& path, uint64_t offset, uint64_t size) {
  std::string bytes(size, '\0');
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(pread(fd, bytes.data(), size, static_cast<off_t>(offset)), static_cast<ssize_t>(size));
  close(fd);
  return bytes;
}

std::string ReadFd(int fd, uint64_t offset, uint64_t size) {
  std::string bytes(size, '\0');
  EXPECT_EQ(pread(fd, bytes.data(), size, static_cast<off_t>(offset)), static_cast<ssize_t>(size));
  return bytes;
}

// A new heap with a working image at `path`, and two sessions on it.
struct TwoSessions {
  void Start(const std::string& path) {
    absl::StatusOr<std::unique_ptr<PersistentHeap>> made =
        PersistentHeap::Create(path, WorkingImageConfig(16));
    ASSERT_TRUE(made.ok()) << made.status();
    heap = *std::move(made);
    one = Attach(heap.get(), 1, &calls1);
    two = Attach(heap.get(), 2, &calls2);
    ASSERT_NE(one, nullptr);
    ASSERT_NE(two, nullptr);
  }
  // Destroyed sessions first: they detach from the heap.
  std::unique_ptr<PersistentHeap> heap;
  InProcessSessionCalls* calls1 = nullptr;
  InProcessSessionCalls* calls2 = nullptr;
  std::unique_ptr<Heap> one, two;
};

class WorkingImageTest : public testing::Test {
 protected:
  void SetUp() override {
    struct statfs fs;
    ASSERT_EQ(statfs(dir_.path().c_str(), &fs), 0);
    if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << dir_.path() << " is on tmpfs";
  }
  TestDir dir_;
  const std::string path_ = dir_.Sub("h");
};

TEST_F(WorkingImageTest, ClientsMapMemoryAndContentsRollBack) {
  auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_TRUE((*heap)->content_rollback()) << (*heap)->content_rollback_note();
  const HeapStats stats = (*heap)->Stats();
  EXPECT_EQ(stats.image, ImageMode::kWorkingImage);
  EXPECT_EQ(stats.backing, BackingKind::kFile);  // the data file's
  absl::StatusOr<int> mapped = (*heap)->OpenDataFile(/*writable=*/false);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  struct statfs fs;
  ASSERT_EQ(fstatfs(*mapped, &fs), 0);
  EXPECT_EQ(fs.f_type, TMPFS_MAGIC);  // clients map memory
  close(*mapped);
}

// A heapd that dies after a sync: the heap reopens at the sync, whatever
// the working image held, and whether or not the log was applied.
TEST_F(WorkingImageTest, ReopensAtTheLastSyncEveryByte) {
  uint64_t kept = 0, late = 0, stray_at = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    InProcessSessionCalls* calls = nullptr;
    std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
    ASSERT_NE(session, nullptr);
    kept = Allocate(*session, 4096);
    std::memset(session->at<char>(kept), 's', 4096);
    ASSERT_TRUE((*heap)->Bind(1, {"root", kept, 4096, "blob", 1000, 1}).ok());
    ASSERT_TRUE(session->sync().ok());
    // The sync's pages are in the redo log, not yet in the data file.
    EXPECT_NE(ReadFile(path_ + "/data", kept, 4096), std::string(4096, 's'));
    // Stores after the sync, and a store no client tracked (as a working
    // image that outlived heapd would hold): none reaches the data file.
    std::memset(session->at<char>(kept), 'u', 100);
    late = Allocate(*session, 100);
    std::memset(session->at<char>(late), 'u', 100);
    const std::string stray(4096, 'x');
    stray_at = (*heap)->capacity_bytes() - 4096;
    ASSERT_EQ(pwrite((*heap)->data_fd(), stray.data(), stray.size(), static_cast<off_t>(stray_at)),
              4096);
    calls->Close();
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->epoch(), 1u);
  // Replayed into the data file at open.
  EXPECT_EQ(ReadFile(path_ + "/data", kept, 4096), std::string(4096, 's'));
  EXPECT_EQ(ReadFd((*heap)->data_fd(), kept, 4096), std::string(4096, 's'));
  EXPECT_EQ(ReadFd((*heap)->data_fd(), stray_at, 4096), std::string(4096, '\0'));
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 1u);
  std::unique_ptr<Heap> session = Attach(heap->get(), 2);
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(std::string(session->at<char>(kept), 4096), std::string(4096, 's'));
  (void)late;
}

// docs/consistency.md: a page two sessions write is committed as it is by
// whichever syncs first; the other session's own pages are not.
TEST_F(WorkingImageTest, ASyncCommitsItsPagesAsTheyAre) {
  uint64_t mine = 0, theirs = 0;
  {
    TwoSessions t;
    ASSERT_NO_FATAL_FAILURE(t.Start(path_));
    mine = Allocate(*t.one, 4096);
    theirs = Allocate(*t.two, 4096);
    std::memset(t.one->at<char>(mine), '1', 4096);
    std::memset(t.two->at<char>(theirs), '2', 4096);
    ASSERT_TRUE(t.one->sync().ok());
    ASSERT_TRUE(t.two->sync().ok());
    // Both write one's object; two writes its own too; only one syncs.
    std::memset(t.one->at<char>(mine), 'a', 100);
    std::memset(t.two->at<char>(mine) + 200, 'b', 100);
    std::memset(t.two->at<char>(theirs), 'c', 100);
    ASSERT_TRUE(t.one->sync().ok());
    t.calls1->Close();
    t.calls2->Close();
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const std::string page = ReadFd((*heap)->data_fd(), mine, 4096);
  EXPECT_EQ(page.substr(0, 100), std::string(100, 'a'));
  EXPECT_EQ(page.substr(100, 100), std::string(100, '1'));
  EXPECT_EQ(page.substr(200, 100), std::string(100, 'b'));  // committed as it was
  EXPECT_EQ(ReadFd((*heap)->data_fd(), theirs, 4096), std::string(4096, '2'));
}

// Stores made while a sync logs its pages, after its commit point, by
// another session (its first store to a page since its sync, and more
// stores to a page it wrote before): the log holds each page as it was at
// the commit point (found by a review: they were logged, and a heapd crash
// showed a session's unsynced stores).
Heap* store_during_log = nullptr;
InProcessSessionCalls* dies_during_log = nullptr;
uint64_t first_store_at = 0, later_store_at = 0;
void StoreDuringLog(const char* point) {
  if (std::string(point) != "redo.before_append" || store_during_log == nullptr) return;
  std::memset(store_during_log->at<char>(first_store_at), 'c', 100);
  std::memset(store_during_log->at<char>(later_store_at), 'd', 100);
  store_during_log = nullptr;  // once
  // Its pre-images are still read once its journal is gone. Ended from
  // another thread, as heapd's reapers do.
  if (dies_during_log != nullptr) std::thread([] { dies_during_log->Close(); }).join();
}

class StoresDuringTheLog : public WorkingImageTest, public testing::WithParamInterface<bool> {};
INSTANTIATE_TEST_SUITE_P(Writer, StoresDuringTheLog, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "DiesDuringTheLog" : "Lives";
                         });

TEST_P(StoresDuringTheLog, StoresAfterTheCommitPointAreNotLogged) {
  uint64_t mine = 0, shared = 0;
  {
    TwoSessions t;
    ASSERT_NO_FATAL_FAILURE(t.Start(path_));
    mine = Allocate(*t.one, 4096);
    shared = Allocate(*t.one, 4096);
    std::memset(t.one->at<char>(mine), '1', 4096);
    std::memset(t.one->at<char>(shared), '1', 4096);
    ASSERT_TRUE(t.one->sync().ok());
    ASSERT_TRUE(t.one->sync().ok());  // no longer memory handed out free
    ASSERT_TRUE(t.two->sync().ok());
    std::memset(t.one->at<char>(mine), 'a', 100);
    std::memset(t.one->at<char>(shared), 'a', 100);
    std::memset(t.two->at<char>(shared) + 200, 'b', 100);  // before one's sync
    store_during_log = t.two.get();
    dies_during_log = GetParam() ? t.calls2 : nullptr;
    first_store_at = mine + 200;
    later_store_at = shared + 300;
    SetFaultHandler(StoreDuringLog);
    const absl::Status synced = t.one->sync().status();
    SetFaultHandler(nullptr);
    ASSERT_TRUE(synced.ok()) << synced;
    ASSERT_EQ(store_during_log, nullptr) << "the log was never reached";
    t.calls1->Close();
    if (!GetParam()) t.calls2->Close();
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const std::string first = ReadFd((*heap)->data_fd(), mine, 4096);
  EXPECT_EQ(first.substr(0, 100), std::string(100, 'a'));
  EXPECT_EQ(first.find_first_not_of('1', 100), std::string::npos)
      << "two's store after the commit point is logged: " << first.substr(200, 8);
  const std::string second = ReadFd((*heap)->data_fd(), shared, 4096);
  EXPECT_EQ(second.substr(0, 100), std::string(100, 'a'));
  EXPECT_EQ(second.substr(100, 100), std::string(100, '1'));
  EXPECT_EQ(second.substr(200, 100), std::string(100, 'b'));  // committed as it was
  EXPECT_EQ(second.find_first_not_of('1', 300), std::string::npos)
      << "two's store after the commit point is logged: " << second.substr(300, 8);
}

// Memory a session was handed free, gave back and another session was
// handed free: the first session's sync no longer logs it, so the
// second's stores after its own sync are not committed by it (found by a
// review: fresh memory is logged whole, and was logged by whoever had it
// free last, with another's unsynced stores in it).
TEST_F(WorkingImageTest, FreshMemoryGivenBackIsNotLoggedByItsFormerHolder) {
  std::string synced(4096, 't'), unsynced(4096, 'u');
  uint64_t page = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    PersistentHeap& h = **heap;
    auto journal1 = h.OpenUndoJournal(1);
    auto journal2 = h.OpenUndoJournal(2);
    ASSERT_TRUE(journal1.ok() && journal2.ok());
    auto first = h.LeaseChunks(1, 3, 1);
    ASSERT_TRUE(first.ok()) << first.status();
    page = uint64_t{(*first)[0].chunk} * kChunkSize;
    const std::string mine(4096, 's');
    ASSERT_EQ(pwrite(h.data_fd(), mine.data(), mine.size(), static_cast<off_t>(page)), 4096);
    ASSERT_TRUE(h.ReturnLeases(1, {LeaseReport{(*first)[0].chunk, (*first)[0].words}}).ok());
    auto second = h.LeaseChunks(2, 3, 1);
    ASSERT_TRUE(second.ok()) << second.status();
    ASSERT_EQ((*second)[0].chunk, (*first)[0].chunk) << "the chunk given back is leased again";
    ASSERT_EQ(pwrite(h.data_fd(), synced.data(), synced.size(), static_cast<off_t>(page)), 4096);
    LeaseReport allocated{(*second)[0].chunk, (*second)[0].words};
    allocated.words[0] |= 1;  // an object at the chunk's start
    ASSERT_TRUE(h.Sync(2, {allocated}, 1).ok());
    // Session 2's next store to the page, with its pre-image, not synced.
    const std::string record = PreImageRecord(page, 2, synced);
    ASSERT_EQ(write(journal2->get(), record.data(), record.size()),
              static_cast<ssize_t>(record.size()));
    ASSERT_EQ(pwrite(h.data_fd(), unsynced.data(), unsynced.size(), static_cast<off_t>(page)),
              4096);
    ASSERT_TRUE(h.Sync(1, {}, 1).ok());
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_TRUE(ReadFd((*heap)->data_fd(), page, 4096) == synced)
      << "the page reads '" << ReadFd((*heap)->data_fd(), page, 1) << "...'";
}

// An object allocated in fresh memory just before the sync that closes
// that memory to stores without pre-images is reported only with the next
// sync (a client takes its reports before it protects): that sync still
// logs it (found by a review: its bytes never reached the data file).
TEST_F(WorkingImageTest, AnObjectReportedASyncLateInFreshMemoryIsLogged) {
  const std::string late(4096, 'l');
  uint64_t page = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    PersistentHeap& h = **heap;
    auto journal = h.OpenUndoJournal(1);
    ASSERT_TRUE(journal.ok()) << journal.status();
    auto grants = h.LeaseChunks(1, 3, 1);
    ASSERT_TRUE(grants.ok()) << grants.status();
    page = uint64_t{(*grants)[0].chunk} * kChunkSize;
    ASSERT_TRUE(h.Sync(1, {}, 1).ok());
    // Stored while the chunk is still fresh, reported only after the sync
    // that closes it.
    ASSERT_EQ(pwrite(h.data_fd(), late.data(), late.size(), static_cast<off_t>(page)), 4096);
    ASSERT_TRUE(h.Sync(1, {}, 2).ok());
    LeaseReport allocated{(*grants)[0].chunk, (*grants)[0].words};
    allocated.words[0] |= 1;
    ASSERT_TRUE(h.Sync(1, {allocated}, 3).ok());
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 1u);
  EXPECT_TRUE(ReadFd((*heap)->data_fd(), page, 4096) == late)
      << "the page reads '" << ReadFd((*heap)->data_fd(), page, 1) << "...'";
}

// Chunks reserved for a session at different times, next to each other,
// are one run to its client, which may carve a large object across them:
// the sync logs the object's pages in both (found by multiprocess_test: the
// pages past the first reservation never reached the data file).
TEST_F(WorkingImageTest, ALargeObjectAcrossTwoReservationsIsLoggedWhole) {
  const std::string head(4096, 'h'), tail(4096, 't');
  uint64_t object = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    PersistentHeap& h = **heap;
    auto journal = h.OpenUndoJournal(1);
    ASSERT_TRUE(journal.ok()) << journal.status();
    auto first = h.ReserveLarge(1, 1, 1);
    auto second = h.ReserveLarge(1, 1, 1);
    ASSERT_TRUE(first.ok() && second.ok());
    ASSERT_EQ(second->chunk, first->chunk + 1) << "the reservations are neighbours";
    object = uint64_t{first->chunk} * kChunkSize;
    const uint64_t last_page = object + 2 * kChunkSize - 4096;
    ASSERT_EQ(pwrite(h.data_fd(), head.data(), 4096, static_cast<off_t>(object)), 4096);
    ASSERT_EQ(pwrite(h.data_fd(), tail.data(), 4096, static_cast<off_t>(last_page)), 4096);
    ReserveReport reserve;
    reserve.placed.push_back(LargePlacement{first->chunk, 2});
    ASSERT_TRUE(h.Sync(1, {}, 1, reserve).ok());
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 1u);
  EXPECT_TRUE(ReadFd((*heap)->data_fd(), object, 4096) == head);
  EXPECT_TRUE(ReadFd((*heap)->data_fd(), object + 2 * kChunkSize - 4096, 4096) == tail)
      << "the last page reads '" << ReadFd((*heap)->data_fd(), object + 2 * kChunkSize - 4096, 1)
      << "...'";
}

// Through the real client: large objects of many sizes (carved from
// reserves that grow, next to each other or not, beside small objects'
// leases), some freed, synced now and then; heapd then dies. Every object
// live at the last sync reads as it was written, first, middle and last
// page.
TEST_F(WorkingImageTest, EveryLargeObjectOfTheLastSyncReadsWholeAfterADeath) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE(seed);
    const std::string path = dir_.Sub("random-" + std::to_string(seed));
    std::mt19937_64 random(seed);
    struct Object {
      uint64_t size;
      uint64_t stamp;
    };
    std::map<uint64_t, Object> live, synced;  // by offset
    auto stamp_at = [](Heap& heap, uint64_t offset, const Object& object) {
      for (uint64_t at : {uint64_t{0}, object.size / 2 & ~uint64_t{7}, object.size - 8}) {
        std::memcpy(heap.at<char>(offset + at), &object.stamp, 8);
      }
    };
    {
      auto heap = PersistentHeap::Create(path, WorkingImageConfig(96));
      ASSERT_TRUE(heap.ok()) << heap.status();
      InProcessSessionCalls* calls = nullptr;
      std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
      ASSERT_NE(session, nullptr);
      for (int step = 0; step < 120; ++step) {
        const uint64_t action = random() % 10;
        if (action < 5) {
          const Object object{(uint64_t{1} << 20) + random() % (uint64_t{5} << 20), random() | 1};
          absl::StatusOr<void*> made = session->allocate(object.size);
          if (!made.ok()) {
            ASSERT_EQ(made.status().code(), absl::StatusCode::kResourceExhausted) << made.status();
            continue;
          }
          const uint64_t offset = session->offset_of(*made);
          stamp_at(*session, offset, object);
          live[offset] = object;
        } else if (action < 7) {
          for (int i = 0; i < 50; ++i) {
            absl::StatusOr<void*> small = session->allocate(8 + random() % 4000);
            ASSERT_TRUE(small.ok()) << small.status();
            std::memset(*small, 's', 8);
          }
        } else if (action < 9 && !live.empty()) {
          auto victim = std::next(live.begin(), static_cast<long>(random() % live.size()));
          ASSERT_TRUE(session->deallocate(session->at<char>(victim->first)).ok());
          live.erase(victim);
        } else {
          ASSERT_TRUE(session->sync().ok());
          synced = live;
        }
      }
      ASSERT_TRUE(session->sync().ok());
      synced = live;
      // Work after the last sync, which goes.
      absl::StatusOr<void*> late = session->allocate(uint64_t{3} << 20);
      if (late.ok()) std::memset(*late, 'l', 8);
      calls->Close();
    }
    auto heap = PersistentHeap::Open(path);
    ASSERT_TRUE(heap.ok()) << heap.status();
    std::unique_ptr<Heap> session = Attach(heap->get(), 2);
    ASSERT_NE(session, nullptr);
    int wrong = 0;
    for (const auto& [offset, object] : synced) {
      for (uint64_t at : {uint64_t{0}, object.size / 2 & ~uint64_t{7}, object.size - 8}) {
        uint64_t read = 0;
        std::memcpy(&read, session->at<char>(offset + at), 8);
        if (read != object.stamp && ++wrong <= 5) {
          ADD_FAILURE() << "object at " << offset << " of " << object.size << " bytes, byte " << at
                        << ": " << read << " instead of " << object.stamp;
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "of " << synced.size() << " objects";
    EXPECT_GT(synced.size(), 10u);
  }
}

// Objects moving on to larger classes leave chunks empty, which the
// client's next lease of another class takes back as that class
// (ChunkDirectory::Reclass): what the last sync committed there reads
// whole after heapd dies, and a session that dies leaves them consistent.
TEST_F(WorkingImageTest, ChunksTakenBackAsAnotherClassKeepWhatTheLastSyncCommitted) {
  std::vector<std::pair<uint64_t, uint64_t>> kept;  // offset, size
  uint32_t chunks_used = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(64));
    ASSERT_TRUE(heap.ok()) << heap.status();
    InProcessSessionCalls* calls = nullptr;
    std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
    ASSERT_NE(session, nullptr);
    for (uint64_t size = 64; size <= (uint64_t{64} << 10); size *= 2) {
      std::vector<void*> objects;
      for (uint64_t i = 0; i < 2 * kChunkSize / size + 1; ++i) {
        absl::StatusOr<void*> object = session->allocate(size);
        ASSERT_TRUE(object.ok()) << object.status();
        std::memset(*object, static_cast<int>('a' + kept.size() % 26), size);
        objects.push_back(*object);
      }
      // One object of each class stays; the rest go.
      kept.emplace_back(session->offset_of(objects.back()), size);
      objects.pop_back();
      for (void* object : objects) ASSERT_TRUE(session->deallocate(object).ok());
    }
    ASSERT_TRUE(session->sync().ok());
    chunks_used = static_cast<uint32_t>((*heap)->Stats().directory.capacity_chunks -
                                        (*heap)->Stats().directory.free_chunks);
    // Without the chunks taken back, every class would hold three.
    EXPECT_LT(chunks_used, 3u * 11u);
    // More work that goes with heapd's death.
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(session->allocate(100000).ok());
    calls->Close();
    EXPECT_TRUE((*heap)->CheckInvariants().ok()) << (*heap)->CheckInvariants();
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_TRUE((*heap)->CheckInvariants().ok()) << (*heap)->CheckInvariants();
  EXPECT_EQ((*heap)->Stats().directory.live_objects, kept.size());
  std::unique_ptr<Heap> session = Attach(heap->get(), 2);
  ASSERT_NE(session, nullptr);
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto [offset, size] = kept[i];
    EXPECT_EQ(std::string(session->at<char>(offset), size),
              std::string(size, static_cast<char>('a' + i % 26)))
        << "object of " << size << " bytes at " << offset;
  }
}

// A sync with no content generation from a session that tracks its
// stores commits none of them: refused on a working image, where the log
// must carry what the sync commits; nothing changes.
TEST_F(WorkingImageTest, ASyncWithoutAGenerationIsRefused) {
  auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
  ASSERT_TRUE(heap.ok()) << heap.status();
  auto journal = (*heap)->OpenUndoJournal(1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  auto grants = (*heap)->LeaseChunks(1, 3, 1);
  ASSERT_TRUE(grants.ok()) << grants.status();
  LeaseReport allocated{(*grants)[0].chunk, (*grants)[0].words};
  allocated.words[0] |= 1;
  const absl::Status refused = (*heap)->Sync(1, {allocated}, 0).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ((*heap)->epoch(), 0u);
  EXPECT_TRUE((*heap)->broken().ok());
  EXPECT_TRUE((*heap)->Sync(1, {allocated}, 1).ok());
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 1u);
  // heapd's own syncs (no session) log nothing and need no generation.
  EXPECT_TRUE((*heap)->Sync(0, {}).ok());
}

bool EndsWith(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// Makes the redo logs' descriptors refer to /dev/null, read-only, when a
// sync is about to append: their writes fail.
void FailRedoWrites(const char* point) {
  if (std::strcmp(point, "redo.before_append") != 0) return;
  BreakDescriptors([](const std::string& target) {
    return EndsWith(target, "/redo") || EndsWith(target, "/redo.b");
  });
}

// A sync whose pages cannot be logged fails, and the heap refuses every
// later sync, saying why; reopened (a restart), it is at its last sync,
// every byte.
TEST_F(WorkingImageTest, ALogThatFailsBreaksTheHeapUntilItReopens) {
  uint64_t object = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    InProcessSessionCalls* calls = nullptr;
    std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
    ASSERT_NE(session, nullptr);
    object = Allocate(*session, 4096);
    std::memset(session->at<char>(object), 's', 4096);
    ASSERT_TRUE(session->sync().ok());
    std::memset(session->at<char>(object), 'u', 4096);
    SetFaultHandler(FailRedoWrites);
    const absl::Status failed = session->sync().status();
    SetFaultHandler(nullptr);
    EXPECT_FALSE(failed.ok());
    EXPECT_NE((*heap)->broken().message().find("redo log"), absl::string_view::npos)
        << (*heap)->broken();
    EXPECT_FALSE((*heap)->Sync(1, {}, 3).ok());
    calls->Close();
  }
  auto heap = PersistentHeap::Open(path_);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->epoch(), 1u);
  EXPECT_TRUE(ReadFd((*heap)->data_fd(), object, 4096) == std::string(4096, 's'));
  EXPECT_TRUE((*heap)->broken().ok());
}

// No room on the file system for the larger log a sync needs: the sync
// fails naming the bytes, and the heap reopens at its last sync.
TEST_F(WorkingImageTest, NoRoomForTheLogFailsTheSyncAndLosesNothing) {
  TestDir small;
  if (mount("tmpfs", small.path().c_str(), "tmpfs", 0, "size=24m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs: " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{small.path()};
  const std::string path = small.Sub("h");
  HeapOptions options;
  options.redo_log_bytes = 64 << 10;
  uint64_t kept = 0;
  {
    auto heap = PersistentHeap::Create(path, WorkingImageConfig(16), options);
    ASSERT_TRUE(heap.ok()) << heap.status();
    InProcessSessionCalls* calls = nullptr;
    std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
    ASSERT_NE(session, nullptr);
    kept = Allocate(*session, 4096);
    std::memset(session->at<char>(kept), 's', 4096);
    ASSERT_TRUE(session->sync().ok());
    // 8 MiB to log: the file system holds the 16 MiB data file, not a log
    // that large besides.
    const uint64_t big = Allocate(*session, 4 * kChunkSize);
    std::memset(session->at<char>(big), 'b', 4 * kChunkSize);
    std::memset(session->at<char>(kept), 'u', 4096);
    const absl::Status failed = session->sync().status();
    EXPECT_FALSE(failed.ok());
    EXPECT_NE((*heap)->broken().message().find("needs a redo log of"), absl::string_view::npos)
        << (*heap)->broken();
    calls->Close();
  }
  auto heap = PersistentHeap::Open(path, options);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->epoch(), 1u);
  EXPECT_TRUE(ReadFd((*heap)->data_fd(), kept, 4096) == std::string(4096, 's'));
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 1u);
}

// A sync larger than the log: the log is applied and a larger one takes
// its place.
TEST_F(WorkingImageTest, ASyncLargerThanTheLogGrowsIt) {
  HeapOptions options;
  options.redo_log_bytes = 64 << 10;
  const uint64_t size = 3 * kChunkSize;
  uint64_t big = 0;
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16), options);
    ASSERT_TRUE(heap.ok()) << heap.status();
    InProcessSessionCalls* calls = nullptr;
    std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
    ASSERT_NE(session, nullptr);
    big = Allocate(*session, size);
    for (uint64_t i = 0; i < size; i += 4096)
      session->at<char>(big)[i] = static_cast<char>(i >> 12);
    ASSERT_TRUE(session->sync().ok());
    for (uint64_t i = 0; i < size; i += 4096) session->at<char>(big)[i] = 'z';
    calls->Close();
  }
  // One of the two logs grew to the sync.
  struct stat st, other;
  ASSERT_EQ(stat((path_ + "/redo").c_str(), &st), 0);
  ASSERT_EQ(stat((path_ + "/redo.b").c_str(), &other), 0);
  EXPECT_GE(static_cast<uint64_t>(std::max(st.st_size, other.st_size)), size);
  EXPECT_NE(access((path_ + "/redo.larger").c_str(), F_OK), 0);
  auto heap = PersistentHeap::Open(path_, options);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const std::string data = ReadFd((*heap)->data_fd(), big, size);
  for (uint64_t i = 0; i < size; i += 4096) {
    ASSERT_EQ(data[i], static_cast<char>(i >> 12)) << "page " << (i >> 12);
  }
}

// Opening loads the working image: refused, saying why, where it would
// leave less than the reserve of the node's memory.
TEST_F(WorkingImageTest, OpenLeavesTheMemoryReserve) {
  {
    auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    ASSERT_TRUE((*heap)->LeaseChunks(1, 3, 1).ok());
  }
  HeapOptions options;
  options.tmpfs_reserve_bytes = uint64_t{1} << 50;  // more than any node has
  auto refused = PersistentHeap::Open(path_, options);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("--tmpfs_reserve_bytes"), std::string::npos)
      << refused.status();
  EXPECT_TRUE(PersistentHeap::Open(path_).ok());
}

// A snapshot reads the committed epoch: stores since the last sync do not
// reach it.
TEST_F(WorkingImageTest, SnapshotsReadTheCommittedEpoch) {
  auto heap = PersistentHeap::Create(path_, WorkingImageConfig(16));
  ASSERT_TRUE(heap.ok()) << heap.status();
  InProcessSessionCalls* calls = nullptr;
  std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
  ASSERT_NE(session, nullptr);
  const uint64_t object = Allocate(*session, 4096);
  std::memset(session->at<char>(object), 's', 4096);
  ASSERT_TRUE(session->sync().ok());
  std::memset(session->at<char>(object), 'u', 4096);
  ASSERT_TRUE((*heap)
                  ->WithCommittedState([&](const CommittedState& state) {
                    EXPECT_EQ(state.epoch, 1u);
                    EXPECT_EQ(ReadFd(state.data_fd, object, 4096), std::string(4096, 's'));
                    absl::StatusOr<int> fd = (*heap)->OpenCommittedData();
                    EXPECT_TRUE(fd.ok()) << fd.status();
                    if (fd.ok()) {
                      EXPECT_EQ(ReadFd(*fd, object, 4096), std::string(4096, 's'));
                      close(*fd);
                    }
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(session->detach().ok());
}

// The on-disk format: a heap with a working image writes checkpoints of
// format version 2 (a heapd that reads only version 1 refuses it); a
// direct heap stays at version 1, and reopens direct.
TEST_F(WorkingImageTest, CheckpointsSayWhichImage) {
  auto version_of = [](const std::string& dir) {
    const std::string header = ReadFile(dir + "/checkpoint", 0, kFrameHeaderSize);
    uint16_t version = 0;
    std::memcpy(&version, header.data() + 4, 2);
    return version;
  };
  HeapConfig direct = WorkingImageConfig(16);
  direct.image = ImageMode::kDirect;
  ASSERT_TRUE(PersistentHeap::Create(dir_.Sub("direct"), direct).ok());
  ASSERT_TRUE(PersistentHeap::Create(path_, WorkingImageConfig(16)).ok());
  EXPECT_EQ(version_of(dir_.Sub("direct")), kFormatVersion);
  EXPECT_EQ(version_of(path_), kWorkingImageFormatVersion);
  auto reopened = PersistentHeap::Open(dir_.Sub("direct"));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->Stats().image, ImageMode::kDirect);
  EXPECT_FALSE((*reopened)->content_rollback());
}

}  // namespace
}  // namespace heapd
