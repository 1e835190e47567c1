// heapd::Heap and heapd::allocator against a real heapd.
#include "heapd/heap.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_channel.h"
#include "client/examples/graph.h"
#include "gtest/gtest.h"
#include "heapd/allocator.h"
#include "heapd/client.h"
#include "testing/test_daemon.h"

namespace heapd {
namespace {

class HeapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_.Start();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_.socket());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  std::unique_ptr<Heap> Attach(bool read_only = false, uint64_t max_size = 1 << 30) {
    AttachOptions options;
    options.read_only = read_only;
    options.create_if_missing = true;
    options.max_size = max_size;
    absl::StatusOr<std::unique_ptr<Heap>> heap = client_->Attach("h", options);
    EXPECT_TRUE(heap.ok()) << heap.status();
    return heap.ok() ? *std::move(heap) : nullptr;
  }

  v1::HeapStats Stat() {
    absl::StatusOr<v1::HeapStats> stats = StatHeap(*client_, "h");
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : v1::HeapStats();
  }

  TestDaemon daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(HeapTest, ContainersLiveInTheHeapAndWorkAtAnyAddress) {
  std::unique_ptr<Heap> a = Attach();
  std::unique_ptr<Heap> b = Attach();  // a second session, mapped elsewhere
  ASSERT_NE(a->base(), b->base());
  absl::StatusOr<Graph*> built = a->construct<Graph>("g")(allocator<char>(*a));
  ASSERT_TRUE(built.ok()) << built.status();
  for (uint64_t v = 0; v < 1000; ++v) {
    for (uint64_t e = 0; e < v % 17; ++e) (*built)->AddEdge(v, v * 31 + e);
  }
  ASSERT_TRUE(a->sync().ok());

  absl::StatusOr<Graph*> seen = b->find<Graph>("g");
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_NE(static_cast<void*>(*seen), static_cast<void*>(*built));
  EXPECT_EQ((*seen)->map.size(), 1000u - 59);  // vertices 0, 17, ..., 986 have no edges
  for (uint64_t v = 0; v < 1000; ++v) {
    auto it = (*seen)->map.find(v);
    if (v % 17 == 0) {
      EXPECT_EQ(it, (*seen)->map.end());
      continue;
    }
    ASSERT_NE(it, (*seen)->map.end());
    ASSERT_EQ(it->second.size(), v % 17);
    EXPECT_EQ(it->second.back(), v * 31 + v % 17 - 1);
  }
  // Growing the graph through b allocates in b's session (its allocator
  // finds b's Heap through the header before b's mapping).
  const uint64_t a_before = a->offset_of(&(*built)->map.find(1)->second[0]);
  for (int i = 0; i < 100; ++i) (*seen)->AddEdge(1, 7);
  EXPECT_NE(a->offset_of(&(*built)->map.find(1)->second[0]), a_before);  // reallocated
  EXPECT_EQ((*built)->map.find(1)->second.size(), 101u);                 // a sees it: one file
  ASSERT_TRUE(b->detach().ok());
  ASSERT_TRUE(a->detach().ok());
  const v1::HeapStats stats = Stat();
  EXPECT_EQ(stats.leased_chunks(), 0u);
  EXPECT_EQ(stats.info().names(), 1u);
}

TEST_F(HeapTest, PointersIntoGrowthByAnotherClientAreMappedOnFirstTouch) {
  std::unique_ptr<Heap> reader = Attach();
  std::unique_ptr<Heap> writer = Attach();
  absl::StatusOr<Graph*> graph = writer->construct<Graph>("g")(allocator<char>(*writer));
  ASSERT_TRUE(graph.ok());
  absl::StatusOr<Graph*> seen = reader->find<Graph>("g");
  ASSERT_TRUE(seen.ok());
  // The writer grows the heap well past what the reader has mapped.
  for (uint64_t i = 0; i < 800000; ++i) (*graph)->AddEdge(i % 5000, i);
  const uint64_t far = writer->offset_of(&(*graph)->map.find(4999)->second.back());
  ASSERT_GT(far, 64u << 20);
  // The reader follows the offset pointers into memory it never mapped.
  uint64_t edges = 0;
  for (const auto& [vertex, neighbours] : (*seen)->map) edges += neighbours.size();
  EXPECT_EQ(edges, 800000u);
  EXPECT_EQ(*reader->at<uint64_t>(far), 799999u);
  // A touch beyond the data file, or outside any heap, still faults.
  EXPECT_DEATH({ *reinterpret_cast<volatile int*>(reader->base() + reader->max_size() - 8) = 1; },
               "");
  volatile int* volatile nowhere = reinterpret_cast<int*>(uintptr_t{16});
  EXPECT_DEATH({ *nowhere = 1; }, "");
}

TEST_F(HeapTest, NamedObjectsAreTypeChecked) {
  std::unique_ptr<Heap> heap = Attach();
  ASSERT_TRUE(heap->construct<uint64_t>("x")(7).ok());
  EXPECT_EQ(heap->construct<uint64_t>("x")(8).status().code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<double*> wrong = heap->find<double>("x");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  // The spelling is the compiler's (g++: "long unsigned int", clang:
  // "unsigned long"; client/type_name.h).
  EXPECT_NE(wrong.status().message().find(
                absl::StrCat("binds a ", TypeName<uint64_t>(), ", not a ", TypeName<double>())),
            absl::string_view::npos)
      << wrong.status();
  ASSERT_EQ(**heap->find<uint64_t>("x"), 7u);
  ASSERT_TRUE(heap->sync().ok());
  EXPECT_EQ(Stat().info().live_objects(), 1u);  // the failed construct left nothing
  ASSERT_TRUE(heap->destroy<uint64_t>("x").ok());
  EXPECT_EQ(heap->find<uint64_t>("x").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(heap->sync().ok());
  EXPECT_EQ(Stat().info().live_objects(), 0u);
  EXPECT_EQ(heap->construct<uint64_t>("bad\tname")(1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HeapTest, GrowthMapsInPlaceAndBadFreesAreRejected) {
  std::unique_ptr<Heap> heap = Attach();
  char* const base = heap->base();
  std::vector<char*> objects;
  for (int i = 0; i < 40; ++i) {  // 40 x 3 MiB: several growths of the file
    absl::StatusOr<void*> p = heap->allocate(3 << 20);
    ASSERT_TRUE(p.ok()) << p.status();
    static_cast<char*>(*p)[(3 << 20) - 1] = static_cast<char>(i);
    objects.push_back(static_cast<char*>(*p));
  }
  EXPECT_EQ(heap->base(), base);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(objects[i][(3 << 20) - 1], static_cast<char>(i));
  int local = 0;
  EXPECT_EQ(heap->deallocate(&local).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> small = heap->allocate(24);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(heap->deallocate(static_cast<char*>(*small) + 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(heap->deallocate(*small).ok());
  EXPECT_EQ(heap->deallocate(*small).code(), absl::StatusCode::kInvalidArgument);  // double
  EXPECT_TRUE(heap->deallocate(objects[0], 3 << 20).ok());
  EXPECT_EQ(heap->deallocate(objects[0], 3 << 20).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> aligned = heap->allocate(100, 64);
  ASSERT_TRUE(aligned.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*aligned) % 64, 0u);
  EXPECT_EQ(heap->allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heap->allocate(8, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HeapTest, ThreadsAllocateAndFreeEachOthersObjects) {
  std::unique_ptr<Heap> heap = Attach();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50000;
  std::vector<std::vector<void*>> made(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<void*> p = heap->allocate(8 + (i % 64) * 8);
        if (!p.ok()) {
          ++failures;
          return;
        }
        made[t].push_back(*p);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  threads.clear();
  // Each thread frees the next thread's objects, concurrently with a sync.
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (void* p : made[(t + 1) % kThreads]) {
        if (!heap->deallocate(p).ok()) ++failures;
      }
    });
  }
  ASSERT_TRUE(heap->sync().ok());
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(heap->sync().ok());
  EXPECT_EQ(Stat().info().live_objects(), 0u);
}

TEST_F(HeapTest, ACrossThreadDoubleFreeIsReportedBySync) {
  std::unique_ptr<Heap> heap = Attach();
  void* object = *heap->allocate(40);
  std::thread other([&] {
    EXPECT_TRUE(heap->deallocate(object).ok());  // queued for the owner
    EXPECT_TRUE(heap->deallocate(object).ok());  // queued too: found at sync
  });
  other.join();
  absl::StatusOr<uint64_t> synced = heap->sync();
  EXPECT_EQ(synced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(synced.status().message().find("another thread"), absl::string_view::npos)
      << synced.status();
  ASSERT_TRUE(heap->sync().ok());  // reported once
  EXPECT_EQ(Stat().info().live_objects(), 0u);
}

TEST_F(HeapTest, TheAllocatorThrowsBadAllocWhenTheHeapIsFull) {
  std::unique_ptr<Heap> heap = Attach(false, 16 << 20);
  using Vector = boost::container::vector<uint64_t, allocator<uint64_t>>;
  Vector vector{allocator<uint64_t>(*heap)};
  EXPECT_THROW(vector.reserve(4 << 20), std::bad_alloc);  // 32 MiB > 16 MiB
  vector.reserve(1 << 10);
  EXPECT_EQ(vector.capacity(), 1u << 10);
}

// A Heap used after detach() refuses with an error naming it (no crash):
// its pools, reserve and mapping were handed back.
TEST_F(HeapTest, CallsAfterDetachFailCleanly) {
  std::unique_ptr<Heap> heap = Attach();
  absl::StatusOr<void*> small = heap->allocate(64);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(heap->detach().ok());
  for (const absl::Status& status :
       {heap->allocate(64).status(), heap->allocate(4 << 20).status(), heap->deallocate(*small),
        heap->sync().status(), heap->Bind("x", *small, 64, "bytes"), heap->detach()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("is detached"), absl::string_view::npos) << status;
  }
}

TEST_F(HeapTest, AReadOnlyHeapRefusesToAllocate) {
  { ASSERT_TRUE(Attach()->construct<int>("i")(3).ok()); }
  std::unique_ptr<Heap> heap = Attach(/*read_only=*/true);
  EXPECT_EQ(heap->allocate(8).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(**heap->find<int>("i"), 3);
  EXPECT_EQ(heap->sync().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace heapd
