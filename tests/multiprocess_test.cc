// Several real client processes on one real heapd: concurrent allocation,
// names, reading each other's objects, frees across processes, a client
// killed mid-allocation, heapd killed and restarted, and a read-only client
// that writes.
#include <signal.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_channel.h"
#include "gtest/gtest.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

constexpr char kHeap[] = "shared";

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.Start();
    worker_ = Runfile("tests/heap_worker");
  }

  std::vector<std::string> Worker(std::vector<std::string> args) const {
    std::vector<std::string> argv = {worker_, daemon_.socket(), kHeap};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  v1::HeapStats Stat() {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    EXPECT_TRUE(client.ok()) << client.status();
    absl::StatusOr<v1::HeapStats> stats = StatHeap(**client, kHeap);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : v1::HeapStats();
  }

  // Starts `count` alloc workers at once and waits for them all.
  void AllocConcurrently(int first_id, int count, int objects) {
    std::vector<std::unique_ptr<Child>> workers;
    for (int id = first_id; id < first_id + count; ++id) {
      workers.push_back(
          std::make_unique<Child>(Worker({"alloc", std::to_string(id), std::to_string(objects)})));
    }
    for (auto& worker : workers) {
      const ChildResult result = worker->Wait();
      ASSERT_TRUE(result.Exited(0)) << result.output << daemon_.Log();
      EXPECT_NE(result.output.find("ok allocated"), std::string::npos) << result.output;
    }
  }

  void VerifyAll(int first_id, int count) {
    for (int id = first_id; id < first_id + count; ++id) {
      const ChildResult result = RunChild(Worker({"verify", std::to_string(id)}));
      ASSERT_TRUE(result.Exited(0)) << result.output;
      EXPECT_NE(result.output.find("ok verified"), std::string::npos);
    }
  }

  TestDaemon daemon_;
  std::string worker_;
};

TEST_F(MultiProcessTest, ClientsAllocateConcurrentlyAndReadEachOthersObjects) {
  constexpr int kObjects = 20000;
  AllocConcurrently(1, 4, kObjects);
  VerifyAll(1, 4);
  const v1::HeapStats stats = Stat();
  // Every object, table and record of every worker is live; scratch objects
  // were freed (by another thread); no leases remain.
  const uint64_t large_per_worker = (kObjects + 996) / 997;
  EXPECT_EQ(stats.info().live_objects(), 4u * (kObjects + 2));
  EXPECT_EQ(stats.large_objects(), 4u * large_per_worker);
  EXPECT_EQ(stats.leased_chunks(), 0u);
  EXPECT_EQ(stats.info().clients(), 0u);
  EXPECT_EQ(stats.info().names(), 4u);
}

TEST_F(MultiProcessTest, AProcessFreesAnothersObjectsAndADoubleFreeIsRejected) {
  AllocConcurrently(1, 1, 4000);
  const uint64_t before = Stat().info().live_objects();
  const ChildResult freed = RunChild(Worker({"free-half", "1"}));
  ASSERT_TRUE(freed.Exited(0)) << freed.output;
  EXPECT_NE(freed.output.find("ok freed 2000"), std::string::npos) << freed.output;
  EXPECT_NE(freed.output.find("double free: INVALID_ARGUMENT"), std::string::npos) << freed.output;
  EXPECT_EQ(Stat().info().live_objects(), before - 2000);
  VerifyAll(1, 1);  // the other half is intact
}

TEST_F(MultiProcessTest, AClientKilledMidAllocationLeaksNothingAndOthersGoOn) {
  AllocConcurrently(1, 1, 2000);
  const v1::HeapStats before = Stat();
  Child doomed(Worker({"alloc-forever", "9"}));
  ASSERT_TRUE(doomed.WaitForOutput("synced")) << daemon_.Log();
  // Another client works meanwhile.
  Child other(Worker({"alloc", "2", "3000"}));
  ASSERT_TRUE(doomed.WaitForOutput("allocated"));  // past its sync
  doomed.Kill(SIGKILL);
  ASSERT_TRUE(doomed.Wait().KilledBy(SIGKILL));
  const ChildResult other_result = other.Wait();
  ASSERT_TRUE(other_result.Exited(0)) << other_result.output;
  // The daemon reclaims the dead session when its fd connection closes.
  v1::HeapStats after;
  for (int i = 0; i < 100; ++i) {
    after = Stat();
    if (after.info().clients() == 0) break;
    usleep(20 * 1000);
  }
  EXPECT_EQ(after.info().clients(), 0u);
  EXPECT_EQ(after.leased_chunks(), 0u);
  // What remains is what the dead client had synced (1000 objects and its
  // marker) plus worker 2's, and nothing it allocated afterwards.
  EXPECT_EQ(after.info().live_objects(), before.info().live_objects() + 1001 + 3002);
  EXPECT_NE(daemon_.Log().find("fd-socket connection closed without a detach"), std::string::npos);
  VerifyAll(1, 2);
}

TEST_F(MultiProcessTest, HeapdKilledAndRestartedOpensEveryHeapAtItsLastSync) {
  AllocConcurrently(1, 2, 5000);
  const v1::HeapStats before = Stat();
  daemon_.Crash();
  daemon_.Start();
  const v1::HeapStats after = Stat();
  EXPECT_EQ(after.info().live_objects(), before.info().live_objects());
  EXPECT_EQ(after.info().allocated_bytes(), before.info().allocated_bytes());
  EXPECT_EQ(after.info().names(), before.info().names());
  EXPECT_GE(after.info().epoch(), before.info().epoch());
  VerifyAll(1, 2);
  AllocConcurrently(3, 1, 1000);  // and it keeps working
  VerifyAll(1, 3);
}

TEST_F(MultiProcessTest, ClientWithUnsyncedWorkSurvivesAsLastSyncWhenHeapdIsKilled) {
  AllocConcurrently(1, 1, 1000);
  Child doomed(Worker({"alloc-forever", "5"}));
  ASSERT_TRUE(doomed.WaitForOutput("allocated"));  // past its sync
  daemon_.Crash();
  doomed.Kill(SIGKILL);
  doomed.Wait();
  daemon_.Start();
  const v1::HeapStats after = Stat();
  EXPECT_EQ(after.info().live_objects(), 1002u + 1001u);
  EXPECT_EQ(after.info().names(), 2u);
  VerifyAll(1, 1);
}

TEST_F(MultiProcessTest, AReadOnlyClientThatWritesFaultsAndTheHeapIsUnchanged) {
  ASSERT_TRUE(RunChild(Worker({"put", "answer", "42"})).Exited(0));
  const v1::HeapStats before = Stat();
  // Under ASan its SEGV handler would report the fault and exit: let the
  // signal kill the writer, as it does without a sanitizer.
  const char* asan_options = std::getenv("ASAN_OPTIONS");
  std::vector<std::string> argv = {
      "/usr/bin/env",
      absl::StrCat("ASAN_OPTIONS=", asan_options ? asan_options : "", ":handle_segv=0")};
  for (std::string& arg : Worker({"ro-write", "answer"})) argv.push_back(std::move(arg));
  Child writer(argv);
  ASSERT_TRUE(writer.WaitForOutput("read 42; writing")) << daemon_.Log();
  const ChildResult result = writer.Wait();
  EXPECT_TRUE(result.KilledBy(SIGSEGV)) << result.output;
  const ChildResult read = RunChild(Worker({"get", "answer"}));
  EXPECT_NE(read.output.find("value 42"), std::string::npos) << read.output;
  const v1::HeapStats after = Stat();
  EXPECT_EQ(after.info().live_objects(), before.info().live_objects());
  EXPECT_EQ(after.info().clients(), 0u);
}

// A producer allocates objects (small and large) and hands them to a
// consumer process through the heap before it syncs; the consumer frees
// them all. Every free is right and nothing leaks, whether the producer
// then syncs and detaches or dies.
TEST_F(MultiProcessTest, FreesOfAnotherProcesssUnsyncedObjectsAreExact) {
  for (const bool producer_dies : {false, true}) {
    SCOPED_TRACE(producer_dies ? "the producer dies" : "the producer detaches");
    {
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
      ASSERT_TRUE(client.ok());
      v1::CreateHeapRequest request;
      request.set_name(kHeap);
      request.set_max_size(uint64_t{4} << 30);
      v1::HeapInfo info;
      grpc::ClientContext context;
      ASSERT_TRUE(FromGrpc(StubOf(**client).CreateHeap(&context, request, &info)).ok());
    }
    Child producer(Worker({"produce", "3000"}));
    ASSERT_TRUE(producer.WaitForOutput("produced")) << producer.output() << daemon_.Log();
    const ChildResult consumer = RunChild(Worker({"consume"}));
    ASSERT_TRUE(consumer.Exited(0)) << consumer.output << daemon_.Log();
    EXPECT_NE(consumer.output.find("consumed 3000"), std::string::npos) << consumer.output;
    if (producer_dies) {
      producer.Kill(SIGKILL);
      producer.Wait();
    } else {
      producer.Kill(SIGUSR1);
      const ChildResult produced = producer.Wait();
      ASSERT_TRUE(produced.Exited(0)) << produced.output;
      EXPECT_NE(produced.output.find("detached"), std::string::npos) << produced.output;
    }
    v1::HeapStats after;
    for (int i = 0; i < 100; ++i) {
      after = Stat();
      if (after.info().clients() == 0) break;
      usleep(20 * 1000);
    }
    EXPECT_EQ(after.info().live_objects(), 0u) << daemon_.Log();
    EXPECT_EQ(after.leased_chunks(), 0u);
    EXPECT_EQ(after.info().names(), 0u);
    EXPECT_EQ(daemon_.Log().find("rejected"), std::string::npos) << daemon_.Log();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok());
    v1::RemoveHeapRequest remove;
    remove.set_heap(kHeap);
    v1::RemoveHeapResponse removed;
    grpc::ClientContext context;
    ASSERT_TRUE(FromGrpc(StubOf(**client).RemoveHeap(&context, remove, &removed)).ok());
  }
}

// 64 processes attach one heap at once: every one gets its session.
TEST_F(MultiProcessTest, SixtyFourProcessesAttachAtOnce) {
  AllocConcurrently(1, 1, 100);
  std::vector<std::unique_ptr<Child>> attaching;
  for (int i = 0; i < 64; ++i) {
    attaching.push_back(std::make_unique<Child>(Worker({"attach", i % 4 == 0 ? "ro" : "rw"})));
  }
  int ok = 0;
  for (auto& child : attaching) {
    const ChildResult result = child->Wait();
    EXPECT_TRUE(result.Exited(0)) << result.output;
    ok += result.Exited(0);
  }
  EXPECT_EQ(ok, 64) << daemon_.Log();
}

}  // namespace
}  // namespace heapd
