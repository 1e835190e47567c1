// Fixed-address heaps and heapd::raw_allocator against a real heapd, with
// real processes attaching (client/examples/raw_pointers).
#include "heap/fixed_address.h"

#include <sys/mman.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client_channel.h"
#include "client/examples/raw_catalog.h"
#include "gtest/gtest.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "heapd/raw_allocator.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

class FixedAddressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kFixedAddressesMappable) {
      GTEST_SKIP() << "ThreadSanitizer keeps heapd's fixed-address window for its shadow";
    }
    daemon_.Start();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  absl::StatusOr<std::unique_ptr<Heap>> Attach(const std::string& name, bool fixed,
                                               uint64_t max_size = 256 * kMiB) {
    AttachOptions options;
    options.create_if_missing = true;
    options.fixed_address = fixed;
    options.max_size = max_size;
    return client_->Attach(name, options);
  }

  ChildResult RunRawPointers(const std::string& mode, const std::string& heap) {
    return RunChild({Runfile("client/examples/raw_pointers"), "--socket=" + daemon_.socket(),
                     "--heap=" + heap, "--entries=2000", mode});
  }

  absl::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& call) {
    grpc::ClientContext context;
    ChannelOf(*client_).Prepare(&context);
    return FromGrpc(call(&context));
  }

  TestDaemon daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(FixedAddressTest, StdContainersWithPlainPointersWorkInEveryProcess) {
  const ChildResult wrote = RunRawPointers("write", "catalog");
  ASSERT_TRUE(wrote.Exited(0)) << wrote.output;
  const ChildResult read = RunRawPointers("read", "catalog");
  ASSERT_TRUE(read.Exited(0)) << read.output;
  // Both processes mapped it at one address, heapd's.
  const std::string at = wrote.output.substr(wrote.output.find(" at "));
  EXPECT_NE(read.output.find(at), std::string::npos) << wrote.output << read.output;

  // This process too, after a heapd restart; the reader's additions are
  // there, made through the allocator stored in the heap.
  daemon_.Stop();
  daemon_.Start();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
  ASSERT_TRUE(client.ok()) << client.status();
  client_ = *std::move(client);
  absl::StatusOr<std::unique_ptr<Heap>> heap = Attach("catalog", true);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_TRUE((*heap)->fixed_address());
  EXPECT_NE(at.find(absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>((*heap)->base())))),
            std::string::npos)
      << at;
  absl::StatusOr<RawCatalog*> catalog = (*heap)->find<RawCatalog>("catalog");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(CheckRawCatalog(**catalog, 2000), "");
  const std::string title((*catalog)->title.data(), (*catalog)->title.size());
  EXPECT_NE(title.find(", read in another process"), std::string::npos) << title;
  // Every byte the catalog points at is inside the heap.
  const char* base = (*heap)->base();
  for (const RawNode* node = (*catalog)->list; node != nullptr; node = node->next) {
    ASSERT_GE(reinterpret_cast<const char*>(node), base);
    ASSERT_LT(reinterpret_cast<const char*>(node), base + (*heap)->max_size());
  }
  ASSERT_TRUE((*heap)->detach().ok());
}

TEST_F(FixedAddressTest, RawAllocatorRefusesAHeapMappedAnywhere) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = Attach("anywhere", false);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_FALSE((*heap)->fixed_address());
  try {
    raw_allocator<int> refused(**heap);
    ADD_FAILURE() << "a raw_allocator over a heap mapped anywhere";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("needs a fixed-address heap"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("anywhere"), std::string::npos) << e.what();
  }
  // Asking for a fixed heap of that name does not silently give this one.
  absl::StatusOr<std::unique_ptr<Heap>> again = Attach("anywhere", true);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
}

TEST_F(FixedAddressTest, HeapsGetTheirOwnRangesInTheWindow) {
  absl::StatusOr<std::unique_ptr<Heap>> a = Attach("a", true, 64 * kMiB);
  absl::StatusOr<std::unique_ptr<Heap>> b = Attach("b", true, 64 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const uint64_t at_a = reinterpret_cast<uintptr_t>((*a)->base());
  const uint64_t at_b = reinterpret_cast<uintptr_t>((*b)->base());
  EXPECT_TRUE(ValidateFixedBase(at_a, 64 * kMiB).ok());
  EXPECT_TRUE(ValidateFixedBase(at_b, 64 * kMiB).ok());
  EXPECT_FALSE(FixedRangeOf(at_a, 64 * kMiB).Overlaps(FixedRangeOf(at_b, 64 * kMiB)));
  absl::StatusOr<v1::HeapStats> stats = StatHeap(*client_, "b");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->info().fixed_address(), at_b);

  // A heap removed gives its range back.
  ASSERT_TRUE((*a)->detach().ok());
  v1::RemoveHeapRequest remove;
  remove.set_heap("a");
  v1::RemoveHeapResponse removed;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return StubOf(*client_).RemoveHeap(c, remove, &removed);
              }).ok());
  absl::StatusOr<std::unique_ptr<Heap>> c = Attach("c", true, 64 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*c)->base()), at_a);

  // Past the window: RESOURCE_EXHAUSTED naming the window.
  v1::CreateHeapRequest huge;
  huge.set_name("huge");
  huge.set_max_size(kFixedWindowEnd - kFixedWindowBegin);
  huge.set_fixed_address(true);
  v1::HeapInfo info;
  const absl::Status refused =
      Call([&](grpc::ClientContext* ctx) { return StubOf(*client_).CreateHeap(ctx, huge, &info); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("window"), std::string::npos) << refused;
}

TEST_F(FixedAddressTest, WhatOccupiesTheRangeIsNamed) {
  absl::StatusOr<std::unique_ptr<Heap>> first = Attach("h", true);
  ASSERT_TRUE(first.ok()) << first.status();
  // The same heap twice in one process: the first mapping is in the way.
  absl::StatusOr<std::unique_ptr<Heap>> twice = Attach("h", true);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition) << twice.status();
  EXPECT_NE(twice.status().message().find("is taken in this process by 0x"), std::string::npos)
      << twice.status();
  const uint64_t at = reinterpret_cast<uintptr_t>((*first)->base());
  ASSERT_TRUE((*first)->detach().ok());
  first->reset();

  // Something else of this process's mapped there.
  void* squatter = mmap(reinterpret_cast<void*>(at + 8 * kMiB), kMiB, PROT_READ,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(squatter, reinterpret_cast<void*>(at + 8 * kMiB));
  absl::StatusOr<std::unique_ptr<Heap>> blocked = Attach("h", true);
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition) << blocked.status();
  EXPECT_NE(blocked.status().message().find(absl::StrCat("0x", absl::Hex(at + 8 * kMiB), "-0x")),
            std::string::npos)
      << blocked.status();
  EXPECT_NE(blocked.status().message().find("heap h is a fixed-address heap"), std::string::npos)
      << blocked.status();
  munmap(squatter, kMiB);
  absl::StatusOr<std::unique_ptr<Heap>> freed = Attach("h", true);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*freed)->base()), at);
}

TEST_F(FixedAddressTest, ClientsThatWouldMapItAnywhereAreRefused) {
  ASSERT_TRUE(Attach("h", true).ok());
  // A client of revision 2 (heapd 0.4) says no revision at attach.
  v1::AttachRequest old;
  old.set_heap("h");
  old.set_read_only(true);
  v1::AttachResponse response;
  const absl::Status refused =
      Call([&](grpc::ClientContext* c) { return StubOf(*client_).Attach(c, old, &response); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("fixed-address heap"), std::string::npos) << refused;
  EXPECT_EQ(response.session(), 0u);
}

TEST_F(FixedAddressTest, RestoresKeepTheRangeAndNeverShareIt) {
  absl::StatusOr<std::unique_ptr<Heap>> heap = Attach("h", true);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const uint64_t at = reinterpret_cast<uintptr_t>((*heap)->base());
  ASSERT_TRUE((*heap)->detach().ok());
  v1::CreateSnapshotRequest snap;
  snap.set_heap("h");
  snap.set_name("s1");
  v1::SnapshotManifest manifest;
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return StubOf(*client_).CreateSnapshot(c, snap, &manifest);
              }).ok());

  // Next to the original: refused, naming it; nothing made.
  v1::RestoreSnapshotRequest beside;
  beside.set_name("s1");
  beside.set_heap("copy");
  v1::HeapInfo info;
  const absl::Status refused = Call(
      [&](grpc::ClientContext* c) { return StubOf(*client_).RestoreSnapshot(c, beside, &info); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("heap h holds"), std::string::npos) << refused;
  EXPECT_EQ(StatHeap(*client_, "copy").status().code(), absl::StatusCode::kNotFound);

  // Over the original: the same range.
  v1::RestoreSnapshotRequest over;
  over.set_name("s1");
  over.set_replace(true);
  ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                return StubOf(*client_).RestoreSnapshot(c, over, &info);
              }).ok());
  EXPECT_EQ(info.fixed_address(), at);
  absl::StatusOr<std::unique_ptr<Heap>> restored = Attach("h", true);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*restored)->base()), at);
}

}  // namespace
}  // namespace heapd
