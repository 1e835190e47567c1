// B1 through the C API against the C++ client, in the same run, on one
// heapd: 10,000,000 x 64 B allocated, then freed, per API; ns per call,
// medians of --reps runs (the C API within 1.5x of C++).
//
//   c_api_bench --heapd=PATH/heapd [--reps=5] [--objects=10000000]
//
// A C call is heapd_malloc(heap, size): a check of its arguments and the
// 16-byte alignment request, then Heap::allocate (one call into the C++
// client); the thread's last error is touched only on failure.
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/heapd_process.h"
#include "heapd/heap.h"
#include "heapd/heapd.h"

ABSL_FLAG(std::string, heapd, "", "the heapd binary");
ABSL_FLAG(int, reps, 5, "runs of each; the medians are printed");
ABSL_FLAG(uint64_t, objects, 10000000, "objects per run");

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;

double NsPer(Clock::time_point start, uint64_t n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
}

int Run() {
  absl::StatusOr<std::unique_ptr<HeapdProcess>> daemon =
      HeapdProcess::Start(absl::GetFlag(FLAGS_heapd), {});
  if (!daemon.ok()) {
    std::fprintf(stderr, "c_api_bench: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  const uint64_t n = absl::GetFlag(FLAGS_objects);
  heapd_attach_options options;
  heapd_attach_options_init(&options);
  const std::string socket = (*daemon)->socket();
  options.socket = socket.c_str();
  options.create_if_missing = 1;
  options.max_size = uint64_t{8} << 30;
  heapd_heap* c_heap = heapd_attach("b1", &options);
  AttachOptions cxx_options;
  cxx_options.create_if_missing = true;
  absl::StatusOr<std::unique_ptr<Heap>> cxx_heap = (*daemon)->client().Attach("b1", cxx_options);
  if (c_heap == nullptr || !cxx_heap.ok()) {
    std::fprintf(stderr, "c_api_bench: attach: %s\n", heapd_last_error());
    return 1;
  }
  std::vector<void*> objects(n);
  // One untimed pass of each grows the heap, so both measure a grown heap.
  std::vector<double> c_alloc, c_free, cxx_alloc, cxx_free;
  for (int rep = 0; rep <= absl::GetFlag(FLAGS_reps); ++rep) {
    Clock::time_point start = Clock::now();
    for (uint64_t i = 0; i < n; ++i) objects[i] = heapd_malloc(c_heap, 64);
    const double allocate_ns = NsPer(start, n);
    start = Clock::now();
    for (uint64_t i = 0; i < n; ++i) heapd_free(c_heap, objects[i]);
    const double free_ns = NsPer(start, n);
    start = Clock::now();
    for (uint64_t i = 0; i < n; ++i) objects[i] = *(*cxx_heap)->allocate(64, 16);
    const double cxx_allocate_ns = NsPer(start, n);
    start = Clock::now();
    for (uint64_t i = 0; i < n; ++i) (void)(*cxx_heap)->deallocate(objects[i]);
    const double cxx_free_ns = NsPer(start, n);
    if (rep == 0) continue;
    c_alloc.push_back(allocate_ns);
    c_free.push_back(free_ns);
    cxx_alloc.push_back(cxx_allocate_ns);
    cxx_free.push_back(cxx_free_ns);
  }
  std::printf(
      "B1 (%llu x 64 B, grown heap, medians of %d): C API %.1f ns allocate / %.1f free; "
      "C++ %.1f / %.1f; C/C++ %.2fx / %.2fx\n",
      static_cast<unsigned long long>(n), absl::GetFlag(FLAGS_reps), Median(c_alloc),
      Median(c_free), Median(cxx_alloc), Median(cxx_free), Median(c_alloc) / Median(cxx_alloc),
      Median(c_free) / Median(cxx_free));
  (void)(*cxx_heap)->detach();
  return heapd_detach(c_heap) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Run();
}
