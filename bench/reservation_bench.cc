// B13 of issue 25: memory that follows the data. Runs each workload in a
// heap of its own on one heapd (tmpfs, where reserved space is the
// node's memory), and after its allocation phase and a sync compares the
// heap's reserved bytes (its data file, capacity_bytes) with its allocated
// bytes. The target: reserved at most 2 x allocated + 32 MiB. A heap's
// reservation never shrinks, so the figure after the allocation phase is
// its peak. Also checks that the scale-12 quickstart graph fits a 32 MiB
// heap. Prints a table and, with --csv, writes it as CSV.
//
//   reservation_bench --heapd=PATH [--csv=FILE] [--max_scale=20]
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/heapd_process.h"
#include "client/client_channel.h"
#include "client/examples/graph.h"
#include "client/examples/rmat.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "util/errno_status.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "heapd binary");
ABSL_FLAG(std::string, csv, "", "also write the table here as CSV");
ABSL_FLAG(int, max_scale, 20, "largest quickstart graph scale (12 to this, by 2)");

namespace heapd {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "reservation_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

struct Row {
  std::string workload;
  uint64_t max_size = 0;
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  std::string error;  // the workload failed (a full heap): why
};

std::unique_ptr<Heap> AttachNew(HeapdProcess& daemon, const std::string& name, uint64_t max_size) {
  AttachOptions options;
  options.create_if_missing = true;
  options.max_size = max_size;
  absl::StatusOr<std::unique_ptr<Heap>> heap = daemon.client().Attach(name, options);
  if (!heap.ok()) Die(absl::StrCat("attach ", name), heap.status());
  return *std::move(heap);
}

// Runs `work` in a new heap `name`, syncs and reads the heap's figures.
// `work` returns an error when the heap is full.
Row Measure(HeapdProcess& daemon, const std::string& name, uint64_t max_size,
            const std::function<absl::Status(Heap&)>& work) {
  Row row;
  row.workload = name;
  row.max_size = max_size;
  std::unique_ptr<Heap> heap = AttachNew(daemon, name, max_size);
  if (absl::Status s = work(*heap); !s.ok()) row.error = std::string(s.message());
  if (absl::StatusOr<uint64_t> epoch = heap->sync(); !epoch.ok())
    Die("sync " + name, epoch.status());
  absl::StatusOr<v1::HeapStats> stats = StatHeap(daemon.client(), name);
  if (!stats.ok()) Die("stat " + name, stats.status());
  row.max_size = stats->info().max_size();
  row.allocated = stats->info().allocated_bytes();
  row.reserved = stats->info().capacity_bytes();
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach " + name, s);
  return row;
}

// The quickstart graph (graph_ingest): 16 edges a vertex.
absl::Status IngestGraph(Heap& heap, int scale) {
  absl::StatusOr<void*> memory = heap.allocate(sizeof(Graph), alignof(Graph));
  if (!memory.ok()) return memory.status();
  auto* graph = new (*memory) Graph(allocator<char>(heap));
  RmatGenerator rmat(scale, 42);
  const uint64_t edges = uint64_t{16} << scale;
  try {
    for (uint64_t i = 0; i < edges; ++i) {
      const auto [source, destination] = rmat.Next();
      graph->AddEdge(source, destination);
    }
  } catch (const allocation_error& e) {
    return absl::ResourceExhaustedError(e.what());
  }
  graph->edges = edges;
  return heap.bind("graph", graph);
}

// B1's allocation phase: 10,000,000 objects of 64 bytes.
absl::Status SmallObjects(Heap& heap) {
  for (int i = 0; i < 10'000'000; ++i) {
    if (absl::StatusOr<void*> p = heap.allocate(64); !p.ok()) return p.status();
  }
  return absl::OkStatus();
}

// B11's allocation phase: `count` objects of `size` bytes.
absl::Status LargeObjects(Heap& heap, uint64_t size, int count) {
  for (int i = 0; i < count; ++i) {
    if (absl::StatusOr<void*> p = heap.allocate(size); !p.ok()) return p.status();
  }
  return absl::OkStatus();
}

std::string Mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(bytes) / kMiB);
  return text;
}

int Main() {
  auto daemon = HeapdProcess::Start(absl::GetFlag(FLAGS_heapd), {});
  if (!daemon.ok()) Die("start heapd", daemon.status());
  HeapdProcess& d = **daemon;
  constexpr uint64_t kDefaultMax = 0;  // heapd's default maximum size
  std::vector<Row> rows;
  rows.push_back(Measure(d, "quickstart-12-in-32MiB", 32 * kMiB,
                         [](Heap& heap) { return IngestGraph(heap, 12); }));
  for (int scale = 12; scale <= absl::GetFlag(FLAGS_max_scale); scale += 2) {
    rows.push_back(Measure(d, absl::StrCat("quickstart-", scale), kDefaultMax,
                           [scale](Heap& heap) { return IngestGraph(heap, scale); }));
  }
  rows.push_back(Measure(d, "B1-10M-x-64B", kDefaultMax, SmallObjects));
  rows.push_back(Measure(d, "B11-100-x-1.5MiB", kDefaultMax,
                         [](Heap& heap) { return LargeObjects(heap, 3 * kMiB / 2, 100); }));
  rows.push_back(Measure(d, "B11-100-x-16MiB", kDefaultMax,
                         [](Heap& heap) { return LargeObjects(heap, 16 * kMiB, 100); }));

  std::printf("%-24s %10s %14s %13s %13s %7s  %s\n", "workload", "max MiB", "allocated MiB",
              "reserved MiB", "bound MiB", "ratio", "within 2x + 32 MiB");
  std::FILE* csv = nullptr;
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    csv = std::fopen(path.c_str(), "w");
    if (csv == nullptr) Die("write the CSV", ErrnoStatus(errno, "create " + path));
    std::fprintf(csv, "workload,max_size,allocated_bytes,reserved_bytes,bound_bytes,error\n");
  }
  for (const Row& row : rows) {
    const uint64_t bound = 2 * row.allocated + 32 * kMiB;
    const std::string verdict = !row.error.empty()      ? "failed: " + row.error
                                : row.reserved <= bound ? "yes"
                                                        : "no";
    char ratio[32] = "-";
    if (row.error.empty() && row.allocated != 0) {
      std::snprintf(ratio, sizeof(ratio), "%.2f",
                    static_cast<double>(row.reserved) / row.allocated);
    }
    std::printf("%-24s %10s %14s %13s %13s %7s  %s\n", row.workload.c_str(),
                Mib(row.max_size).c_str(), Mib(row.allocated).c_str(), Mib(row.reserved).c_str(),
                Mib(bound).c_str(), ratio, verdict.c_str());
    if (csv != nullptr) {
      std::fprintf(csv, "%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",\"%s\"\n",
                   row.workload.c_str(), row.max_size, row.allocated, row.reserved, bound,
                   row.error.c_str());
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Main();
}
