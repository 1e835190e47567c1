// B3 over raw pointers (issue 25): the R-MAT ingest of B3 (2^22 edges,
// scale 18) into libstdc++'s std::unordered_map and Boost 1.81's
// boost::unordered_flat_map of std::vector, the same code with
// std::allocator in DRAM and with heapd::raw_allocator in a fixed-address
// heap of a heapd on tmpfs, alternating which runs first in each rep.
// Both start cold: the heap is new, and before the DRAM run glibc gives
// its free memory back (malloc_trim), as a fresh program's would be, so
// each faults its pages in. A second DRAM run right after the first (its
// memory warm in glibc's free lists) is shown too. Prints each rep, then
// medians and heapd / DRAM per container; with --csv, every rep as CSV
// (bench/plot_curves.py draws it). The target: at least 0.9x.
//
//   raw_pointer_bench --heapd=PATH [--reps=7] [--csv=FILE]
#include <malloc.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/heapd_process.h"
#include "boost/unordered/unordered_flat_map.hpp"
#include "client/client_channel.h"
#include "client/examples/rmat.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "heapd/raw_allocator.h"
#include "util/errno_status.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "heapd binary");
ABSL_FLAG(int, reps, 7, "runs of each figure; medians are printed");
ABSL_FLAG(std::vector<std::string>, heapd_flags, {}, "more flags for heapd, comma-separated");
ABSL_FLAG(std::string, csv, "", "also write every rep here as CSV");
ABSL_FLAG(bool, huge_pages, false,
          "heapd's state on a tmpfs of its own mounted huge=within_size (needs root)");

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kScale = 18;
constexpr uint64_t kEdges = uint64_t{1} << 22;
constexpr uint64_t kSeed = 2026;  // B3's

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "raw_pointer_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

// An adjacency list in `Map` (std::unordered_map or
// boost::unordered_flat_map) of std::vector, all allocating through
// `Allocator` (std::allocator<char> or heapd::raw_allocator<char>).
template <template <typename...> class MapTemplate, typename Allocator>
struct AdjacencyList {
  template <typename T>
  using Rebind = typename std::allocator_traits<Allocator>::template rebind_alloc<T>;
  using Edges = std::vector<uint64_t, Rebind<uint64_t>>;
  using Map = MapTemplate<uint64_t, Edges, boost::hash<uint64_t>, std::equal_to<uint64_t>,
                          Rebind<std::pair<const uint64_t, Edges>>>;

  explicit AdjacencyList(const Allocator& allocator) : map(allocator) {}

  void AddEdge(uint64_t source, uint64_t destination) {
    auto it = map.find(source);
    if (it == map.end()) {
      it = map.emplace(source, Edges(Rebind<uint64_t>(map.get_allocator()))).first;
    }
    it->second.push_back(destination);
  }

  Map map;
};

using Edges = std::vector<std::pair<uint64_t, uint64_t>>;

template <typename Graph>
double Ingest(Graph& graph, const Edges& edges) {
  const Clock::time_point start = Clock::now();
  for (const auto& [source, destination] : edges) graph.AddEdge(source, destination);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// With `cold`, after glibc gave its free memory back.
template <template <typename...> class MapTemplate>
double InDram(const Edges& edges, bool cold) {
  if (cold) malloc_trim(0);
  AdjacencyList<MapTemplate, std::allocator<char>> graph{std::allocator<char>()};
  return Ingest(graph, edges);
}

// In a new fixed-address heap; the graph is checked, the heap removed.
template <template <typename...> class MapTemplate>
double InHeap(HeapdProcess& daemon, const Edges& edges) {
  using Graph = AdjacencyList<MapTemplate, raw_allocator<char>>;
  RemoveHeap(daemon.client(), "b3r");
  AttachOptions options;
  options.create_if_missing = true;
  options.fixed_address = true;
  options.max_size = uint64_t{8} << 30;
  absl::StatusOr<std::unique_ptr<Heap>> heap = daemon.client().Attach("b3r", options);
  if (!heap.ok()) Die("attach a fixed-address heap", heap.status());
  absl::StatusOr<Graph*> graph = (*heap)->construct<Graph>("graph")(raw_allocator<char>(**heap));
  if (!graph.ok()) Die("construct", graph.status());
  const double seconds = Ingest(**graph, edges);
  uint64_t stored = 0;
  for (const auto& [vertex, out] : (*graph)->map) stored += out.size();
  if (stored != edges.size()) Die("check", absl::DataLossError("edge count"));
  if (absl::Status s = (*heap)->detach(); !s.ok()) Die("detach", s);
  heap->reset();
  RemoveHeap(daemon.client(), "b3r");
  return seconds;
}

struct Figures {
  std::vector<double> dram, warm_dram, heap;
};

template <template <typename...> class MapTemplate>
void RunOnce(HeapdProcess& daemon, const Edges& edges, bool heap_first, Figures& figures) {
  if (heap_first) figures.heap.push_back(InHeap<MapTemplate>(daemon, edges));
  figures.dram.push_back(InDram<MapTemplate>(edges, /*cold=*/true));
  figures.warm_dram.push_back(InDram<MapTemplate>(edges, /*cold=*/false));
  if (!heap_first) figures.heap.push_back(InHeap<MapTemplate>(daemon, edges));
}

void Report(const char* container, const Figures& figures) {
  const double dram = Median(figures.dram);
  const double warm = Median(figures.warm_dram);
  const double heap = Median(figures.heap);
  std::printf(
      "%-26s DRAM %5.2f Medges/s (warm %5.2f)  fixed-address heap %5.2f Medges/s  "
      "heapd / DRAM %.2fx (/ warm %.2fx)\n",
      container, kEdges / dram / 1e6, kEdges / warm / 1e6, kEdges / heap / 1e6, dram / heap,
      warm / heap);
}

int Main() {
  absl::StatusOr<std::unique_ptr<HeapdProcess>> daemon =
      HeapdProcess::Start(absl::GetFlag(FLAGS_heapd), absl::GetFlag(FLAGS_heapd_flags),
                          absl::GetFlag(FLAGS_huge_pages));
  if (!daemon.ok()) Die("start heapd", daemon.status());
  Edges edges;
  edges.reserve(kEdges);
  RmatGenerator rmat(kScale, kSeed);
  for (uint64_t i = 0; i < kEdges; ++i) edges.push_back(rmat.Next());
  Figures std_map, flat_map;
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int rep = 0; rep < reps; ++rep) {
    const bool heap_first = rep % 2 == 0;
    RunOnce<std::unordered_map>(**daemon, edges, heap_first, std_map);
    RunOnce<boost::unordered_flat_map>(**daemon, edges, heap_first, flat_map);
    std::printf(
        "rep %d (%s first): std::unordered_map %.3f s DRAM (warm %.3f), %.3f s heap; "
        "boost::unordered_flat_map %.3f s DRAM (warm %.3f), %.3f s heap\n",
        rep, heap_first ? "heap" : "DRAM", std_map.dram.back(), std_map.warm_dram.back(),
        std_map.heap.back(), flat_map.dram.back(), flat_map.warm_dram.back(), flat_map.heap.back());
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    FILE* csv = std::fopen(path.c_str(), "w");
    if (csv == nullptr) Die("create " + path, ErrnoStatus(errno, "fopen"));
    std::fprintf(csv, "rep,container,edges,dram_s,warm_dram_s,heap_s\n");
    for (int rep = 0; rep < reps; ++rep) {
      for (const auto& [container, figures] :
           {std::pair<const char*, const Figures*>{"std::unordered_map", &std_map},
            std::pair<const char*, const Figures*>{"boost::unordered_flat_map", &flat_map}}) {
        std::fprintf(csv, "%d,%s,%llu,%.6f,%.6f,%.6f\n", rep, container,
                     static_cast<unsigned long long>(kEdges), figures->dram[rep],
                     figures->warm_dram[rep], figures->heap[rep]);
      }
    }
    if (std::fclose(csv) != 0) Die("write " + path, ErrnoStatus(errno, "fclose"));
  }
  std::printf("== medians of %d (B3 over raw pointers, %llu edges, scale %d)\n", reps,
              static_cast<unsigned long long>(kEdges), kScale);
  Report("std::unordered_map", std_map);
  Report("boost::unordered_flat_map", flat_map);
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Main();
}
