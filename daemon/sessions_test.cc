#include "daemon/sessions.h"

#include <unistd.h>

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "heap/test_dir.h"

namespace heapd {
namespace {

const Caller kAlice{1000, 1000, 1, {}};
const Caller kBob{1001, 1001, 2, {}};

class SessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Clients map the data file (no working image): a test renames it away
    // to keep a session's descriptor from being handed over.
    HeapOptions options;
    options.working_images = false;
    auto registry = HeapRegistry::Open(dir_.path(), options);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    absl::StatusOr<std::shared_ptr<ServedHeap>> heap = MakeHeap("h");
    ASSERT_TRUE(heap.ok()) << heap.status();
    heap_ = *heap;
  }

  // A new 64 MiB heap of Alice's.
  absl::StatusOr<std::shared_ptr<ServedHeap>> MakeHeap(const std::string& name) {
    HeapConfig config;
    config.max_size = 64 << 20;
    config.owner_uid = kAlice.uid;
    auto reserved = registry_->Reserve(name, kAlice.uid, config.max_size);
    if (!reserved.ok()) return reserved.status();
    return registry_->Create(*std::move(reserved), config);
  }

  // Heap h's clients, once the reaper ended what it can (up to 20 s).
  size_t ClientsOnceEndsAreDone() {
    for (int i = 0; i < 2000 && sessions_.CountOn("h") != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return sessions_.CountOn("h");
  }

  TestDir dir_;
  std::unique_ptr<HeapRegistry> registry_;
  std::shared_ptr<ServedHeap> heap_;
  Metrics metrics_;
  Sessions sessions_{absl::Seconds(10), 4, &metrics_};
};

TEST_F(SessionsTest, CallsCheckTheSessionsUserStateAndMode) {
  auto started = sessions_.Start(heap_, kAlice, /*read_only=*/false);
  ASSERT_TRUE(started.ok()) << started.status();
  const uint64_t id = started->session->id;
  auto grants = sessions_.LeaseAtStart(started->session, {{0, 2, {}}});
  ASSERT_TRUE(grants.ok()) << grants.status();
  EXPECT_EQ(grants->size(), 2u);
  EXPECT_EQ(sessions_.Lease(id, kBob, {{0, 1, {}}}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sessions_.Lease(id + 100, kAlice, {{0, 1, {}}}).status().code(),
            absl::StatusCode::kNotFound);
  auto reader = sessions_.Start(heap_, kAlice, /*read_only=*/true);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(sessions_.AllocateLarge(reader->session->id, kAlice, 3 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto synced = sessions_.Sync(id, kAlice, {});
  ASSERT_TRUE(synced.ok()) << synced.status();
  auto epoch = sessions_.Detach(id, kAlice, {});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(sessions_.Sync(id, kAlice, {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(heap_->heap->LeaseCount(id), 0u);
}

// A call of two wants whose second fails: the chunk the first took back
// through `reuse` stays the session's (its client, seeing the call fail,
// holds it in doubt and offers it again), and the first's fresh chunk
// goes back.
TEST_F(SessionsTest, AFailedWantLeavesTheChunksOfferedBackWithTheSession) {
  auto started = sessions_.Start(heap_, kAlice, /*read_only=*/false);
  ASSERT_TRUE(started.ok()) << started.status();
  const uint64_t id = started->session->id;
  auto first = sessions_.LeaseAtStart(started->session, {{0, 1, {}}});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  const uint32_t chunk = (*first)[0].chunk;
  // The first want takes `chunk` back as class 5 and one fresh chunk; the
  // second asks for none and fails.
  auto failed = sessions_.Lease(id, kAlice, {{5, 2, {chunk}}, {7, 0, {}}});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  EXPECT_EQ(heap_->heap->LeaseCount(id), 1u);
  // Offered again, it is granted as it is now.
  auto again = sessions_.Lease(id, kAlice, {{5, 1, {chunk}}});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->grants.size(), 1u);
  EXPECT_EQ(again->grants[0].chunk, chunk);
  EXPECT_EQ(again->grants[0].size_class, 5u);

  // A chunk one want leased fresh and a later want took back as its class
  // was not the session's before the call: it goes back too.
  auto probe = sessions_.Lease(id, kAlice, {{3, 1, {}}});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const LeaseGrant next = probe->grants.at(0);  // the chunk a fresh lease takes next
  ASSERT_TRUE(heap_->heap->ReturnLeases(id, {{next.chunk, next.words, 3}}).ok());
  failed = sessions_.Lease(id, kAlice, {{3, 1, {}}, {6, 1, {next.chunk}}, {7, 0, {}}});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  EXPECT_EQ(heap_->heap->LeaseCount(id), 1u);
  // So does a free chunk offered as if it were the session's, leased fresh.
  failed = sessions_.Lease(id, kAlice, {{3, 1, {next.chunk}}, {7, 0, {}}});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  EXPECT_EQ(heap_->heap->LeaseCount(id), 1u);
}

TEST_F(SessionsTest, ASessionLimitPerUser) {
  std::vector<SessionTable::Started> held;
  for (int i = 0; i < 4; ++i) {
    auto started = sessions_.Start(heap_, kAlice, true);
    ASSERT_TRUE(started.ok());
    held.push_back(*std::move(started));
  }
  const absl::Status fifth = sessions_.Start(heap_, kAlice, true).status();
  EXPECT_EQ(fifth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fifth.message().find("--max_sessions_per_user"), std::string::npos);
  EXPECT_TRUE(sessions_.Start(heap_, kBob, true).ok());  // another user
}

// The fd server's thread reports a closed connection while the session is
// busy (here: its lock held, as during a long sync): it must not wait. The
// reaper ends the session once the call is done, and it counts among the
// heap's clients until then.
TEST_F(SessionsTest, AClosedConnectionNeverWaitsForABusySession) {
  auto started = sessions_.Start(heap_, kAlice, false);
  ASSERT_TRUE(started.ok());
  ASSERT_TRUE(sessions_.LeaseAtStart(started->session, {{3, 1, {}}}).ok());
  std::shared_ptr<Session> session = started->session;
  auto redeemed = sessions_.Redeem(started->token, kAlice);
  ASSERT_TRUE(redeemed.ok()) << redeemed.status();
  close(redeemed->fd);
  session->mu.Lock();  // a call in progress
  const absl::Time start = absl::Now();
  sessions_.ConnectionClosed(session->id);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(heap_->heap->LeaseCount(session->id), 1u);  // not ended behind the call's back
  // Out of the table but not yet reclaimed: still one of the heap's clients.
  EXPECT_EQ(sessions_.CountOn("h"), 1u);
  session->mu.Unlock();
  EXPECT_EQ(ClientsOnceEndsAreDone(), 0u);
  EXPECT_EQ(heap_->heap->LeaseCount(session->id), 0u);  // no clients means reclaimed
  EXPECT_EQ(sessions_.Sync(session->id, kAlice, {}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionsTest, TokensAreOneTimeAndTheAttachingUsers) {
  auto started = sessions_.Start(heap_, kAlice, true);
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(sessions_.Redeem(started->token, kBob).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto redeemed = sessions_.Redeem(started->token, kAlice);
  ASSERT_TRUE(redeemed.ok());
  close(redeemed->fd);
  EXPECT_EQ(sessions_.Redeem(started->token, kAlice).status().code(), absl::StatusCode::kNotFound);
}

// A session whose descriptors cannot be handed over (its data file cannot be
// opened) ends at once: it holds no leases and counts as no client, and its
// token cannot be redeemed again.
TEST_F(SessionsTest, ASessionWhoseFdCannotBeHandedOverEnds) {
  auto started = sessions_.Start(heap_, kAlice, /*read_only=*/false);
  ASSERT_TRUE(started.ok()) << started.status();
  const uint64_t id = started->session->id;
  auto grants = sessions_.LeaseAtStart(started->session, {{0, 2, {}}});
  ASSERT_TRUE(grants.ok()) << grants.status();
  ASSERT_EQ(heap_->heap->LeaseCount(id), 2u);
  const std::string data = *registry_->HeapsDir() + "/h/data";
  ASSERT_EQ(rename(data.c_str(), (data + ".away").c_str()), 0);
  const absl::Status redeemed = sessions_.Redeem(started->token, kAlice).status();
  ASSERT_EQ(rename((data + ".away").c_str(), data.c_str()), 0);
  EXPECT_EQ(redeemed.code(), absl::StatusCode::kNotFound) << redeemed;
  EXPECT_NE(redeemed.message().find("/h/data"), std::string::npos) << redeemed;
  EXPECT_EQ(ClientsOnceEndsAreDone(), 0u);
  EXPECT_EQ(heap_->heap->LeaseCount(id), 0u);
  EXPECT_EQ(sessions_.Sync(id, kAlice, {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sessions_.Redeem(started->token, kAlice).status().code(), absl::StatusCode::kNotFound);
}

// Ends are reaped per heap: a session whose end waits (here: its lock held,
// as a long rollback would hold it) delays the ends on its own heap only.
TEST_F(SessionsTest, AnEndThatWaitsHoldsUpItsOwnHeapOnly) {
  absl::StatusOr<std::shared_ptr<ServedHeap>> other = MakeHeap("g");
  ASSERT_TRUE(other.ok()) << other.status();
  auto slow = sessions_.Start(heap_, kAlice, /*read_only=*/false);
  auto queued = sessions_.Start(heap_, kAlice, /*read_only=*/false);
  auto elsewhere = sessions_.Start(*other, kAlice, /*read_only=*/false);
  ASSERT_TRUE(slow.ok() && queued.ok() && elsewhere.ok());
  ASSERT_TRUE(sessions_.LeaseAtStart(elsewhere->session, {{0, 1, {}}}).ok());
  const ClientId elsewhere_id = elsewhere->session->id;
  {
    absl::MutexLock busy(&slow->session->mu);
    sessions_.ConnectionClosed(slow->session->id);
    sessions_.ConnectionClosed(queued->session->id);
    sessions_.ConnectionClosed(elsewhere_id);
    for (int i = 0; i < 2000 && sessions_.CountOn("g") != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(sessions_.CountOn("g"), 0u) << "heap g's end waited for heap h's";
    EXPECT_EQ((*other)->heap->LeaseCount(elsewhere_id), 0u);
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_EQ(sessions_.CountOn("h"), 2u) << "heap h's second end passed its first";
  }
  EXPECT_EQ(ClientsOnceEndsAreDone(), 0u);
}

}  // namespace
}  // namespace heapd
