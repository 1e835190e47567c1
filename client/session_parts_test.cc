// The session parts a client Heap composes, against a scripted heapd (a
// SessionCalls whose answers each test writes): the large-object reserve,
// remote frees and multi-part syncs. The whole Heap against a real heapd
// is tests/'s.
#include <sys/mman.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "allocator/size_class.h"
#include "client/large_objects.h"
#include "client/mapped_heap.h"
#include "client/remote_frees.h"
#include "client/sync_parts.h"
#include "client/thread_caches.h"
#include "gtest/gtest.h"

namespace heapd {
namespace {

// A heapd whose answers the test scripts; it records every request.
class ScriptedCalls final : public SessionCalls {
 public:
  std::function<absl::Status(const v1::AllocateLargeRequest&, v1::AllocateLargeResponse*)>
      allocate_large;
  std::function<absl::Status(const v1::FreeRequest&)> free;
  std::function<absl::Status(const v1::SyncRequest&)> sync = [](const v1::SyncRequest&) {
    return absl::OkStatus();
  };
  std::vector<v1::AllocateLargeRequest> allocations;
  std::vector<v1::FreeRequest> frees;
  std::vector<v1::SyncRequest> syncs;

  absl::Status LeaseChunks(const v1::LeaseChunksRequest&, v1::LeaseChunksResponse*) override {
    return absl::UnimplementedError("LeaseChunks");
  }
  absl::Status AllocateLarge(const v1::AllocateLargeRequest& request,
                             v1::AllocateLargeResponse* response) override {
    allocations.push_back(request);
    return allocate_large(request, response);
  }
  absl::Status Free(const v1::FreeRequest& request) override {
    frees.push_back(request);
    return free(request);
  }
  absl::Status Sync(const v1::SyncRequest& request, v1::SyncResponse*) override {
    syncs.push_back(request);
    return sync(request);
  }
  absl::Status Detach(const v1::DetachRequest&) override { return absl::OkStatus(); }
  absl::Status Bind(const v1::BindRequest&) override { return absl::OkStatus(); }
  absl::StatusOr<NameEntry> Unbind(const v1::UnbindRequest&) override {
    return absl::UnimplementedError("Unbind");
  }
  absl::StatusOr<NameEntry> Lookup(const std::string&) override {
    return absl::UnimplementedError("Lookup");
  }
  int lifeline() override { return -1; }
  void Close() override {}
};

constexpr uint64_t kMaxChunks = 512;  // a 1 GiB heap
constexpr uint64_t kMaxSize = kMaxChunks * kChunkSize;

// LargeObjects over a real mapping of a memfd, with heapd scripted to hand
// out chunks from the bottom of the heap up (chunk 0 holds the header).
class LargeObjectsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_fd_ = memfd_create("large_objects_test", MFD_CLOEXEC);
    ASSERT_GE(data_fd_, 0);
    ASSERT_EQ(ftruncate(data_fd_, kMaxSize), 0);
    auto mapped = MappedHeap::Map("h", data_fd_, kMaxSize, kChunkSize, true, 4096);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    mapped_ = *std::move(mapped);
    calls_.allocate_large = [this](const v1::AllocateLargeRequest& request,
                                   v1::AllocateLargeResponse* response) {
      // As much as asked, else as much as there is room for down to
      // min_size (a reserve), else "full".
      const uint64_t room = free_below_ - next_chunk_;
      uint64_t chunks = (request.size() + kChunkSize - 1) / kChunkSize;
      if (chunks > room && request.reserve()) chunks = room;
      if (chunks == 0 || chunks > room || chunks * kChunkSize < request.min_size()) {
        return absl::ResourceExhaustedError("heap full");
      }
      response->set_offset(next_chunk_ * kChunkSize);
      response->set_size(chunks * kChunkSize);
      next_chunk_ += chunks;
      response->set_capacity_bytes(next_chunk_ * kChunkSize);
      return absl::OkStatus();
    };
    calls_.free = [](const v1::FreeRequest&) { return absl::OkStatus(); };
    large_ = std::make_unique<LargeObjects>(LargeObjects::Session{
        &calls_, 7, "h", kMaxSize, mapped_.get(), nullptr, &frees_, &sync_mu_});
  }
  void TearDown() override {
    large_.reset();
    mapped_.reset();
    close(data_fd_);
  }

  uint64_t next_chunk_ = 1;
  uint64_t free_below_ = kMaxChunks;  // heapd says "full" past this chunk
  int data_fd_ = -1;
  ScriptedCalls calls_;
  RemoteFrees frees_{&calls_, 7, 4};
  absl::Mutex sync_mu_;
  std::unique_ptr<MappedHeap> mapped_;
  std::unique_ptr<LargeObjects> large_;
};

TEST_F(LargeObjectsTest, ObjectsAreCarvedFromReservesThatDoubleWithoutACallEach) {
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<uint64_t> offset = large_->Allocate(kMaxSmallSize + 1);  // one chunk
    ASSERT_TRUE(offset.ok()) << offset.status();
    offsets.push_back(*offset);
  }
  // Four reserves for ten objects: what the first needs (1 chunk), then
  // twice the last: 2, 4 and 8.
  ASSERT_EQ(calls_.allocations.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(calls_.allocations[i].reserve());
    EXPECT_EQ(calls_.allocations[i].size(), (uint64_t{1} << i) * kChunkSize);
    EXPECT_EQ(calls_.allocations[i].min_size(), kChunkSize);
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    EXPECT_EQ(offsets[i] % kChunkSize, 0u);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(offsets[i], offsets[j]);
    EXPECT_TRUE(large_->Untold(static_cast<uint32_t>(offsets[i] >> kChunkShift)));
  }
  // The sync carries all ten, and what was not carved goes back.
  const LargeObjects::ForSync taken = large_->TakeForSync(/*release_reserve=*/true);
  EXPECT_EQ(taken.placed.size(), 10u);
  uint64_t released = 0;
  for (const LargePlacement& run : taken.released) released += run.chunks;
  EXPECT_EQ(released, 5u);
  large_->SyncEnded(/*committed=*/true);
  EXPECT_FALSE(large_->Untold(static_cast<uint32_t>(offsets[0] >> kChunkShift)));
  // Batches start again from what the object needs.
  ASSERT_TRUE(large_->Allocate(kChunkSize).ok());
  EXPECT_EQ(calls_.allocations.back().size(), kChunkSize);
}

TEST_F(LargeObjectsTest, ObjectsAboveTheCarvedLimitAreOneCallEach) {
  absl::StatusOr<uint64_t> offset = large_->Allocate((kMaxCarvedChunks + 1) * kChunkSize);
  ASSERT_TRUE(offset.ok()) << offset.status();
  ASSERT_EQ(calls_.allocations.size(), 1u);
  EXPECT_FALSE(calls_.allocations[0].reserve());
  EXPECT_FALSE(large_->Holds(static_cast<uint32_t>(*offset >> kChunkShift)));
}

TEST_F(LargeObjectsTest, FreesOfUntoldObjectsAreJudgedHere) {
  absl::StatusOr<uint64_t> offset = large_->Allocate(2 * kChunkSize);
  ASSERT_TRUE(offset.ok()) << offset.status();
  // A wrong size: refused, the object stays.
  absl::StatusOr<bool> wrong = large_->FreeUntold(*offset, 3 * kChunkSize);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "not of")) << wrong.status();
  // Inside it: not an object's start.
  EXPECT_EQ(large_->FreeUntold(*offset + kChunkSize, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<bool> freed = large_->FreeUntold(*offset, 2 * kChunkSize);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_TRUE(*freed);
  absl::StatusOr<bool> again = large_->FreeUntold(*offset, 0);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(again.status().message(), "double free")) << again.status();
  // A chunk the reserve does not hold is heapd's to judge.
  absl::StatusOr<bool> elsewhere = large_->FreeUntold(300 * kChunkSize, 0);
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_FALSE(*elsewhere);
  // Nothing freed was ever told.
  EXPECT_TRUE(large_->TakeForSync(false).placed.empty());
}

TEST_F(LargeObjectsTest, AFullHeapGetsTheUnusedReserveBackAndTheCallIsRetried) {
  ASSERT_TRUE(large_->Allocate(kChunkSize).ok());  // reserves chunk 1, carves it
  ASSERT_TRUE(large_->Allocate(kChunkSize).ok());  // reserves chunks 2-3, carves 2
  free_below_ = next_chunk_;                       // heapd is full from here
  calls_.sync = [this](const v1::SyncRequest& request) {
    // heapd takes the runs back: there is room again.
    for (const v1::LargePlacement& run : request.released()) free_below_ += run.chunks();
    return absl::OkStatus();
  };
  absl::StatusOr<uint64_t> big = large_->Allocate((kMaxCarvedChunks + 1) * kChunkSize);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  ASSERT_EQ(calls_.syncs.size(), 1u);
  EXPECT_TRUE(calls_.syncs[0].more());
  ASSERT_EQ(calls_.syncs[0].released_size(), 1);
  EXPECT_EQ(calls_.syncs[0].released(0).chunks(), 1u);
  // Tried twice: before and after the reserve went back.
  EXPECT_EQ(calls_.allocations.size(), 4u);
  free_below_ = kMaxChunks;
  EXPECT_TRUE(large_->Allocate((kMaxCarvedChunks + 1) * kChunkSize).ok());
}

// heapd takes back a run at the top of what it handed out: room again.
void TakeBackTopRuns(const v1::SyncRequest& request, uint64_t* next_chunk) {
  for (const v1::LargePlacement& run : request.released()) {
    const uint64_t chunk = run.offset() / kChunkSize;
    if (chunk + run.chunks() == *next_chunk) *next_chunk = chunk;
  }
}

TEST_F(LargeObjectsTest, AReserveGivenBackMakesTheRoomTheRetriedCallTakes) {
  ASSERT_TRUE(large_->Allocate(kChunkSize).ok());  // reserves chunk 1, carves it
  ASSERT_TRUE(large_->Allocate(kChunkSize).ok());  // reserves chunks 2-3, carves 2
  free_below_ = next_chunk_ + 1;                   // room for one chunk more
  calls_.sync = [this](const v1::SyncRequest& request) {
    TakeBackTopRuns(request, &next_chunk_);
    return absl::OkStatus();
  };
  // 2 chunks: not in the reserve's 1 unused, nor in heapd's 1; after the
  // unused one went back, heapd has 2.
  absl::StatusOr<uint64_t> object = large_->Allocate(2 * kChunkSize);
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_EQ(*object, 3 * kChunkSize);
  ASSERT_EQ(calls_.syncs.size(), 1u);
  EXPECT_EQ(calls_.syncs[0].released(0).chunks(), 1u);
  EXPECT_EQ(calls_.allocations.size(), 4u);  // the two reserves, then twice
}

TEST_F(LargeObjectsTest, PendingFreesSentMakeTheRoomTheRetriedCallTakes) {
  ASSERT_TRUE(frees_.Free(12345 * 8, 64).ok());  // another process's object: batched
  ASSERT_TRUE(frees_.pending());
  free_below_ = next_chunk_;  // heapd is full until those frees arrive
  calls_.free = [this](const v1::FreeRequest&) {
    free_below_ = kMaxChunks;  // the freed objects emptied chunks
    return absl::OkStatus();
  };
  absl::StatusOr<uint64_t> object = large_->Allocate((kMaxCarvedChunks + 1) * kChunkSize);
  ASSERT_TRUE(object.ok()) << object.status();
  ASSERT_EQ(calls_.frees.size(), 1u);
  EXPECT_EQ(calls_.frees[0].objects(0).offset(), 12345u * 8);
  EXPECT_FALSE(frees_.pending());
  EXPECT_EQ(calls_.allocations.size(), 2u);
}

TEST_F(LargeObjectsTest, AnAnswerOutsideTheHeapIsAnErrorNotAnObject) {
  calls_.allocate_large = [](const v1::AllocateLargeRequest&, v1::AllocateLargeResponse* response) {
    response->set_offset(kMaxSize);  // past the heap
    response->set_size(4 * kChunkSize);
    response->set_capacity_bytes(kMaxSize);
    return absl::OkStatus();
  };
  absl::StatusOr<uint64_t> offset = large_->Allocate(kChunkSize);
  EXPECT_EQ(offset.status().code(), absl::StatusCode::kInternal) << offset.status();
  EXPECT_TRUE(absl::StrContains(offset.status().message(), "heapd answered")) << offset.status();
  EXPECT_FALSE(large_->Holds(static_cast<uint32_t>(kMaxChunks)));  // where heapd said
}

TEST_F(LargeObjectsTest, TellingUntoldObjectsCommitsThemOrKeepsThemForTheNextSync) {
  absl::StatusOr<uint64_t> offset = large_->Allocate(kChunkSize);
  ASSERT_TRUE(offset.ok());
  const uint32_t chunk = static_cast<uint32_t>(*offset >> kChunkShift);
  calls_.sync = [](const v1::SyncRequest&) { return absl::UnavailableError("heapd is gone"); };
  EXPECT_EQ(large_->TellUntold().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(large_->Untold(chunk));  // sent again later
  calls_.sync = [](const v1::SyncRequest&) { return absl::OkStatus(); };
  ASSERT_TRUE(large_->TellUntold().ok());
  EXPECT_FALSE(large_->Untold(chunk));
  EXPECT_TRUE(calls_.syncs.back().more());
  ASSERT_EQ(calls_.syncs.back().placed_size(), 1);
  EXPECT_EQ(calls_.syncs.back().placed(0).offset(), uint64_t{chunk} * kChunkSize);
}

TEST(ThreadCachesTest, EachThreadHasOneCacheAndQueuedFreesAreJudgedByItsPool) {
  ThreadCaches caches("h", 4,
                      [](uint32_t, uint32_t,
                         absl::Span<const uint32_t>) -> absl::StatusOr<std::vector<LeaseGrant>> {
                        return absl::UnavailableError("no leases in this test");
                      });
  caches.Start(kMaxChunks);
  ThreadCaches::Cache* mine = caches.OfThisThread();
  EXPECT_EQ(caches.OfThisThread(), mine);
  ThreadCaches::Cache* other = nullptr;
  std::thread([&] { other = caches.OfThisThread(); }).join();
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other, mine);
  EXPECT_EQ(caches.All().size(), 2u);
  EXPECT_EQ(caches.OwnerOf(3), nullptr);  // nothing leased
  // Another thread's free of an offset this pool never leased: queued,
  // then rejected when the pool applies it, and reported once.
  ThreadCaches::QueueFree(mine, 3 * kChunkSize);
  EXPECT_TRUE(mine->has_queued_frees.load());
  {
    VisitorScope visit(mine->gate);
    caches.ApplyQueuedFrees(mine);
  }
  EXPECT_FALSE(mine->has_queued_frees.load());
  const absl::Status rejected = caches.TakeRejected();
  EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(rejected.message(), "another thread")) << rejected;
  EXPECT_TRUE(caches.TakeRejected().ok());
  // Another session's caches are its own, on the same thread.
  ThreadCaches second("h2", 4,
                      [](uint32_t, uint32_t,
                         absl::Span<const uint32_t>) -> absl::StatusOr<std::vector<LeaseGrant>> {
                        return absl::UnavailableError("no leases");
                      });
  second.Start(kMaxChunks);
  EXPECT_NE(second.OfThisThread(), mine);
}

TEST(RemoteFreesTest, SmallFreesWaitForAFullBatchLargeOnesGoAtOnce) {
  ScriptedCalls calls;
  calls.free = [](const v1::FreeRequest&) { return absl::OkStatus(); };
  RemoteFrees frees(&calls, 7, 3);
  ASSERT_TRUE(frees.Free(100, 8).ok());
  ASSERT_TRUE(frees.Free(200, 0).ok());
  EXPECT_TRUE(calls.frees.empty());
  EXPECT_TRUE(frees.pending());
  ASSERT_TRUE(frees.Free(5 * kChunkSize, 2 * kChunkSize).ok());  // large: at once
  ASSERT_EQ(calls.frees.size(), 1u);
  EXPECT_EQ(calls.frees[0].objects_size(), 1);
  ASSERT_TRUE(frees.Free(300, 8).ok());  // the batch is full
  ASSERT_EQ(calls.frees.size(), 2u);
  EXPECT_EQ(calls.frees[1].objects_size(), 3);
  EXPECT_EQ(calls.frees[1].session(), 7u);
  EXPECT_FALSE(frees.pending());
}

TEST(RemoteFreesTest, ABatchWithABadFreeFreesTheOthersAndReportsIt) {
  ScriptedCalls calls;
  calls.free = [](const v1::FreeRequest& request) {
    for (const v1::ObjectRef& object : request.objects()) {
      if (object.offset() == 200) return absl::InvalidArgumentError("offset 200: double free?");
    }
    return absl::OkStatus();
  };
  RemoteFrees frees(&calls, 7, 10);
  for (uint64_t offset : {100, 200, 300}) ASSERT_TRUE(frees.Free(offset, 0).ok());
  const absl::Status flushed = frees.Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(flushed.message(), "offset 200")) << flushed;
  // The batch, then each object alone.
  ASSERT_EQ(calls.frees.size(), 4u);
  EXPECT_EQ(calls.frees[1].objects(0).offset(), 100u);
  EXPECT_EQ(calls.frees[3].objects(0).offset(), 300u);
}

TEST(SyncPartsTest, EarlierPartsAreHeldAndTheLastCarriesTheRest) {
  std::vector<LeaseReport> reports(2500);
  for (size_t i = 0; i < reports.size(); ++i) reports[i].chunk = static_cast<uint32_t>(i);
  std::vector<LargePlacement> placed(20000);
  for (size_t i = 0; i < placed.size(); ++i) placed[i] = {static_cast<uint32_t>(i), 1, false};
  ScriptedCalls calls;
  SyncParts parts(reports, placed);
  ASSERT_TRUE(parts.SendEarlier(calls, 7).ok());
  // 1024 reports and 16384 placements, then 1024 and the other 3616.
  ASSERT_EQ(calls.syncs.size(), 2u);
  for (const v1::SyncRequest& part : calls.syncs) {
    EXPECT_TRUE(part.more());
    EXPECT_EQ(part.session(), 7u);
    EXPECT_EQ(part.reports_size(), 1024);
  }
  EXPECT_EQ(calls.syncs[0].placed_size(), 16384);
  EXPECT_EQ(calls.syncs[1].placed_size(), 3616);
  // Each placement once, in order.
  EXPECT_EQ(calls.syncs[0].placed(0).offset(), 0u);
  EXPECT_EQ(calls.syncs[0].placed(16383).offset(), 16383 * kChunkSize);
  EXPECT_EQ(calls.syncs[1].placed(0).offset(), 16384 * kChunkSize);
  EXPECT_EQ(calls.syncs[1].placed(3615).offset(), 19999 * kChunkSize);
  v1::DetachRequest last;
  parts.FillLast(&last);
  EXPECT_EQ(last.reports_size(), 2500 - 2048);
  EXPECT_EQ(last.reports(0).chunk(), 2048u);
  EXPECT_EQ(last.placed_size(), 0);
}

TEST(SyncPartsTest, AFailedEarlierPartStopsTheSync) {
  std::vector<LeaseReport> reports(3000);
  std::vector<LargePlacement> placed;
  ScriptedCalls calls;
  calls.sync = [](const v1::SyncRequest&) { return absl::UnavailableError("heapd is gone"); };
  SyncParts parts(reports, placed);
  EXPECT_EQ(parts.SendEarlier(calls, 7).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(calls.syncs.size(), 1u);
}

TEST(SyncPartsTest, ASmallSyncIsOnePart) {
  std::vector<LeaseReport> reports(3);
  std::vector<LargePlacement> placed(2);
  ScriptedCalls calls;
  SyncParts parts(reports, placed);
  ASSERT_TRUE(parts.SendEarlier(calls, 7).ok());
  EXPECT_TRUE(calls.syncs.empty());
  v1::SyncRequest last;
  parts.FillLast(&last);
  EXPECT_EQ(last.reports_size(), 3);
  EXPECT_EQ(last.placed_size(), 2);
}

}  // namespace
}  // namespace heapd
