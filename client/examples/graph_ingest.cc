// graph_ingest: builds an R-MAT graph in a heap and names it — the first
// job of journey 1. A later program (graph_query) attaches and finds it.
//
//   graph_ingest [--socket=PATH] [--heap=graph] [--name=graph] [--scale=18] [--edges=4194304]
#include <chrono>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"
#include "client/examples/graph.h"
#include "client/examples/rmat.h"
#include "client/heap.h"

ABSL_FLAG(std::string, socket, "", "heapd's socket (default: $HEAPD_SOCKET or heapd's default)");
ABSL_FLAG(std::string, heap, "graph", "heap to attach (created if missing)");
ABSL_FLAG(std::string, name, "graph", "name to bind the graph to");
ABSL_FLAG(int, scale, 18, "2^scale vertices");
ABSL_FLAG(uint64_t, edges, uint64_t{1} << 22, "edges to generate");
ABSL_FLAG(uint64_t, seed, 42, "R-MAT seed");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto client = heapd::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) {
    std::fprintf(stderr, "graph_ingest: %s\n", client.status().ToString().c_str());
    return 1;
  }
  heapd::AttachOptions options;
  options.create_if_missing = true;
  auto heap = (*client)->Attach(absl::GetFlag(FLAGS_heap), options);
  if (!heap.ok()) {
    std::fprintf(stderr, "graph_ingest: %s\n", heap.status().ToString().c_str());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  auto graph =
      (*heap)->construct<heapd::Graph>(absl::GetFlag(FLAGS_name))(heapd::allocator<char>(**heap));
  if (!graph.ok()) {
    std::fprintf(stderr, "graph_ingest: %s\n", graph.status().ToString().c_str());
    return 1;
  }
  heapd::RmatGenerator rmat(absl::GetFlag(FLAGS_scale), absl::GetFlag(FLAGS_seed));
  const uint64_t edges = absl::GetFlag(FLAGS_edges);
  for (uint64_t i = 0; i < edges; ++i) {
    const auto [source, destination] = rmat.Next();
    (*graph)->AddEdge(source, destination);
  }
  (*graph)->edges = edges;
  if (auto epoch = (*heap)->sync(); !epoch.ok()) {
    std::fprintf(stderr, "graph_ingest: %s\n", epoch.status().ToString().c_str());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("ingested %llu edges over %zu vertices into '%s' of heap %s in %.2f s\n",
              static_cast<unsigned long long>((*graph)->edges), (*graph)->map.size(),
              absl::GetFlag(FLAGS_name).c_str(), absl::GetFlag(FLAGS_heap).c_str(), seconds);
  return (*heap)->detach().ok() ? 0 : 1;
}
