#include "heap/heap.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "heap/fault_point.h"
#include "heap/test_dir.h"
#include "heap/test_files.h"
#include "testing/in_process.h"

namespace heapd {
namespace {

HeapConfig Config(uint64_t chunks) {
  HeapConfig config;
  config.max_size = chunks * kChunkSize;
  config.owner_uid = 1000;
  config.owner_gid = 1000;
  config.mode = 0640;
  return config;
}

NameEntry Name(const std::string& name, uint64_t offset, uint64_t size) {
  return NameEntry{name, offset, size, "test::Blob", 1000, 1};
}

// A session of the real client on `heap`, in this process; `calls`, if
// given, is set to its calls (Close() on them is its crash).
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

// Allocates through `session`; the object's offset.
absl::StatusOr<uint64_t> Allocate(Heap& session, uint64_t size) {
  absl::StatusOr<void*> object = session.allocate(size);
  if (!object.ok()) return object.status();
  return session.offset_of(*object);
}

TEST(HeapTest, CreateThenOpenKeepsConfigAndRefusesDuplicates) {
  TestDir dir;
  const std::string path = dir.Sub("h");
  {
    auto heap = PersistentHeap::Create(path, Config(16));
    ASSERT_TRUE(heap.ok()) << heap.status();
    EXPECT_EQ((*heap)->epoch(), 0u);
    EXPECT_EQ(PersistentHeap::Create(path, Config(16)).status().code(),
              absl::StatusCode::kAlreadyExists);
  }
  auto heap = PersistentHeap::Open(path);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->config().max_size, 16 * kChunkSize);
  EXPECT_EQ((*heap)->config().mode, 0640u);
  EXPECT_NE((*heap)->config().created_unix_ns, 0);
  EXPECT_EQ(access((path + ".creating." + std::to_string(getpid())).c_str(), F_OK), -1);
}

TEST(HeapTest, BadConfigIsInvalidArgument) {
  TestDir dir;
  EXPECT_EQ(PersistentHeap::Create(dir.Sub("a"), Config(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  HeapConfig odd = Config(4);
  odd.max_size += 4096;
  EXPECT_EQ(PersistentHeap::Create(dir.Sub("b"), odd).status().code(),
            absl::StatusCode::kInvalidArgument);
  HeapConfig mode = Config(4);
  mode.mode = 01777;
  EXPECT_EQ(PersistentHeap::Create(dir.Sub("c"), mode).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PersistentHeap::Open(dir.Sub("missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(HeapTest, SecondOpenIsRefusedWhileLocked) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(4));
  ASSERT_TRUE(heap.ok());
  auto second = PersistentHeap::Open(dir.Sub("h"));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("open in another process"), std::string::npos);
  heap->reset();
  EXPECT_TRUE(PersistentHeap::Open(dir.Sub("h")).ok());
}

TEST(HeapTest, ReopenSeesExactlyTheLastSync) {
  TestDir dir;
  const std::string path = dir.Sub("h");
  uint64_t kept = 0, lost = 0, big = 0;
  {
    auto heap = PersistentHeap::Create(path, Config(64));
    ASSERT_TRUE(heap.ok());
    InProcessSessionCalls* calls = nullptr;
    std::unique_ptr<Heap> session = Attach(heap->get(), 1, &calls);
    ASSERT_NE(session, nullptr);
    kept = *Allocate(*session, 100);
    std::strcpy(session->at<char>(kept), "persisted");
    big = *Allocate(*session, 5 * kChunkSize);
    ASSERT_TRUE((*heap)->Bind(1, Name("root", kept, 100)).ok());
    ASSERT_TRUE(session->sync().ok());
    lost = *Allocate(*session, 100);
    ASSERT_TRUE(Allocate(*session, 3 * kChunkSize).ok());
    ASSERT_TRUE((*heap)->Bind(1, Name("late", lost, 100)).ok());
    // No sync: the session dies, and the heap closes as if the daemon
    // crashed (nothing more persisted).
    calls->Close();
  }
  auto heap = PersistentHeap::Open(path);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->epoch(), 1u);
  absl::StatusOr<NameEntry> root = (*heap)->Lookup("root");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->offset, kept);
  EXPECT_EQ((*heap)->Lookup("late").status().code(), absl::StatusCode::kNotFound);
  HeapStats stats = (*heap)->Stats();
  EXPECT_EQ(stats.directory.live_objects, 2u);  // kept and big
  EXPECT_EQ(stats.directory.large_chunks, 5u);
  std::unique_ptr<Heap> session = Attach(heap->get(), 2);
  ASSERT_NE(session, nullptr);
  EXPECT_STREQ(session->at<char>(kept), "persisted");
  // The unsynced object is free again; the synced big one is live.
  EXPECT_EQ((*heap)->Free(2, {{lost, 0}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*heap)->Free(2, {{big, 0}}).ok());
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
}

TEST(HeapTest, NamesPinObjectsAndValidateInput) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(16));
  ASSERT_TRUE(heap.ok());
  std::unique_ptr<Heap> session = Attach(heap->get(), 1);
  ASSERT_NE(session, nullptr);
  const uint64_t object = *Allocate(*session, 64);
  EXPECT_EQ((*heap)->Bind(1, Name("", object, 64)).code(), absl::StatusCode::kInvalidArgument);
  NameEntry no_type = Name("x", object, 64);
  no_type.type_name = "";
  EXPECT_EQ((*heap)->Bind(1, no_type).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->Bind(1, Name("x", object, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->Bind(1, Name("x", object + 8, 8)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->Bind(1, Name("x", 1ull << 40, 8)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->Bind(2, Name("x", object, 8)).code(),
            absl::StatusCode::kFailedPrecondition);  // not live as far as client 2 can know
  ASSERT_TRUE((*heap)->Bind(1, Name("x", object, 64)).ok());
  EXPECT_EQ((*heap)->Bind(1, Name("x", object, 64)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE((*heap)->Bind(1, Name("alias", object, 64)).ok());
  ASSERT_TRUE(session->sync().ok());
  EXPECT_EQ((*heap)->Free(2, {{object, 0}}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*heap)->Unbind("x").ok());
  EXPECT_EQ((*heap)->Free(2, {{object, 0}}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*heap)->Unbind("alias").ok());
  EXPECT_TRUE((*heap)->Free(2, {{object, 0}}).ok());
  EXPECT_EQ((*heap)->Lookup("bad\nname").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->Unbind("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
}

TEST(HeapTest, FullHeapIsResourceExhaustedAndStillUsable) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(4));
  ASSERT_TRUE(heap.ok());
  std::unique_ptr<Heap> session = Attach(heap->get(), 1);
  ASSERT_NE(session, nullptr);
  ASSERT_TRUE(Allocate(*session, 3 * kChunkSize).ok());
  absl::StatusOr<uint64_t> too_big = Allocate(*session, 2 * kChunkSize);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("is full"), std::string::npos);
  ASSERT_TRUE(Allocate(*session, kChunkSize).ok());
  EXPECT_EQ(Allocate(*session, 8).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*heap)->AllocateLarge(1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->AllocateLarge(1, 5 * kChunkSize).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*heap)->Stats().capacity_bytes, 4 * kChunkSize);
  EXPECT_TRUE(session->sync().ok());
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
}

// A large object that fits only in the free chunks at the end of the heap
// and a growth below the maximum size: the growth counts those chunks.
TEST(HeapTest, GrowthCountsTheFreeChunksAtTheEnd) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(40));
  ASSERT_TRUE(heap.ok());
  ASSERT_TRUE((*heap)->AllocateLarge(1, 16 * kChunkSize).ok());  // capacity 16
  ASSERT_TRUE((*heap)->AllocateLarge(1, 2 * kChunkSize).ok());   // capacity 32, 14 free at the end
  absl::StatusOr<uint64_t> big = (*heap)->AllocateLarge(1, 20 * kChunkSize);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(*big, 18 * kChunkSize);
  EXPECT_EQ((*heap)->Stats().capacity_bytes, 40 * kChunkSize);
  EXPECT_EQ((*heap)->AllocateLarge(1, 3 * kChunkSize).status().code(),  // 2 left
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
}

// With grow_ahead, a lease that leaves fewer than a sixteenth of the chunks
// free has the heap grown in the background, without another lease
// needing it; space is reserved before the directory hands it out.
TEST(HeapTest, GrowsAheadOfDemandInTheBackground) {
  for (const bool grow_ahead : {false, true}) {
    SCOPED_TRACE(grow_ahead ? "grow_ahead" : "no grow_ahead");
    TestDir dir;
    HeapOptions options;
    options.grow_ahead = grow_ahead;
    auto heap = PersistentHeap::Create(dir.Sub("h"), Config(1024), options);
    ASSERT_TRUE(heap.ok()) << heap.status();
    for (int i = 0; i < 40; ++i) ASSERT_TRUE((*heap)->LeaseChunks(1, 3, 1).ok());
    DirectoryStats stats = (*heap)->Stats().directory;
    for (int i = 0; grow_ahead && i < 1000 && stats.free_chunks < stats.capacity_chunks / 16; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
      stats = (*heap)->Stats().directory;
    }
    if (grow_ahead) {
      EXPECT_GT(stats.capacity_chunks, 40u);
      EXPECT_GE(stats.free_chunks, stats.capacity_chunks / 16);
    } else {
      EXPECT_EQ(stats.capacity_chunks, 40u);  // grown only when a lease found no room
      EXPECT_EQ(stats.free_chunks, 0u);
    }
    EXPECT_TRUE((*heap)->CheckInvariants().ok());
  }
}

TEST(HeapTest, ReclaimReturnsADeadClientsWorkAsOfItsLastSync) {
  TestDir dir;
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(32));
  ASSERT_TRUE(heap.ok());
  std::unique_ptr<Heap> dead = Attach(heap->get(), 7);
  ASSERT_NE(dead, nullptr);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Allocate(*dead, 48).ok());
  ASSERT_TRUE(dead->sync().ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Allocate(*dead, 48).ok());
  // Carved from chunks reserved for the session, never told to heapd.
  ASSERT_TRUE(Allocate(*dead, 2 * kChunkSize).ok());
  EXPECT_GE((*heap)->Stats().directory.large_reserve_chunks, 2u);
  ReclaimResult reclaimed = (*heap)->Reclaim(7);
  EXPECT_GE(reclaimed.leases, 1u);
  EXPECT_EQ(reclaimed.large_runs, 0u);
  HeapStats stats = (*heap)->Stats();
  EXPECT_EQ(stats.directory.live_objects, 100u);
  EXPECT_EQ(stats.directory.large_objects, 0u);
  EXPECT_EQ(stats.directory.leased_chunks, 0u);
  EXPECT_EQ(stats.directory.large_reserve_chunks, 0u);
  // Another client can lease the partly used chunk and fill it.
  std::unique_ptr<Heap> other = Attach(heap->get(), 8);
  ASSERT_NE(other, nullptr);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Allocate(*other, 48).ok());
  ASSERT_TRUE(other->detach().ok());
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 200u);
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
}

// A sync's earlier parts (StageReports) commit only with its last part; a
// client that dies before it commits none of them.
TEST(HeapTest, StagedReportsCommitOnlyWithTheLastPart) {
  TestDir dir;
  const std::string path = dir.Sub("h");
  auto heap = PersistentHeap::Create(path, Config(16));
  ASSERT_TRUE(heap.ok());
  PersistentHeap& h = **heap;
  auto grants = h.LeaseChunks(/*client=*/1, /*size_class=*/3, 2);
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_EQ(grants->size(), 2u);
  auto allocated = [](const LeaseGrant& grant) {
    LeaseReport report{grant.chunk, grant.words};
    report.words[0] |= 1;
    return report;
  };
  auto live = [&] { return h.Stats().directory.live_objects; };
  // Checked as a sync's reports are; only the client's own chunks.
  EXPECT_EQ(h.StageReports(2, {allocated((*grants)[0])}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.StageReports(1, {allocated((*grants)[0])}).ok());
  const uint64_t epoch = h.epoch();
  auto synced = h.Sync(1, {allocated((*grants)[1])});
  ASSERT_TRUE(synced.ok()) << synced.status();
  EXPECT_EQ(synced->epoch, epoch + 1);
  EXPECT_EQ(live(), 2u);

  // Staged, then the client dies: nothing of it commits, not even when the
  // same chunks are leased and synced again under its id.
  LeaseReport freed{(*grants)[0].chunk, (*grants)[0].words};
  ASSERT_TRUE(h.StageReports(1, {freed}).ok());
  h.Reclaim(1);
  ASSERT_TRUE(h.Sync(3, {}).ok());
  EXPECT_EQ(live(), 2u);
  auto again = h.LeaseChunks(1, 3, 2);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(h.Sync(1, {}).ok());
  EXPECT_EQ(live(), 2u);
  h.Reclaim(1);
  heap->reset();
  auto reopened = PersistentHeap::Open(path);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->Stats().directory.live_objects, 2u);
}

// Makes the next metadata log write of the heap in g_failing_dir fail (its
// descriptor then refers to /dev/null, read-only).
std::string g_failing_dir;
void FailLogWrite(const char* point) {
  if (std::strcmp(point, "log.before_write") != 0) return;
  BreakDescriptors(
      [](const std::string& target) { return target.rfind(g_failing_dir + "/log.", 0) == 0; });
}

// A sync that fails after applying its reports (its metadata write) has
// written its generation end for the next epoch; when its session then
// dies, that epoch commits first, so the session's stores and its
// allocations stay together (found by a review: the stores went back, the
// allocation committed with the next sync).
TEST(HeapTest, ASyncThatFailedAfterApplyingCommitsWithItsStoresWhenItsSessionDies) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm";
  TestDir dir("/dev/shm");
  const std::string path = dir.Sub("h");
  auto heap = PersistentHeap::Create(path, Config(16));
  ASSERT_TRUE(heap.ok()) << heap.status();
  PersistentHeap& h = **heap;
  ASSERT_TRUE(h.content_rollback()) << h.content_rollback_note();
  auto grants = h.LeaseChunks(1, 3, 1);
  ASSERT_TRUE(grants.ok()) << grants.status();
  auto journal = h.OpenUndoJournal(1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  ASSERT_TRUE(h.Sync(1, {}, 1).ok());
  const uint64_t page = h.capacity_bytes() - kUndoPageBytes;
  const std::string synced(kUndoPageBytes, 'a');
  ASSERT_EQ(pwrite(h.data_fd(), synced.data(), synced.size(), page), kUndoPageBytes);
  ASSERT_TRUE(h.Sync(2, {}).ok());
  // Generation 2 of client 1: a pre-image, the store, an allocation.
  const std::string record = PreImageRecord(page, 2, synced);
  ASSERT_EQ(write(journal->get(), record.data(), record.size()),
            static_cast<ssize_t>(record.size()));
  const std::string stored(kUndoPageBytes, 'b');
  ASSERT_EQ(pwrite(h.data_fd(), stored.data(), stored.size(), page), kUndoPageBytes);
  LeaseReport report{(*grants)[0].chunk, (*grants)[0].words};
  report.words[0] |= 1;
  const uint64_t live_before = h.Stats().directory.live_objects;
  g_failing_dir = path;
  SetFaultHandler(FailLogWrite);
  EXPECT_FALSE(h.Sync(1, {report}, 2).ok());
  SetFaultHandler(nullptr);
  ASSERT_TRUE(h.broken().ok()) << h.broken();
  h.Reclaim(1);
  ASSERT_TRUE(h.Sync(2, {}).ok());
  std::string page_now(kUndoPageBytes, '\0');
  ASSERT_EQ(pread(h.data_fd(), page_now.data(), page_now.size(), page), kUndoPageBytes);
  EXPECT_EQ(page_now[0], 'b');
  EXPECT_EQ(h.Stats().directory.live_objects, live_before + 1);
  // And so it reopens.
  heap->reset();
  auto reopened = PersistentHeap::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->Stats().directory.live_objects, live_before + 1);
  ASSERT_EQ(pread((*reopened)->data_fd(), page_now.data(), page_now.size(), page), kUndoPageBytes);
  EXPECT_EQ(page_now[0], 'b');
}

TEST(HeapTest, ShortDataFileIsDataLoss) {
  TestDir dir;
  const std::string path = dir.Sub("h");
  {
    auto heap = PersistentHeap::Create(path, Config(32));
    std::unique_ptr<Heap> session = Attach(heap->get(), 1);
    ASSERT_NE(session, nullptr);
    ASSERT_TRUE(Allocate(*session, 20 * kChunkSize).ok());
    ASSERT_TRUE(session->detach().ok());
  }
  ASSERT_EQ(truncate((path + "/data").c_str(), 4 * kChunkSize), 0);
  auto heap = PersistentHeap::Open(path);
  EXPECT_EQ(heap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(heap.status().message().find(path + "/data"), std::string::npos);
}

TEST(HeapTest, ManySyncsRollIntoCheckpointsAndReopen) {
  TestDir dir;
  const std::string path = dir.Sub("h");
  std::vector<uint64_t> live;
  {
    auto heap = PersistentHeap::Create(path, Config(256));
    std::unique_ptr<Heap> session = Attach(heap->get(), 1);
    ASSERT_NE(session, nullptr);
    // Each sync writes a 4 KiB bitmap; enough syncs to pass the 8 MiB
    // checkpoint threshold at least once.
    for (int i = 0; i < 3000; ++i) {
      live.push_back(*Allocate(*session, 64));
      ASSERT_TRUE(session->sync().ok());
    }
    EXPECT_LT((*heap)->Stats().metadata_log_bytes, 9u << 20);
    ASSERT_TRUE(session->detach().ok());
  }
  auto heap = PersistentHeap::Open(path);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->epoch(), 3001u);  // and the detach
  EXPECT_EQ((*heap)->Stats().directory.live_objects, 3000u);
}

}  // namespace
}  // namespace heapd

namespace heapd {
namespace {

// On tmpfs a heap grows only while the node keeps its memory reserve; the
// refusal names both numbers and the heap stays usable.
TEST(HeapTest, TmpfsGrowthStopsAtTheMemoryReserve) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm";
  TestDir dir("/dev/shm");
  HeapOptions options;
  options.tmpfs_reserve_bytes = uint64_t{1} << 50;  // more than any node has
  auto heap = PersistentHeap::Create(dir.Sub("h"), Config(64), options);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const absl::Status refused = (*heap)->LeaseChunks(1, 3, 1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("--tmpfs_reserve_bytes"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("available memory"), std::string::npos) << refused;
  EXPECT_EQ((*heap)->capacity_bytes(), 0u);
  EXPECT_TRUE((*heap)->CheckInvariants().ok());
  // A reserve the node can keep lets it grow.
  EXPECT_TRUE(CheckMemoryForTmpfs(kChunkSize, 1 << 20, "h").ok());
}

}  // namespace
}  // namespace heapd
