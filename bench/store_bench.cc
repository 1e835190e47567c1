// Benchmarks B9a, B9b and restores of snapshot stores, through
// real heapds (on /dev/shm) and heapd's gRPC API, each next to full-copy
// snapshots (CreateSnapshot into a directory) taken of the same heap at the
// same points in the same run. Stores and full copies go to one directory
// on --dir's file system (standing for the parallel file system).
//
//   store_bench --heapd=PATH [--dir=/tmp] [--only=b9a,b9c,b9b,restore]
//               [--b9b_values=10000000] [--block_bytes=N] [--zstd_level=N]
//               [--deltas=false]
//
//   B9a: the B3 graph (2^22 R-MAT edges, scale 18) ingested in 16
//        increments of 2^18 edges, a snapshot after each; the first
//        version (into the empty store) is also shown on its own.
//   B9c: a small change: a scale-16 graph (2^20 edges) as the first
//        version, then 1,000 edges as a new named graph: what the second
//        version adds to the store.
//   B9b: 10^7 64-bit integers inserted into a vector and into a map
//        (boost::container::map), a snapshot every 10^6; random, then
//        sequential integers.
//   restore: the last B9a version restored onto a heapd holding none of
//        its blocks, and onto one that restored the previous version;
//        the last full copy restored, for comparison.
// Prints, per workload: total bytes stored (allocated on disk) and total
// snapshot time for the store and for the full copies, and their ratios.
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/heapd_process.h"
#include "boost/container/map.hpp"
#include "boost/container/vector.hpp"
#include "client/client_channel.h"
#include "client/examples/graph.h"
#include "client/examples/rmat.h"
#include "heapd/allocator.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "the heapd binary");
ABSL_FLAG(std::string, dir, "/tmp", "where stores and full copies go");
ABSL_FLAG(std::string, only, "b9a,b9c,b9b,restore", "which benchmarks");
ABSL_FLAG(uint64_t, b9b_values, 10000000, "B9b: integers inserted into each container");
ABSL_FLAG(uint32_t, block_bytes, 0, "the stores' block size (0: heapd's default)");
ABSL_FLAG(int, zstd_level, 0, "the stores' zstd level (0: heapd's default)");
ABSL_FLAG(bool, deltas, true, "stores keep changed blocks as deltas (heapd --store_deltas)");
ABSL_FLAG(int, reps, 3, "runs of everything; medians are printed at the end");

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Thrown by Die and caught in main, so that the heapds started here are
// stopped and their directories removed on the way out.
struct Failed {};

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "store_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  throw Failed();
}
template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(what, value.status());
  return *std::move(value);
}

// Bytes allocated on disk under `path`.
uint64_t DiskBytes(const std::string& path) {
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    struct stat st;
    if (lstat(entry.path().c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

// Every run's figures by name, for the medians at the end.
std::map<std::string, std::vector<double>>& Figures() {
  static auto* figures = new std::map<std::string, std::vector<double>>;
  return *figures;
}
void Record(const std::string& name, double value) { Figures()[name].push_back(value); }

// Snapshots of one heap into a store and as full copies, side by side.
struct Snapshots {
  std::string store, copies;
  double store_seconds = 0, copy_seconds = 0;
  double daemon_seconds = 0;  // heapd's own time for the store's creates
  double first_store_seconds = 0, first_copy_seconds = 0;  // the first version's
  uint64_t logical = 0, hashed = 0;
  int taken = 0;

  Snapshots(const std::string& base, const std::string& name)
      : store(base + "/" + name + "-store"), copies(base + "/" + name + "-copies") {
    std::filesystem::create_directories(store);
    std::filesystem::create_directories(copies);
  }

  void Take(Client& client, const std::string& heap) {
    const std::string name = absl::StrCat("v", ++taken);
    // Alternating which goes first: page cache and memory state even out.
    for (int order = 0; order < 2; ++order) {
      const bool to_store = (order == 0) == (taken % 2 == 0);
      v1::CreateSnapshotRequest request;
      request.set_heap(heap);
      request.set_name(name);
      (to_store ? request.mutable_store_dir() : request.mutable_target_dir())
          ->assign(to_store ? store : copies);
      v1::SnapshotManifest manifest;
      grpc::ClientContext context;
      const Clock::time_point t0 = Clock::now();
      const grpc::Status status = StubOf(client).CreateSnapshot(&context, request, &manifest);
      const double took = Seconds(Clock::now() - t0);
      if (!status.ok()) Die("snapshot " + name, absl::InternalError(status.error_message()));
      if (taken == 1) (to_store ? first_store_seconds : first_copy_seconds) = took;
      if (to_store) {
        store_seconds += took;
        daemon_seconds += manifest.store().duration_us() / 1e6;
        logical += manifest.store().logical_bytes();
        hashed += manifest.store().hashed_bytes();
      } else {
        copy_seconds += took;
      }
    }
  }

  void Print(const std::string& what) const {
    const double stored = static_cast<double>(DiskBytes(store));
    const double copied = static_cast<double>(DiskBytes(copies));
    Record(what + ": store MiB on disk", stored / 1048576.0);
    Record(what + ": full copies MiB on disk", copied / 1048576.0);
    Record(what + ": store s", store_seconds);
    Record(what + ": store s (heapd)", daemon_seconds);
    Record(what + ": full copies s", copy_seconds);
    Record(what + ": full copies / store bytes", copied / stored);
    Record(what + ": store / full copies time", store_seconds / copy_seconds);
    Record(what + ": first version, store / full copy time",
           first_store_seconds / first_copy_seconds);
    std::printf("%s: %d snapshots of %.1f MiB logical in all (%.1f MiB hashed)\n", what.c_str(),
                taken, logical / 1048576.0, hashed / 1048576.0);
    std::printf("  store:       %10.1f MiB on disk  %8.3f s (heapd %.3f s)\n", stored / 1048576.0,
                store_seconds, daemon_seconds);
    std::printf("  full copies: %10.1f MiB on disk  %8.3f s\n", copied / 1048576.0, copy_seconds);
    std::printf("  store / full copies: %.4f of the bytes (%.1fx less), %.2f of the time\n",
                stored / copied, copied / stored, store_seconds / copy_seconds);
    std::printf("  first version into the empty store: %.3f s, its full copy %.3f s (%.2f)\n",
                first_store_seconds, first_copy_seconds, first_store_seconds / first_copy_seconds);
  }
};

std::unique_ptr<Heap> NewHeap(Client& client, const std::string& name) {
  AttachOptions create;
  create.create_if_missing = true;
  create.max_size = uint64_t{16} << 30;
  return Check(client.Attach(name, create), "attach " + name);
}

// Detaches `heap` (a snapshot waits for writers to sync after it begins,
// so the writer steps aside) and attaches again.
void Pause(Client& client, std::unique_ptr<Heap>& heap, const std::string& name,
           const std::function<void()>& between) {
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
  heap.reset();
  between();
  heap = Check(client.Attach(name, AttachOptions()), "attach " + name);
}

// B9a, returning its snapshots (the restore benchmark reads them).
Snapshots RunB9a(HeapdProcess& daemon, const std::string& base) {
  Client& client = daemon.client();
  Snapshots snapshots(base, "b9a");
  std::unique_ptr<Heap> heap = NewHeap(client, "b9a");
  Check(heap->construct<Graph>("graph")(allocator<char>(*heap)), "construct");
  RmatGenerator rmat(18, 2026);
  for (int step = 0; step < 16; ++step) {
    Graph* graph = Check(heap->find<Graph>("graph"), "find");
    for (int i = 0; i < (1 << 18); ++i) {
      const auto [source, destination] = rmat.Next();
      graph->AddEdge(source, destination);
    }
    graph->edges += 1 << 18;
    Pause(client, heap, "b9a", [&] { snapshots.Take(client, "b9a"); });
  }
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
  snapshots.Print("B9a (B3 graph, 16 increments of 2^18 edges)");
  return snapshots;
}

// B9c: a small change. A scale-16 graph (2^20 edges) as the first
// version, then 1,000 edges more as a new named graph: what the second
// version adds to the store, against the store's bytes.
void RunB9c(HeapdProcess& daemon, const std::string& base) {
  Client& client = daemon.client();
  Snapshots snapshots(base, "b9c");
  std::unique_ptr<Heap> heap = NewHeap(client, "b9c");
  auto ingest = [&](const std::string& name, int scale, uint64_t edges) {
    Graph* graph = Check(heap->construct<Graph>(name)(allocator<char>(*heap)), "construct");
    RmatGenerator rmat(scale, 2026);
    for (uint64_t i = 0; i < edges; ++i) {
      const auto [source, destination] = rmat.Next();
      graph->AddEdge(source, destination);
    }
    graph->edges = edges;
  };
  ingest("graph", 16, uint64_t{1} << 20);
  Pause(client, heap, "b9c", [&] { snapshots.Take(client, "b9c"); });
  const double first = static_cast<double>(DiskBytes(snapshots.store));
  ingest("more", 16, 1000);
  Pause(client, heap, "b9c", [&] { snapshots.Take(client, "b9c"); });
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
  const double both = static_cast<double>(DiskBytes(snapshots.store));
  Record("B9c: first version MiB", first / 1048576.0);
  Record("B9c: second version adds MiB", (both - first) / 1048576.0);
  Record("B9c: second version adds, % of the store", 100 * (both - first) / both);
  std::printf(
      "B9c (scale-16 graph, then 1,000 edges as a new graph): first version %.2f MiB, "
      "the second adds %.3f MiB (%.1f%% of the store)\n",
      first / 1048576.0, (both - first) / 1048576.0, 100 * (both - first) / both);
}

void RunB9b(HeapdProcess& daemon, const std::string& base, bool sequential) {
  using Vector = boost::container::vector<uint64_t, allocator<uint64_t>>;
  using Map = boost::container::map<uint64_t, uint64_t, std::less<uint64_t>,
                                    allocator<std::pair<const uint64_t, uint64_t>>>;
  Client& client = daemon.client();
  const std::string name = sequential ? "b9b-seq" : "b9b-rand";
  Snapshots snapshots(base, name);
  std::unique_ptr<Heap> heap = NewHeap(client, name);
  Vector* vector = Check(heap->construct<Vector>("vector")(allocator<uint64_t>(*heap)), "vector");
  Map* map =
      Check(heap->construct<Map>("map")(std::less<uint64_t>(),
                                        allocator<std::pair<const uint64_t, uint64_t>>(*heap)),
            "map");
  std::mt19937_64 random(2026);
  const uint64_t values = absl::GetFlag(FLAGS_b9b_values);
  const uint64_t every = std::max<uint64_t>(1, values / 10);
  for (uint64_t i = 0; i < values; ++i) {
    const uint64_t value = sequential ? i : random();
    vector->push_back(value);
    map->emplace(value, i);
    if ((i + 1) % every == 0) {
      Pause(client, heap, name, [&] { snapshots.Take(client, name); });
      vector = Check(heap->find<Vector>("vector"), "find");
      map = Check(heap->find<Map>("map"), "find");
    }
  }
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
  snapshots.Print(absl::StrCat("B9b (", values, " ", sequential ? "sequential" : "random",
                               " integers into a vector and a map)"));
  v1::RemoveHeapRequest remove;
  remove.set_heap(name);
  v1::RemoveHeapResponse removed;
  grpc::ClientContext context;
  (void)StubOf(client).RemoveHeap(&context, remove, &removed);
}

// Restores version `name` of `snapshots` (store, or the full copy) as
// heap `as` on `daemon`; seconds.
double Restore(HeapdProcess& daemon, const Snapshots& snapshots, const std::string& name,
               bool from_store, const std::string& as) {
  v1::RestoreSnapshotRequest request;
  request.set_name(name);
  request.set_heap(as);
  (from_store ? request.mutable_store_dir() : request.mutable_target_dir())
      ->assign(from_store ? snapshots.store : snapshots.copies);
  v1::HeapInfo info;
  grpc::ClientContext context;
  const Clock::time_point t0 = Clock::now();
  const grpc::Status status = StubOf(daemon.client()).RestoreSnapshot(&context, request, &info);
  if (!status.ok()) Die("restore " + name, absl::InternalError(status.error_message()));
  const double took = Seconds(Clock::now() - t0);
  // The graph is there, whole.
  AttachOptions read_only;
  read_only.read_only = true;
  std::unique_ptr<Heap> heap = Check(daemon.client().Attach(as, read_only), "attach " + as);
  Graph* graph = Check(heap->find<Graph>("graph"), "find the restored graph");
  const uint64_t versions = std::stoull(name.substr(1));
  if (graph->edges != versions << 18) Die("restore", absl::DataLossError("edge count"));
  return took;
}

void RunRestores(const std::string& heapd, const Snapshots& b9a) {
  std::vector<std::string> flags;
  std::unique_ptr<HeapdProcess> empty = Check(HeapdProcess::Start(heapd, flags), "start heapd");
  std::unique_ptr<HeapdProcess> warm = Check(HeapdProcess::Start(heapd, flags), "start heapd");
  const std::string last = absl::StrCat("v", b9a.taken);
  const std::string previous = absl::StrCat("v", b9a.taken - 1);
  const double copy = Restore(*empty, b9a, last, /*from_store=*/false, "copy");
  const double cold = Restore(*empty, b9a, last, /*from_store=*/true, "cold");
  // A node that restored the previous version holds most blocks already.
  (void)Restore(*warm, b9a, previous, true, "previous");
  const double warmed = Restore(*warm, b9a, last, true, "warm");
  Record("restore: full copy s", copy);
  Record("restore: store, node holding none of its blocks s", cold);
  Record("restore: store, node holding the previous version s", warmed);
  std::printf("restore of the last B9a version (%s):\n", last.c_str());
  std::printf("  full copy:                                 %8.3f s\n", copy);
  std::printf("  store, node holding none of its blocks:    %8.3f s\n", cold);
  std::printf("  store, node holding the previous version:  %8.3f s\n", warmed);
}

}  // namespace
}  // namespace heapd

int Run() {
  using heapd::Check;
  const std::string heapd_binary = absl::GetFlag(FLAGS_heapd);
  std::string base = absl::GetFlag(FLAGS_dir) + "/heapd-b9-XXXXXX";
  if (mkdtemp(base.data()) == nullptr) heapd::Die("mkdtemp", absl::InternalError(base));
  absl::Cleanup remove_base = [&base] { std::filesystem::remove_all(base); };
  std::vector<std::string> flags;
  if (const uint32_t block = absl::GetFlag(FLAGS_block_bytes); block != 0) {
    flags.push_back(absl::StrCat("--store_block_bytes=", block));
  }
  if (!absl::GetFlag(FLAGS_deltas)) flags.push_back("--store_deltas=false");
  if (const int level = absl::GetFlag(FLAGS_zstd_level); level != 0) {
    flags.push_back(absl::StrCat("--store_zstd_level=", level));
  }
  const std::string only = absl::GetFlag(FLAGS_only);
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int rep = 0; rep < reps; ++rep) {
    std::printf("== run %d of %d\n", rep + 1, reps);
    std::unique_ptr<heapd::HeapdProcess> daemon =
        Check(heapd::HeapdProcess::Start(heapd_binary, flags), "start heapd");
    if (only.find("b9a") != std::string::npos || only.find("restore") != std::string::npos) {
      heapd::Snapshots b9a = heapd::RunB9a(*daemon, base);
      if (only.find("restore") != std::string::npos) heapd::RunRestores(heapd_binary, b9a);
    }
    if (only.find("b9c") != std::string::npos) heapd::RunB9c(*daemon, base);
    if (only.find("b9b") != std::string::npos) {
      heapd::RunB9b(*daemon, base, /*sequential=*/false);
      heapd::RunB9b(*daemon, base, /*sequential=*/true);
    }
    daemon.reset();
    for (const auto& entry : std::filesystem::directory_iterator(base)) {
      std::filesystem::remove_all(entry.path());
    }
  }
  std::printf("== medians of %d runs\n", reps);
  for (const auto& [name, values] : heapd::Figures()) {
    std::printf("%-78s %10.3f\n", name.c_str(), heapd::Median(values));
  }
  return 0;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  try {
    return Run();
  } catch (const heapd::Failed&) {
    return 1;
  }
}
