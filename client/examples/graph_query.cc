// graph_query: attaches a heap read-only, finds the graph graph_ingest
// built, and answers a query on it without re-ingesting anything: the
// degree distribution's top and a vertex's 2-hop neighbourhood.
//
//   graph_query [--socket=PATH] [--heap=graph] [--name=graph] [--vertex=0]
//               [--snapshot=NAME [--snapshot_dir=DIR]]
#include <chrono>
#include <cstdio>
#include <unordered_set>

#include "absl/flags/flag.h"
#include "client/examples/graph.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "protocol/version.h"
#include "util/program_flags.h"

ABSL_FLAG(std::string, socket, "", "heapd's socket (default: $HEAPD_SOCKET or heapd's default)");
ABSL_FLAG(std::string, heap, "graph", "heap to attach");
ABSL_FLAG(std::string, name, "graph", "name of the graph");
ABSL_FLAG(uint64_t, vertex, 0, "vertex whose 2-hop neighbourhood to count");
ABSL_FLAG(std::string, snapshot, "", "query this snapshot in place instead of the heap");
ABSL_FLAG(std::string, snapshot_dir, "", "where --snapshot is (default: heapd's directory)");

int main(int argc, char** argv) {
  const std::vector<char*> positional = heapd::ParseProgramFlags(
      argc, argv,
      "graph_query: finds the graph graph_ingest built and queries it, read-only\n"
      "usage: graph_query [--socket=PATH] [--heap=graph] [--name=graph] [--vertex=0]\n"
      "                   [--snapshot=NAME [--snapshot_dir=DIR]]",
      heapd::kHeapdVersion);
  if (positional.size() > 1) {
    std::fprintf(stderr, "graph_query: takes flags only, not '%s' (see --help)\n", positional[1]);
    return 2;
  }
  if (!absl::GetFlag(FLAGS_snapshot_dir).empty() && absl::GetFlag(FLAGS_snapshot).empty()) {
    std::fprintf(stderr,
                 "graph_query: --snapshot_dir says where --snapshot is; name the "
                 "snapshot with --snapshot=NAME\n");
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  auto client = heapd::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) {
    std::fprintf(stderr, "graph_query: %s\n", client.status().ToString().c_str());
    return 1;
  }
  heapd::AttachOptions options;
  options.read_only = true;
  options.prefetch_names = {absl::GetFlag(FLAGS_name)};
  options.snapshot = absl::GetFlag(FLAGS_snapshot);
  options.snapshot_dir = absl::GetFlag(FLAGS_snapshot_dir);
  auto heap = (*client)->Attach(absl::GetFlag(FLAGS_heap), options);
  if (!heap.ok()) {
    std::fprintf(stderr, "graph_query: %s\n", heap.status().ToString().c_str());
    return 1;
  }
  auto graph = (*heap)->find<heapd::Graph>(absl::GetFlag(FLAGS_name));
  if (!graph.ok()) {
    std::fprintf(stderr, "graph_query: %s\n", graph.status().ToString().c_str());
    return 1;
  }
  const double attach_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const heapd::Graph& g = **graph;
  uint64_t edges = 0;
  uint64_t max_degree = 0;
  uint64_t max_vertex = 0;
  for (const auto& [vertex, neighbours] : g.map) {
    edges += neighbours.size();
    if (neighbours.size() > max_degree) {
      max_degree = neighbours.size();
      max_vertex = vertex;
    }
  }
  std::unordered_set<uint64_t> two_hop;
  const uint64_t root = absl::GetFlag(FLAGS_vertex);
  if (auto it = g.map.find(root); it != g.map.end()) {
    for (uint64_t next : it->second) {
      two_hop.insert(next);
      if (auto far = g.map.find(next); far != g.map.end()) {
        two_hop.insert(far->second.begin(), far->second.end());
      }
    }
  }
  std::printf(
      "attach+find %.2f ms; %zu vertices, %llu edges (recorded %llu); "
      "max out-degree %llu at vertex %llu; vertex %llu reaches %zu vertices in 2 hops\n",
      attach_ms, g.map.size(), static_cast<unsigned long long>(edges),
      static_cast<unsigned long long>(g.edges), static_cast<unsigned long long>(max_degree),
      static_cast<unsigned long long>(max_vertex), static_cast<unsigned long long>(root),
      two_hop.size());
  if (edges != g.edges) {
    std::fprintf(stderr,
                 "graph_query: graph '%s' holds %llu edges but records %llu: its ingest did not "
                 "finish\n",
                 absl::GetFlag(FLAGS_name).c_str(), static_cast<unsigned long long>(edges),
                 static_cast<unsigned long long>(g.edges));
    return 1;
  }
  return 0;
}
