// The persistent heap core end to end, in one process: create a heap (or
// open the one a previous run left), build a graph in it, bind it to a name,
// sync, close; reopen and find the graph by name, check it, and print what
// was found. Run it twice: the second run attaches and goes.
//
//   heap_demo [HEAP_DIR]     (default /tmp/heapd-demo/graph)
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "heap/heap.h"
#include "heap/heap_session.h"

namespace {

using heapd::HeapSession;
using heapd::PersistentHeap;

// Lives in the heap: offsets, never pointers, so any process can map it.
struct Graph {
  uint64_t vertices;
  uint64_t edge_count;
  uint64_t edges_offset;  // Edge[edge_count]
  uint64_t checksum;
};
struct Edge {
  uint64_t from;
  uint64_t to;
};

constexpr char kName[] = "demo/graph";
constexpr char kType[] = "heapd_demo::Graph/v1";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "heap_demo: %s\n", status.ToString().c_str());
  return 1;
}

absl::Status Build(PersistentHeap* heap) {
  auto session = HeapSession::Start(heap, 1);
  if (!session.ok()) return session.status();
  constexpr uint64_t kEdges = 1 << 20;
  absl::StatusOr<uint64_t> edges = (*session)->Allocate(kEdges * sizeof(Edge));
  if (!edges.ok()) return edges.status();
  absl::StatusOr<uint64_t> graph_offset = (*session)->Allocate(sizeof(Graph));
  if (!graph_offset.ok()) return graph_offset.status();
  std::mt19937_64 rng(18);
  Edge* e = (*session)->At<Edge>(*edges);
  uint64_t checksum = 0;
  for (uint64_t i = 0; i < kEdges; ++i) {
    e[i] = Edge{rng() % (1 << 18), rng() % (1 << 18)};
    checksum += e[i].from * 31 + e[i].to;
  }
  *(*session)->At<Graph>(*graph_offset) = Graph{1 << 18, kEdges, *edges, checksum};
  if (absl::Status s =
          heap->Bind(1, heapd::NameEntry{kName, *graph_offset, sizeof(Graph), kType, getuid(), 0});
      !s.ok()) {
    return s;
  }
  if (absl::StatusOr<uint64_t> epoch = (*session)->Sync(); !epoch.ok()) return epoch.status();
  return (*session)->Detach();
}

absl::Status Check(PersistentHeap* heap) {
  absl::StatusOr<heapd::NameEntry> entry = heap->Lookup(kName);
  if (!entry.ok()) return entry.status();
  if (entry->type_name != kType) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", kName, "' has type ", entry->type_name, ", not ", kType));
  }
  auto session = HeapSession::Start(heap, 2);
  if (!session.ok()) return session.status();
  const Graph* graph = (*session)->At<Graph>(entry->offset);
  const Edge* e = (*session)->At<Edge>(graph->edges_offset);
  uint64_t checksum = 0;
  for (uint64_t i = 0; i < graph->edge_count; ++i) checksum += e[i].from * 31 + e[i].to;
  if (checksum != graph->checksum) {
    return absl::DataLossError("graph checksum mismatch");
  }
  std::printf(
      "found '%s' at offset %lu: %lu vertices, %lu edges, checksum ok (epoch %lu)\n", kName,
      static_cast<unsigned long>(entry->offset), static_cast<unsigned long>(graph->vertices),
      static_cast<unsigned long>(graph->edge_count), static_cast<unsigned long>(heap->epoch()));
  return (*session)->Detach();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/heapd-demo/graph";
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path(), ignored);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    heapd::HeapConfig config;
    config.max_size = uint64_t{1} << 30;
    config.owner_uid = getuid();
    config.owner_gid = getgid();
    auto heap = PersistentHeap::Create(dir, config);
    if (!heap.ok()) return Fail(heap.status());
    std::printf("created heap %s; building a graph in it\n", dir.c_str());
    if (absl::Status s = Build(heap->get()); !s.ok()) return Fail(s);
  } else {
    std::printf("heap %s exists: attaching without re-ingesting\n", dir.c_str());
  }
  // Reopen as a later job would.
  auto heap = PersistentHeap::Open(dir);
  if (!heap.ok()) return Fail(heap.status());
  if (absl::Status s = Check(heap->get()); !s.ok()) return Fail(s);
  const heapd::HeapStats stats = (*heap)->Stats();
  std::printf("heap: %s backing, %lu of %lu bytes reserved, %lu live objects, %zu names\n",
              heapd::BackingKindName(stats.backing),
              static_cast<unsigned long>(stats.capacity_bytes),
              static_cast<unsigned long>(stats.max_size),
              static_cast<unsigned long>(stats.directory.live_objects), stats.names);
  return 0;
}
