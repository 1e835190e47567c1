// B7 of the design brief: the cost of a sync after one allocation in a heap
// with 10 million live objects against one with 10 thousand. The cost of a
// sync must follow what changed, not the heap's size. Through the real
// client over a heap in this process (testing/in_process.h): the client's
// part of a sync and heapd's, without the RPC. Run with bench/run.sh.
#include <unistd.h>

#include <memory>

#include "benchmark/benchmark.h"
#include "heap/heap.h"
#include "heap/test_dir.h"
#include "testing/in_process.h"

namespace heapd {
namespace {

void BM_B7_SyncAfterOneAllocation(benchmark::State& state) {
  const uint64_t live = static_cast<uint64_t>(state.range(0));
  TestDir dir(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  HeapConfig config;
  config.max_size = uint64_t{1} << 30;
  auto heap = PersistentHeap::Create(dir.Sub("h"), config);
  if (!heap.ok()) std::abort();
  AttachOptions options;
  options.lease_batch = 16;
  auto session = AttachInProcess(heap->get(), 1, options);
  if (!session.ok()) std::abort();
  for (uint64_t i = 0; i < live; ++i) {
    if (!(*session)->allocate(64).ok()) std::abort();
  }
  if (!(*session)->sync().ok()) std::abort();
  for (auto _ : state) {
    if (!(*session)->allocate(64).ok()) std::abort();
    if (!(*session)->sync().ok()) std::abort();
  }
  state.counters["live_objects"] = static_cast<double>(live);
}

BENCHMARK(BM_B7_SyncAfterOneAllocation)
    ->Arg(10'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);

}  // namespace
}  // namespace heapd

BENCHMARK_MAIN();
