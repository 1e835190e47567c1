// B1 and B2 of the design brief on the client fast path (the real client,
// heapd::Heap, over a heap on tmpfs in this process: testing/in_process.h),
// each next to the same loop on std::allocator in DRAM, in the same run.
// Run with bench/run.sh.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "heap/heap.h"
#include "heap/test_dir.h"
#include "testing/in_process.h"

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;
using Object64 = std::array<char, 64>;

double NsPer(Clock::duration d, uint64_t n) {
  return std::chrono::duration<double, std::nano>(d).count() / static_cast<double>(n);
}

// Where the heaps go: $HEAPD_BENCH_DIR (e.g. a tmpfs mounted with
// huge=within_size), else /dev/shm, else /tmp.
std::string ScratchParent() {
  if (const char* dir = std::getenv("HEAPD_BENCH_DIR"); dir != nullptr && *dir != '\0') return dir;
  return access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
}

std::unique_ptr<Heap> Attach(PersistentHeap* heap, ClientId id) {
  AttachOptions options;
  options.lease_batch = 16;
  absl::StatusOr<std::unique_ptr<Heap>> session = AttachInProcess(heap, id, options);
  if (!session.ok()) std::abort();
  return *std::move(session);
}

std::unique_ptr<PersistentHeap> NewHeap(const TestDir& dir, uint64_t max_size,
                                        bool grow_ahead = true) {
  HeapConfig config;
  config.max_size = max_size;
  HeapOptions options;
  options.grow_ahead = grow_ahead;  // heapd's default: true
  // For callgrind, which has no userfaultfd: HEAPD_BENCH_UNTRACKED=1.
  if (std::getenv("HEAPD_BENCH_UNTRACKED") != nullptr) options.track_contents = false;
  auto heap = PersistentHeap::Create(dir.Sub("h"), config, options);
  if (!heap.ok()) std::abort();
  return *std::move(heap);
}

// B1: allocate 10,000,000 x 64 B, then free them all. Argument 0: on a new
// heap, so the timing includes growing (fallocate) its data file by 640 MB,
// in the background ahead of demand as heapd does; argument 2: the same
// with every growth on the allocating thread (--grow_ahead=false);
// argument 1: on a heap already grown by an untimed first pass, which
// isolates the allocator's fast path.
constexpr uint64_t kB1Objects = 10'000'000;

void BM_B1_Heapd(benchmark::State& state) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap =
      NewHeap(dir, uint64_t{1} << 30, /*grow_ahead=*/state.range(0) != 2);
  std::vector<void*> objects(kB1Objects);
  if (state.range(0) == 1) {
    std::unique_ptr<Heap> session = Attach(heap.get(), 2);
    for (uint64_t i = 0; i < kB1Objects; ++i) objects[i] = *session->allocate(64);
    for (void* object : objects) {
      if (!session->deallocate(object, 64).ok()) std::abort();
    }
    if (!session->detach().ok()) std::abort();
  }
  for (auto _ : state) {
    std::unique_ptr<Heap> session = Attach(heap.get(), 1);
    const Clock::time_point t0 = Clock::now();
    for (uint64_t i = 0; i < kB1Objects; ++i) objects[i] = *session->allocate(64);
    const Clock::time_point t1 = Clock::now();
    for (uint64_t i = 0; i < kB1Objects; ++i) {
      if (!session->deallocate(objects[i], 64).ok()) std::abort();
    }
    const Clock::time_point t2 = Clock::now();
    state.counters["alloc_ns"] = NsPer(t1 - t0, kB1Objects);
    state.counters["free_ns"] = NsPer(t2 - t1, kB1Objects);
    if (!session->detach().ok()) std::abort();
  }
}

void BM_B1_StdAllocator(benchmark::State& state) {
  std::allocator<Object64> allocator;
  std::vector<Object64*> pointers(kB1Objects);
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    for (uint64_t i = 0; i < kB1Objects; ++i) pointers[i] = allocator.allocate(1);
    benchmark::DoNotOptimize(pointers.data());
    const Clock::time_point t1 = Clock::now();
    for (uint64_t i = 0; i < kB1Objects; ++i) allocator.deallocate(pointers[i], 1);
    const Clock::time_point t2 = Clock::now();
    state.counters["alloc_ns"] = NsPer(t1 - t0, kB1Objects);
    state.counters["free_ns"] = NsPer(t2 - t1, kB1Objects);
  }
}

// B2: allocate 100 x 64 B, free them in random order; 100,000 rounds.
constexpr int kB2Batch = 100;
constexpr int kB2Rounds = 100'000;

std::vector<std::array<uint8_t, kB2Batch>> FreeOrders(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::array<uint8_t, kB2Batch>> orders(64);
  for (auto& order : orders) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
  }
  return orders;
}

// Runs `threads` threads; each calls make_round(t) for its round function
// (allocate kB2Batch objects, free them in the given order) and runs
// kB2Rounds rounds. Reports the mean per-thread ns per pair and the
// aggregate pairs per second.
template <typename MakeRound>
void RunB2(benchmark::State& state, MakeRound&& make_round) {
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    std::vector<double> ns(threads);
    std::vector<std::thread> workers;
    const Clock::time_point t0 = Clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const auto orders = FreeOrders(t);
        auto round = make_round(t);
        const Clock::time_point start = Clock::now();
        for (int r = 0; r < kB2Rounds; ++r) round(orders[r % orders.size()]);
        ns[t] = NsPer(Clock::now() - start, uint64_t{kB2Rounds} * kB2Batch);
      });
    }
    for (std::thread& w : workers) w.join();
    const double wall = NsPer(Clock::now() - t0, uint64_t{kB2Rounds} * kB2Batch * threads);
    state.counters["pair_ns"] = std::accumulate(ns.begin(), ns.end(), 0.0) / threads;
    state.counters["Mpairs_per_s"] = 1e3 / wall;
  }
}

using FreeOrder = std::array<uint8_t, kB2Batch>;

void BM_B2_Heapd(benchmark::State& state) {
  TestDir dir(ScratchParent());
  std::unique_ptr<PersistentHeap> heap = NewHeap(dir, uint64_t{1} << 30);
  RunB2(state, [&](int t) {
    // One session per thread (a process each, as B2 means), detached when
    // the thread's round ends.
    std::shared_ptr<Heap> session = Attach(heap.get(), static_cast<ClientId>(t + 1));
    return [session, live = std::array<void*, kB2Batch>{}](const FreeOrder& order) mutable {
      for (int i = 0; i < kB2Batch; ++i) live[i] = *session->allocate(64);
      for (uint8_t i : order) {
        if (!session->deallocate(live[i], 64).ok()) std::abort();
      }
    };
  });
}

void BM_B2_StdAllocator(benchmark::State& state) {
  RunB2(state, [](int) {
    return [live = std::array<Object64*, kB2Batch>{}](const FreeOrder& order) mutable {
      std::allocator<Object64> allocator;
      for (int i = 0; i < kB2Batch; ++i) live[i] = allocator.allocate(1);
      benchmark::DoNotOptimize(live.data());
      for (uint8_t i : order) allocator.deallocate(live[i], 1);
    };
  });
}

BENCHMARK(BM_B1_Heapd)
    ->Arg(0)
    ->Arg(2)
    ->Arg(1)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_B1_StdAllocator)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_B2_Heapd)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_B2_StdAllocator)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace heapd

BENCHMARK_MAIN();
