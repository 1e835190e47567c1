// The real client over a heap in this process (client/in_process.h), with
// content rollback on tmpfs: the same guarantees as through heapd.
#include "client/in_process.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>

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

// Passes every call on, but fails the earlier parts of syncs and counts
// detaches.
class FailingParts : public SessionCalls {
 public:
  explicit FailingParts(std::unique_ptr<SessionCalls> calls) : calls_(std::move(calls)) {}
  absl::Status LeaseChunks(const v1::LeaseChunksRequest& r, v1::LeaseChunksResponse* a) override {
    return calls_->LeaseChunks(r, a);
  }
  absl::Status AllocateLarge(const v1::AllocateLargeRequest& r,
                             v1::AllocateLargeResponse* a) override {
    return calls_->AllocateLarge(r, a);
  }
  absl::Status Free(const v1::FreeRequest& r) override { return calls_->Free(r); }
  absl::Status Sync(const v1::SyncRequest& r, v1::SyncResponse* a) override {
    if (r.more()) return absl::UnavailableError("injected: a sync part failed");
    return calls_->Sync(r, a);
  }
  absl::Status Detach(const v1::DetachRequest& r) override {
    ++*detaches_;
    return calls_->Detach(r);
  }
  absl::Status Bind(const v1::BindRequest& r) override { return calls_->Bind(r); }
  absl::Status Unbind(const v1::UnbindRequest& r) override { return calls_->Unbind(r); }
  absl::StatusOr<NameEntry> Lookup(const std::string& name) override {
    return calls_->Lookup(name);
  }
  int lifeline() override { return calls_->lifeline(); }
  void Close() override { calls_->Close(); }

  int* detaches_ = nullptr;

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
  int detaches = 0;
  auto heap = AttachInProcess(heap_.get(), 1, {}, [&](std::unique_ptr<InProcessSessionCalls> c) {
    auto failing = std::make_unique<FailingParts>(std::move(c));
    failing->detaches_ = &detaches;
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
  EXPECT_EQ(detaches, 0);
  EXPECT_EQ(ReadX(), 11u);
  EXPECT_EQ(heap_->Stats().directory.live_objects, live);
}

}  // namespace
}  // namespace heapd
