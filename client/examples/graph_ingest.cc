// graph_ingest: builds an R-MAT graph in a heap and names it — the first
// job of journey 1. A later program (graph_query) attaches and finds it.
//
//   graph_ingest [--socket=PATH] [--heap=graph] [--name=graph] [--scale=18] [--edges=4194304]
//
// The graph is built unnamed and bound to its name last: a heap that fills
// up (RESOURCE_EXHAUSTED, reported with exit status 1) leaves no name bound
// to half a graph, and its memory is given back.
#include <chrono>
#include <cstdio>
#include <new>

#include "absl/flags/flag.h"
#include "client/examples/graph.h"
#include "client/examples/rmat.h"
#include "heapd/allocator.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "protocol/version.h"
#include "util/program_flags.h"

ABSL_FLAG(std::string, socket, "", "heapd's socket (default: $HEAPD_SOCKET or heapd's default)");
ABSL_FLAG(std::string, heap, "graph", "heap to attach (created if missing)");
ABSL_FLAG(std::string, name, "graph", "name to bind the graph to");
ABSL_FLAG(std::string, storage, "",
          "storage tier to make the heap on, as heapd's --storage names it (default: heapd's)");
ABSL_FLAG(int, scale, 18, "2^scale vertices");
ABSL_FLAG(uint64_t, edges, uint64_t{1} << 22, "edges to generate");
ABSL_FLAG(uint64_t, seed, 42, "R-MAT seed");

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "graph_ingest: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> positional = heapd::ParseProgramFlags(
      argc, argv,
      "graph_ingest: builds an R-MAT graph in a heap and names it\n"
      "usage: graph_ingest [--socket=PATH] [--heap=graph] [--name=graph] [--scale=18] "
      "[--edges=4194304]",
      heapd::kHeapdVersion);
  if (positional.size() > 1) {
    std::fprintf(stderr, "graph_ingest: takes flags only, not '%s' (see --help)\n", positional[1]);
    return 2;
  }
  auto client = heapd::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Fail(client.status());
  heapd::AttachOptions options;
  options.create_if_missing = true;
  options.storage = absl::GetFlag(FLAGS_storage);
  const std::string heap_name = absl::GetFlag(FLAGS_heap);
  const std::string name = absl::GetFlag(FLAGS_name);
  auto attached = (*client)->Attach(heap_name, options);
  if (!attached.ok()) return Fail(attached.status());
  heapd::Heap& heap = **attached;
  // A taken name is refused before any work, not after it.
  if (absl::Status found = heap.find<heapd::Graph>(name).status();
      found.code() != absl::StatusCode::kNotFound) {
    return Fail(found.ok() ? absl::AlreadyExistsError(
                                 absl::StrCat("heap ", heap_name, " has a graph named '", name,
                                              "' already (heapctl names rm ", heap_name, " ", name,
                                              " removes the name)"))
                           : found);
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<void*> memory = heap.allocate(sizeof(heapd::Graph), alignof(heapd::Graph));
  if (!memory.ok()) return Fail(memory.status());
  auto* graph = new (*memory) heapd::Graph(heapd::allocator<char>(heap));
  // Gives the unnamed graph's memory back (a detach would commit it).
  auto discard = [&] {
    graph->~AdjacencyList();
    (void)heap.deallocate(graph, sizeof(heapd::Graph));
  };
  heapd::RmatGenerator rmat(absl::GetFlag(FLAGS_scale), absl::GetFlag(FLAGS_seed));
  const uint64_t edges = absl::GetFlag(FLAGS_edges);
  uint64_t added = 0;
  try {
    for (; added < edges; ++added) {
      const auto [source, destination] = rmat.Next();
      graph->AddEdge(source, destination);
    }
  } catch (const heapd::allocation_error& e) {
    discard();
    std::fprintf(stderr, "graph_ingest: %s (after %llu of %llu edges); nothing bound to '%s'\n",
                 e.what(), static_cast<unsigned long long>(added),
                 static_cast<unsigned long long>(edges), name.c_str());
    (void)heap.detach();  // the error above is what the caller needs
    return 1;
  }
  graph->edges = edges;
  if (absl::Status bound = heap.bind(name, graph); !bound.ok()) {
    discard();
    return Fail(bound);
  }
  if (auto epoch = heap.sync(); !epoch.ok()) return Fail(epoch.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("ingested %llu edges over %zu vertices into '%s' of heap %s in %.2f s\n",
              static_cast<unsigned long long>(graph->edges), graph->map.size(), name.c_str(),
              heap_name.c_str(), seconds);
  if (absl::Status detached = heap.detach(); !detached.ok()) return Fail(detached);
  return 0;
}
