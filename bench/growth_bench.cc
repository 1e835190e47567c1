// What following a pointer into growth costs (issue 24's growth-handler
// decision). A heap grows by whole 2 MiB chunks; a process that did not
// grow it itself meets the new chunks beyond what it mapped. Three ways,
// over the same tmpfs file, in one run:
//   handler   today's: the reservation beyond the mapped part is PROT_NONE;
//             the first touch of a new chunk faults, the SIGSEGV handler
//             (client/growth_fault_handler) fstat()s the file and maps it
//             up to its size, and the access is retried
//   explicit  the process maps the growth itself before touching it
//             (MapHeapGrowth, as MapUpTo does after a lease or sync)
//   whole     the alternative: the file is a sparse file of the heap's
//             maximum size, mapped whole once; a first touch is a page
//             fault only
// Each round grows the file by one chunk (as another process would) and
// times the first read of it, then reads the rest of its pages. Medians of
// `--rounds` chunks, microseconds.
//
//   bazel run -c opt //bench:growth_bench -- --rounds=256
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "allocator/size_class.h"
#include "client/growth_fault_handler.h"
#include "heap/heap_mapping.h"

namespace heapd {
namespace {

constexpr uint64_t kPage = 4096;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double MicrosecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// Reads one byte of each page of [at, at + length); their sum keeps the
// reads.
uint64_t TouchPages(const volatile char* at, uint64_t length) {
  uint64_t sum = 0;
  for (uint64_t offset = 0; offset < length; offset += kPage) sum += at[offset];
  return sum;
}

struct Times {
  std::vector<double> first;  // first read of a new chunk
  std::vector<double> rest;   // the chunk's other pages
};

enum class Way { kHandler, kExplicit, kWhole };

Times Measure(Way way, int rounds, uint64_t* sink) {
  const std::string path = "/dev/shm/heapd-growth-bench-" + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror("open");
    std::exit(1);
  }
  unlink(path.c_str());
  const uint64_t max_size = (static_cast<uint64_t>(rounds) + 1) * kChunkSize;
  const uint64_t first_size = way == Way::kWhole ? max_size : kChunkSize;
  if (ftruncate(fd, static_cast<off_t>(first_size)) != 0) std::exit(1);
  auto mapping = HeapMapping::Map(fd, max_size, first_size, /*writable=*/true);
  if (!mapping.ok()) {
    std::fprintf(stderr, "%s\n", mapping.status().ToString().c_str());
    std::exit(1);
  }
  std::atomic<uint64_t> mapped{first_size};
  const GrowingHeap growing{(*mapping)->base(), max_size, fd, true, false, &mapped};
  const int slot = way == Way::kHandler ? RegisterHeapForGrowthFaults(growing) : -1;
  Times times;
  for (int round = 1; round <= rounds; ++round) {
    const uint64_t begin = static_cast<uint64_t>(round) * kChunkSize;
    if (way != Way::kWhole &&
        ftruncate(fd, static_cast<off_t>(begin + kChunkSize)) != 0) {  // another process's growth
      std::exit(1);
    }
    const volatile char* chunk = (*mapping)->base() + begin;
    const auto start = std::chrono::steady_clock::now();
    if (way == Way::kExplicit && MapHeapGrowth(growing, -1, begin + kChunkSize) != 0) std::exit(1);
    *sink += chunk[0];
    times.first.push_back(MicrosecondsSince(start));
    const auto rest = std::chrono::steady_clock::now();
    *sink += TouchPages(chunk + kPage, kChunkSize - kPage);
    times.rest.push_back(MicrosecondsSince(rest));
  }
  if (slot >= 0) UnregisterHeapForGrowthFaults(slot);
  mapping->reset();
  close(fd);
  return times;
}

int Main(int argc, char** argv) {
  int rounds = 256;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) rounds = std::max(3, std::atoi(argv[i] + 9));
  }
  uint64_t sink = 0;
  std::printf("%-9s %22s %26s\n", "way", "first read of a chunk", "its other 511 pages");
  for (const auto& [way, name] :
       {std::pair{Way::kHandler, "handler"}, std::pair{Way::kExplicit, "explicit"},
        std::pair{Way::kWhole, "whole"}}) {
    const Times times = Measure(way, rounds, &sink);
    std::printf("%-9s %19.2f us %23.1f us\n", name, Median(times.first), Median(times.rest));
  }
  return sink == 1 ? 1 : 0;  // never: the reads of zero pages sum to 0
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) { return heapd::Main(argc, argv); }
