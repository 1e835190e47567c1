// The real client over a heap in this process (testing/in_process.h), with
// content rollback on tmpfs: the same guarantees as through heapd.
#include "testing/in_process.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>

#include "client/heap_impl.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

class InProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm (content rollback needs tmpfs)";
    HeapConfig config;
    config.max_size = uint64_t{4} << 30;
    auto heap = PersistentHeap::Create(dir_.Sub("h"), config);
    ASSERT_TRUE(heap.ok()) << heap.status();
    heap_ = *std::move(heap);
    ASSERT_TRUE(heap_->content_rollback()) << heap_->content_rollback_note();
  }

  // Binds "x" to a new uint64_t holding `value` and syncs.
  uint64_t* PutX(Heap& heap, uint64_t value) {
    absl::StatusOr<uint64_t*> x = heap.construct<uint64_t>("x")(value);
    EXPECT_TRUE(x.ok()) << x.status();
    EXPECT_TRUE(heap.sync().ok());
    return x.ok() ? *x : nullptr;
  }

  uint64_t ReadX() {
    absl::StatusOr<NameEntry> entry = heap_->Lookup("x");
    EXPECT_TRUE(entry.ok()) << entry.status();
    uint64_t value = 0;
    EXPECT_EQ(pread(heap_->data_fd(), &value, sizeof(value), static_cast<off_t>(entry->offset)), 8);
    return value;
  }

  TestDir dir_{"/dev/shm"};
  std::unique_ptr<PersistentHeap> heap_;
};

TEST_F(InProcessTest, AStoreAfterTheLastSyncGoesBackWhenTheSessionCrashes) {
  InProcessSessionCalls* calls = nullptr;
  auto heap = AttachInProcess(heap_.get(), 1, {}, [&](std::unique_ptr<InProcessSessionCalls> c) {
    calls = c.get();
    return c;
  });
  ASSERT_TRUE(heap.ok()) << heap.status();
  ASSERT_TRUE((*heap)->content_rollback());
  uint64_t* x = PutX(**heap, 11);
  ASSERT_NE(x, nullptr);
  *x = 22;  // tracked: a pre-image first
  calls->Close();
  EXPECT_EQ(ReadX(), 11u);
  EXPECT_GE(heap_->Stats().undo.pages_restored, 1u);
}

TEST_F(InProcessTest, ASyncCommitsTheStore) {
  auto heap = AttachInProcess(heap_.get(), 1);
  ASSERT_TRUE(heap.ok()) << heap.status();
  uint64_t* x = PutX(**heap, 11);
  ASSERT_NE(x, nullptr);
  *x = 22;
  ASSERT_TRUE((*heap)->detach().ok());
  EXPECT_EQ(ReadX(), 22u);
}

// Passes every call on; counts AllocateLarge and Detach calls, and fails
// what a test asks: every earlier part of a sync, the next last part
// before it reaches the heap, or the next last part's answer after the
// heap applied it.
class Tap : public SessionCalls {
 public:
  explicit Tap(std::unique_ptr<SessionCalls> calls) : calls_(std::move(calls)) {}
  absl::Status LeaseChunks(const v1::LeaseChunksRequest& r, v1::LeaseChunksResponse* a) override {
    return calls_->LeaseChunks(r, a);
  }
  absl::Status AllocateLarge(const v1::AllocateLargeRequest& r,
                             v1::AllocateLargeResponse* a) override {
    ++large_calls;
    return calls_->AllocateLarge(r, a);
  }
  absl::Status Free(const v1::FreeRequest& r) override { return calls_->Free(r); }
  absl::Status Sync(const v1::SyncRequest& r, v1::SyncResponse* a) override {
    if (r.more() && fail_sync_parts) return absl::UnavailableError("injected: a sync part failed");
    if (!r.more() && fail_next_sync) {
      fail_next_sync = false;
      return absl::UnavailableError("injected: the sync never reached heapd");
    }
    absl::Status status = calls_->Sync(r, a);
    if (!r.more() && lose_next_sync_answer) {
      lose_next_sync_answer = false;
      return absl::UnavailableError("injected: the answer was lost");
    }
    return status;
  }
  absl::Status Detach(const v1::DetachRequest& r) override {
    ++detaches;
    return calls_->Detach(r);
  }
  absl::Status Bind(const v1::BindRequest& r) override { return calls_->Bind(r); }
  absl::StatusOr<NameEntry> Unbind(const v1::UnbindRequest& r) override {
    return calls_->Unbind(r);
  }
  absl::StatusOr<NameEntry> Lookup(const std::string& name) override {
    return calls_->Lookup(name);
  }
  int lifeline() override { return calls_->lifeline(); }
  void Close() override { calls_->Close(); }

  int large_calls = 0;
  int detaches = 0;
  bool fail_sync_parts = false;
  bool fail_next_sync = false;
  bool lose_next_sync_answer = false;

 private:
  std::unique_ptr<SessionCalls> calls_;
};

// A detach whose earlier part fails sends no Detach (it would commit the
// session's stores without the part's allocations): the session ends as
// a crash, at its last sync.
TEST_F(InProcessTest, ADetachWhosePartFailsEndsAtTheLastSync) {
  struct statvfs shm;
  if (statvfs("/dev/shm", &shm) != 0 || uint64_t{shm.f_bavail} * shm.f_frsize < (3ull << 30)) {
    GTEST_SKIP() << "needs 3 GiB free on /dev/shm (a detach of more than one message)";
  }
  Tap* tap = nullptr;
  auto heap = AttachInProcess(heap_.get(), 1, {}, [&](std::unique_ptr<InProcessSessionCalls> c) {
    auto failing = std::make_unique<Tap>(std::move(c));
    failing->fail_sync_parts = true;
    tap = failing.get();
    return failing;
  });
  ASSERT_TRUE(heap.ok()) << heap.status();
  uint64_t* x = PutX(**heap, 11);
  ASSERT_NE(x, nullptr);
  const uint64_t live = heap_->Stats().directory.live_objects;
  *x = 22;
  // Two objects a chunk: more chunks than one detach message carries.
  for (int i = 0; i < 2100; ++i) ASSERT_TRUE((*heap)->allocate(kMaxSmallSize).ok());
  const absl::Status detached = (*heap)->detach();
  EXPECT_EQ(detached.code(), absl::StatusCode::kUnavailable) << detached;
  EXPECT_EQ(tap->detaches, 0);
  EXPECT_EQ(ReadX(), 11u);
  EXPECT_EQ(heap_->Stats().directory.live_objects, live);
}

class CarvingTest : public InProcessTest {
 protected:
  std::unique_ptr<Heap> Attach(ClientId session) {
    auto heap =
        AttachInProcess(heap_.get(), session, {}, [&](std::unique_ptr<InProcessSessionCalls> c) {
          calls_ = c.get();
          auto tap = std::make_unique<Tap>(std::move(c));
          tap_ = tap.get();
          return tap;
        });
    EXPECT_TRUE(heap.ok()) << heap.status();
    return heap.ok() ? *std::move(heap) : nullptr;
  }

  InProcessSessionCalls* calls_ = nullptr;
  Tap* tap_ = nullptr;
};

constexpr uint64_t kLarge = 3 << 19;  // 1.5 MiB: one chunk

TEST_F(CarvingTest, LargeObjectsAreCarvedWithoutACallEachAndCommitAtSync) {
  std::unique_ptr<Heap> heap = Attach(1);
  ASSERT_NE(heap, nullptr);
  std::vector<uint64_t*> objects;
  for (uint64_t i = 0; i < 100; ++i) {
    absl::StatusOr<void*> object = heap->allocate(kLarge);
    ASSERT_TRUE(object.ok()) << object.status();
    objects.push_back(static_cast<uint64_t*>(*object));
    objects.back()[0] = i;
    objects.back()[kLarge / 8 - 1] = i;
  }
  EXPECT_LE(tap_->large_calls, 7);  // batches of 1, 2, 4, 8, 16, 32, 64 chunks
  for (size_t i = 0; i < objects.size(); i += 2) {
    ASSERT_TRUE(heap->deallocate(objects[i], kLarge).ok());
  }
  // Freed before heapd knew of them: in the reserve again, so a second free
  // and a free of the wrong size are refused here.
  EXPECT_EQ(heap->deallocate(objects[0], kLarge).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heap->deallocate(objects[1], 5 * kLarge).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heap->deallocate(reinterpret_cast<char*>(objects[1]) + kChunkSize / 2).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heap_->Stats().directory.large_objects, 0u);
  EXPECT_GE(heap_->Stats().directory.large_reserve_chunks, 100u);
  ASSERT_TRUE(heap->sync().ok());
  DirectoryStats stats = heap_->Stats().directory;
  EXPECT_EQ(stats.large_objects, 50u);
  EXPECT_EQ(stats.large_reserve_chunks, 0u);  // the rest of the reserve went back
  EXPECT_TRUE(heap_->CheckInvariants().ok());
  std::vector<uint64_t> kept;
  for (size_t i = 1; i < objects.size(); i += 2) kept.push_back(heap->offset_of(objects[i]));
  ASSERT_TRUE(heap->detach().ok());

  std::unique_ptr<Heap> again = Attach(2);
  ASSERT_NE(again, nullptr);
  for (size_t k = 0; k < kept.size(); ++k) {
    const uint64_t* object = again->at<uint64_t>(kept[k]);
    EXPECT_EQ(object[0], 2 * k + 1);
    EXPECT_EQ(object[kLarge / 8 - 1], 2 * k + 1);
  }
  // Committed objects are freed through heapd, exactly once.
  ASSERT_TRUE(again->deallocate(again->at(kept[0]), kLarge).ok());
  EXPECT_EQ(again->deallocate(again->at(kept[0]), kLarge).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(again->sync().ok());  // frees apply with the freer's sync (content rollback)
  EXPECT_EQ(heap_->Stats().directory.large_objects, 49u);
}

// A sync that reached heapd but whose answer was lost: the client sends its
// placements again with the next, and they count once. An object in
// flight is freed through heapd.
TEST_F(CarvingTest, PlacementsOfASyncWhoseAnswerWasLostAreSentAgain) {
  std::unique_ptr<Heap> heap = Attach(1);
  ASSERT_NE(heap, nullptr);
  std::vector<void*> objects;
  for (int i = 0; i < 3; ++i) objects.push_back(*heap->allocate(kLarge));
  tap_->lose_next_sync_answer = true;
  EXPECT_EQ(heap->sync().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(heap_->Stats().directory.large_objects, 3u);
  ASSERT_TRUE(heap->deallocate(objects[0], kLarge).ok());
  ASSERT_TRUE(heap->allocate(kLarge).ok());
  ASSERT_TRUE(heap->sync().ok());
  EXPECT_EQ(heap_->Stats().directory.large_objects, 3u);
  EXPECT_EQ(heap->deallocate(objects[0], kLarge).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(heap_->CheckInvariants().ok());
}

// A carved object bound to a name is placed first: found by name by
// another session, and committed.
TEST_F(CarvingTest, ACarvedObjectBoundToANameIsPlacedFirst) {
  struct Big {
    char bytes[3 << 20];
  };
  std::unique_ptr<Heap> heap = Attach(1);
  ASSERT_NE(heap, nullptr);
  absl::StatusOr<Big*> big = heap->construct<Big>("big")();
  ASSERT_TRUE(big.ok()) << big.status();
  std::strcpy((*big)->bytes + (2 << 20), "far in");
  EXPECT_EQ(heap_->Stats().directory.large_objects, 1u);
  std::unique_ptr<Heap> reader = Attach(2);
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<Big*> found = reader->find<Big>("big");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_STREQ((*found)->bytes + (2 << 20), "far in");
  EXPECT_EQ(reader->destroy<Big>("big").code(), absl::StatusCode::kOk);
  ASSERT_TRUE(reader->sync().ok());
  EXPECT_EQ(heap_->Stats().directory.large_objects, 0u);
}

// A session that dies leaves nothing of its reserve: carved objects never
// placed, and placed ones not committed, are free again.
TEST_F(CarvingTest, ASessionThatDiesLeavesNothingOfItsReserve) {
  std::unique_ptr<Heap> heap = Attach(1);
  ASSERT_NE(heap, nullptr);
  ASSERT_TRUE(heap->allocate(kLarge).ok());
  ASSERT_TRUE(heap->sync().ok());
  const DirectoryStats before = heap_->Stats().directory;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(heap->allocate(2 * kChunkSize).ok());
  tap_->lose_next_sync_answer = true;  // placed, and committed: this is a sync
  (void)heap->sync();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(heap->allocate(kLarge).ok());
  calls_->Close();  // dies
  const DirectoryStats after = heap_->Stats().directory;
  EXPECT_EQ(after.large_objects, before.large_objects + 20);
  EXPECT_EQ(after.leased_chunks, 0u);
  EXPECT_EQ(after.large_reserve_chunks, 0u);
  EXPECT_EQ(after.free_chunks, after.capacity_chunks - after.large_chunks);
  EXPECT_TRUE(heap_->CheckInvariants().ok());
}

// A sync reached heapd but its answer was lost; the object is freed before
// the next sync sends its placement again (at once without content
// tracking; by another session with it): the next syncs and the detach
// still work, and the object counts once.
TEST_F(CarvingTest, AnObjectFreedBeforeItsPlacementIsSentAgainLocksNothingOut) {
  for (const bool tracked : {false, true}) {
    SCOPED_TRACE(tracked ? "content rollback" : "no content rollback");
    HeapConfig config;
    config.max_size = uint64_t{4} << 30;
    HeapOptions options;
    options.track_contents = tracked;
    auto heap = PersistentHeap::Create(dir_.Sub(tracked ? "tracked" : "plain"), config, options);
    ASSERT_TRUE(heap.ok()) << heap.status();
    heap_ = *std::move(heap);
    std::unique_ptr<Heap> session = Attach(1);
    ASSERT_NE(session, nullptr);
    void* object = *session->allocate(kLarge);
    tap_->lose_next_sync_answer = true;
    EXPECT_FALSE(session->sync().ok());  // placed and committed at heapd
    if (tracked) {
      std::unique_ptr<Heap> other = Attach(2);
      ASSERT_NE(other, nullptr);
      ASSERT_TRUE(other->deallocate(other->at(session->offset_of(object)), kLarge).ok());
      ASSERT_TRUE(other->detach().ok());
    } else {
      ASSERT_TRUE(session->deallocate(object, kLarge).ok());
    }
    EXPECT_EQ(heap_->Stats().directory.large_objects, 0u);
    // Its chunk reserved again, for this session, before the placement
    // is sent again: that placement is dropped, not taken as new.
    void* next = *session->allocate(kLarge);
    absl::StatusOr<uint64_t> synced = session->sync();
    EXPECT_TRUE(synced.ok()) << synced.status();
    EXPECT_EQ(heap_->Stats().directory.large_objects, 1u);
    ASSERT_TRUE(session->deallocate(next, kLarge).ok());
    EXPECT_TRUE(session->sync().ok());
    const absl::Status detached = session->detach();
    EXPECT_TRUE(detached.ok()) << detached;
    EXPECT_EQ(heap_->Stats().directory.large_objects, 0u);
    EXPECT_TRUE(heap_->CheckInvariants().ok());
  }
}

// With content tracking a free is checked at once and applied at the
// freer's sync. One of a reserved chunk no object was ever carved at must
// not free what the owner carves there later (after releasing and
// reserving it again): it is rejected.
TEST_F(CarvingTest, AFreeOfAReservedChunkNeverFreesALaterObjectThere) {
  std::unique_ptr<Heap> owner = Attach(1);
  ASSERT_NE(owner, nullptr);
  (void)*owner->allocate(kLarge);                               // a reserve of 1 chunk
  void* first = *owner->allocate(kLarge);                       // one of 2: the second is spare
  const uint64_t bogus = owner->offset_of(first) + kChunkSize;  // reserved, never carved
  std::unique_ptr<Heap> other = Attach(2);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->deallocate(other->at(bogus), kLarge).ok());  // taken for now
  ASSERT_TRUE(owner->sync().ok());  // places both objects, releases the rest
  void* second = *owner->allocate(kLarge);
  ASSERT_EQ(owner->offset_of(second), bogus);  // the same chunk, reserved again
  ASSERT_TRUE(owner->sync().ok());
  EXPECT_EQ(other->sync().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heap_->Stats().directory.large_objects, 3u);
}

// An object whose sync never reached heapd can still be bound: it is
// placed first.
TEST_F(CarvingTest, AnObjectOfASyncThatFailedCanBeBound) {
  std::unique_ptr<Heap> heap = Attach(1);
  ASSERT_NE(heap, nullptr);
  void* object = *heap->allocate(kLarge);
  tap_->fail_next_sync = true;
  EXPECT_FALSE(heap->sync().ok());
  const absl::Status bound = heap->Bind("big", object, kLarge, "Big");
  EXPECT_TRUE(bound.ok()) << bound;
  EXPECT_TRUE(heap->sync().ok());
  EXPECT_EQ(heap_->Stats().directory.large_objects, 1u);
}

// Reserves do not grow the heap far past what sessions use: they take free
// chunks first, and batches start small after each sync.
TEST_F(CarvingTest, ReservesDoNotBalloonTheHeap) {
  std::vector<std::unique_ptr<Heap>> sessions;
  for (ClientId s = 1; s <= 4; ++s) sessions.push_back(Attach(s));
  for (int round = 0; round < 10; ++round) {
    for (auto& session : sessions) ASSERT_TRUE(session->allocate(kLarge).ok());
    for (auto& session : sessions) ASSERT_TRUE(session->sync().ok());
  }
  const DirectoryStats stats = heap_->Stats().directory;
  EXPECT_EQ(stats.large_objects, 40u);
  // 40 chunks used; growth steps of 16 chunks or an eighth of the heap.
  EXPECT_LE(stats.capacity_chunks, 64u) << stats.capacity_chunks;
}

}  // namespace
}  // namespace heapd

namespace heapd {
namespace {

// A heapd older than the library needs (it answers no protocol revision)
// is refused at attach, saying what to do.
TEST_F(InProcessTest, AHeapdBelowTheNeededRevisionIsRefused) {
  v1::AttachResponse attached;
  attached.set_session(7);
  attached.mutable_heap()->set_max_size(heap_->config().max_size);
  absl::StatusOr<int> data = heap_->OpenDataFile(/*writable=*/false);
  ASSERT_TRUE(data.ok());
  AttachOptions options;
  options.read_only = true;
  absl::StatusOr<std::unique_ptr<Heap>> heap =
      HeapImpl::Start(std::make_unique<InProcessSessionCalls>(heap_.get(), 7, true), "h", options,
                      attached, *data, UniqueFd());
  ASSERT_FALSE(heap.ok());
  EXPECT_EQ(heap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(heap.status().message().find("upgrade heapd"), std::string::npos) << heap.status();
}

}  // namespace
}  // namespace heapd
