// Benchmarks B2 (2 processes), B3, B4, B5, B11 and attach+find of the design
// brief, through the client library against a real heapd (started here, on
// /dev/shm), each next to its in-process std::allocator baseline measured in
// the same run. Prints the median of --reps runs of every figure.
//
//   daemon_bench --heapd=PATH [--reps=5] [--only=b2,b3,b4,b5,b11]
//                [--b3_track_contents=both|true|false]
//
// B3 runs against a heapd with content tracking (its default) and, with
// --b3_track_contents=both (the default), also against a second heapd
// started with --track_contents=false, in every rep, alternating which goes
// first: the ratio of the two is what tracking costs an ingest into fresh
// memory. B3's third baseline keeps heapd's pointer type
// (offset_ptr) over a bump arena in DRAM (bench/offset_arena.h).
//
// Multi-process figures use child processes of this binary (--child=...)
// that start together at an agreed CLOCK_MONOTONIC instant.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/heapd_process.h"
#include "bench/offset_arena.h"
#include "client/client_channel.h"
#include "client/examples/graph.h"
#include "client/examples/rmat.h"
#include "heap/undo_record.h"
#include "heapd/allocator.h"
#include "heapd/client.h"
#include "heapd/heap.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "the heapd binary");
ABSL_FLAG(int, reps, 5, "runs of each figure; medians are printed");
ABSL_FLAG(std::string, only, "b2,b3,b4,b5,b11", "which benchmarks");
ABSL_FLAG(std::string, state_parent, "/dev/shm",
          "where the heapds keep their heaps: tmpfs, or a file system's directory (tracking "
          "then gives a working image, --track_contents=false a heap mapped from its file)");
ABSL_FLAG(std::string, b3_track_contents, "both",
          "B3 against a heapd with content tracking (true), one with --track_contents=false "
          "(false), or both in every rep (both)");
// Child mode (internal).
ABSL_FLAG(bool, b3_tmpfs_baseline, false,
          "also run B3, in every rep, against a heapd on /dev/shm (tmpfs): the baseline of a "
          "--state_parent on a file system (a working image) in the same run");
ABSL_FLAG(std::string, child, "", "internal: b2, b4 or b5");
ABSL_FLAG(std::string, socket, "", "internal");
ABSL_FLAG(std::string, heap, "", "internal");
ABSL_FLAG(int64_t, start_at_ns, 0, "internal: CLOCK_MONOTONIC start");
ABSL_FLAG(int, part, 0, "internal: which part of the edges (B4)");
ABSL_FLAG(std::string, out, "", "internal: where a B5 child writes its latencies");
ABSL_FLAG(std::string, via, "find", "internal: B5 through Heap::find or the gRPC Lookup call");

extern char** environ;

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kScale = 18;
constexpr uint64_t kEdges = uint64_t{1} << 22;
constexpr uint64_t kSeed = 2026;

int64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

void WaitUntil(int64_t ns) {
  while (MonotonicNs() < ns) {
  }
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "daemon_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(what, value.status());
  return *std::move(value);
}

std::vector<std::pair<uint64_t, uint64_t>> Edges(uint64_t begin, uint64_t end) {
  RmatGenerator rmat(kScale, kSeed);
  std::vector<std::pair<uint64_t, uint64_t>> edges;
  edges.reserve(end - begin);
  for (uint64_t i = 0; i < end; ++i) {
    auto edge = rmat.Next();
    if (i >= begin) edges.push_back(edge);
  }
  return edges;
}

// Runs this binary with `args`; returns its pid, stdout to `out_path`.
pid_t SpawnSelf(const std::vector<std::string>& args, const std::string& out_path) {
  std::vector<std::string> argv = {"/proc/self/exe"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid;
  if (posix_spawn(&pid, raw[0], &actions, nullptr, raw.data(), environ) != 0) std::abort();
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Starts `count` children with `args` at a common instant; returns what each printed.
std::vector<std::string> RunChildren(int count, const std::vector<std::string>& args,
                                     const std::string& scratch, int64_t delay_ms) {
  const int64_t start = MonotonicNs() + delay_ms * 1000000;
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> child = args;
    child.push_back(absl::StrCat("--start_at_ns=", start));
    child.push_back(absl::StrCat("--part=", i));
    child.push_back(absl::StrCat("--out=", scratch, "/lat.", i));
    pids.push_back(SpawnSelf(child, absl::StrCat(scratch, "/out.", i)));
  }
  std::vector<std::string> outputs;
  for (int i = 0; i < count; ++i) {
    int status;
    waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "child %d failed: %s\n", i,
                   ReadFile(absl::StrCat(scratch, "/out.", i)).c_str());
      std::exit(1);
    }
    outputs.push_back(ReadFile(absl::StrCat(scratch, "/out.", i)));
  }
  return outputs;
}

// "key=value key=value" -> map.
std::map<std::string, double> Parse(const std::string& line) {
  std::map<std::string, double> values;
  for (absl::string_view field : absl::StrSplit(line, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(field, '=');
    values[kv.first] = std::atof(kv.second.c_str());
  }
  return values;
}

// Figures by name, one value per rep.
std::map<std::string, std::vector<double>> figures;
std::vector<std::string> order;
void Record(const std::string& name, double value) {
  if (figures.count(name) == 0) order.push_back(name);
  figures[name].push_back(value);
}

// ---- B2: allocate 100 x 64 B, free in random order, 100,000 rounds.
constexpr int kB2Batch = 100;
constexpr int kB2Rounds = 100000;

template <typename Alloc, typename Free>
double B2Loop(Alloc&& alloc, Free&& free, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::array<uint8_t, kB2Batch>> orders(64);
  for (auto& o : orders) {
    std::iota(o.begin(), o.end(), 0);
    std::shuffle(o.begin(), o.end(), rng);
  }
  std::array<void*, kB2Batch> live;
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < kB2Rounds; ++r) {
    for (int i = 0; i < kB2Batch; ++i) live[i] = alloc();
    for (uint8_t i : orders[r % orders.size()]) free(live[i]);
  }
  return Seconds(Clock::now() - t0) * 1e9 / (double{kB2Rounds} * kB2Batch);
}

double B2Heapd(Heap& heap, uint64_t seed) {
  return B2Loop(
      [&] {
        absl::StatusOr<void*> p = heap.allocate(64);
        if (!p.ok()) Die("allocate", p.status());
        return *p;
      },
      [&](void* p) {
        if (absl::Status s = heap.deallocate(p); !s.ok()) Die("deallocate", s);
      },
      seed);
}

double B2Std(uint64_t seed) {
  std::allocator<std::array<char, 64>> a;
  return B2Loop([&] { return static_cast<void*>(a.allocate(1)); },
                [&](void* p) { a.deallocate(static_cast<std::array<char, 64>*>(p), 1); }, seed);
}

// Runs `threads` threads of `body(t)` returning ns/pair; returns the mean
// and the aggregate pairs per second.
template <typename Body>
std::pair<double, double> B2Threads(int threads, Body&& body) {
  std::vector<double> ns(threads);
  std::vector<std::thread> workers;
  const Clock::time_point t0 = Clock::now();
  for (int t = 0; t < threads; ++t) workers.emplace_back([&, t] { ns[t] = body(t); });
  for (auto& w : workers) w.join();
  const double wall = Seconds(Clock::now() - t0);
  return {std::accumulate(ns.begin(), ns.end(), 0.0) / threads,
          threads * double{kB2Rounds} * kB2Batch / wall / 1e6};
}

void RunB2(Client& client, const std::string& scratch) {
  AttachOptions create;
  create.create_if_missing = true;
  std::unique_ptr<Heap> heap = Check(client.Attach("b2", create), "attach b2");
  auto std_one = B2Threads(1, [](int t) { return B2Std(t); });
  auto std_two = B2Threads(2, [](int t) { return B2Std(t); });
  B2Heapd(*heap, 99);  // warm: leases in place
  auto one = B2Threads(1, [&](int t) { return B2Heapd(*heap, t); });
  auto two = B2Threads(2, [&](int t) { return B2Heapd(*heap, t); });
  Check(heap->sync(), "sync");
  heap.reset();
  const std::vector<std::string> outputs =
      RunChildren(2, {"--child=b2", "--socket=" + client.socket_path(), "--heap=b2"}, scratch, 500);
  double end = 0, start = 0, ns = 0;
  for (const std::string& out : outputs) {
    auto v = Parse(out);
    end = std::max(end, v["end"]);
    start = v["start"];
    ns += v["pair_ns"] / 2;
  }
  const double two_proc_mpairs = 2 * double{kB2Rounds} * kB2Batch / ((end - start) / 1e9) / 1e6;
  Record("B2 heapd 1 thread ns/pair", one.first);
  Record("B2 heapd 2 threads Mpairs/s", two.second);
  Record("B2 heapd 2 threads speedup", two.second / one.second);
  Record("B2 heapd 2 processes ns/pair", ns);
  Record("B2 heapd 2 processes Mpairs/s", two_proc_mpairs);
  Record("B2 heapd 2 processes speedup", two_proc_mpairs / one.second);
  Record("B2 std::allocator 1 thread ns/pair", std_one.first);
  Record("B2 std::allocator 2 threads speedup", std_two.second / std_one.second);
}

int B2Child() {
  auto client = Check(Client::Connect(absl::GetFlag(FLAGS_socket)), "connect");
  std::unique_ptr<Heap> heap = Check(client->Attach(absl::GetFlag(FLAGS_heap)), "attach");
  B2Heapd(*heap, 98);  // warm, before the common start
  WaitUntil(absl::GetFlag(FLAGS_start_at_ns));
  const double ns = B2Heapd(*heap, absl::GetFlag(FLAGS_part));
  const int64_t end = MonotonicNs();
  std::printf("pair_ns=%f start=%lld end=%lld\n", ns,
              static_cast<long long>(absl::GetFlag(FLAGS_start_at_ns)),
              static_cast<long long>(end));
  return 0;
}

// ---- B3 / B4: R-MAT edges into an adjacency list.
template <typename Graph>
double Ingest(Graph& graph, const std::vector<std::pair<uint64_t, uint64_t>>& edges) {
  const Clock::time_point t0 = Clock::now();
  for (const auto& [source, destination] : edges) graph.AddEdge(source, destination);
  graph.edges += edges.size();
  return Seconds(Clock::now() - t0);
}

struct B3Result {
  double ingest = 0;       // s
  double close = 0;        // sync + detach, s
  double attach_find = 0;  // s
  double connect = 0;      // s
  double pre_images = 0;   // taken during the ingest (tracked heapd)
};

// Ingests `edges` into a new heap "b3" of `daemon`; `tracked`: whether that
// heapd tracks contents (checked against the heap's content_rollback()).
B3Result RunB3(HeapdProcess& daemon, const std::vector<std::pair<uint64_t, uint64_t>>& edges,
               bool tracked) {
  Client& client = daemon.client();
  B3Result result;
  RemoveHeap(client, "b3");
  AttachOptions create;
  create.create_if_missing = true;
  create.max_size = uint64_t{8} << 30;
  std::unique_ptr<Heap> heap = Check(client.Attach("b3", create), "attach b3");
  if (heap->content_rollback() != tracked) {
    Die("B3", absl::FailedPreconditionError(absl::StrCat("expected content_rollback() ", tracked,
                                                         ", got ", heap->content_rollback(), ": ",
                                                         heap->content_rollback_note())));
  }
  Graph* graph = Check(heap->construct<Graph>("graph")(allocator<char>(*heap)), "construct");
  result.ingest = Ingest(*graph, edges);
  if (tracked) {  // what the undo journal holds (after its control page):
                  // the pre-images the ingest took
    struct stat st;
    const std::string journal =
        absl::StrCat(daemon.state_dir(), "/heaps/b3/undo/session-", heap->session(), ".undo");
    if (stat(journal.c_str(), &st) != 0) Die("B3", absl::NotFoundError(journal));
    const uint64_t records = static_cast<uint64_t>(st.st_size) - kJournalControlBytes;
    result.pre_images = static_cast<double>(records) / kUndoImageRecordBytes;
  }
  const Clock::time_point t0 = Clock::now();
  Check(heap->sync(), "sync");
  if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
  result.close = Seconds(Clock::now() - t0);
  heap.reset();

  const Clock::time_point t1 = Clock::now();
  AttachOptions reopen;
  reopen.read_only = true;
  reopen.prefetch_names = {"graph"};
  std::unique_ptr<Heap> again = Check(client.Attach("b3", reopen), "reattach");
  Graph* found = Check(again->find<Graph>("graph"), "find");
  result.attach_find = Seconds(Clock::now() - t1);
  if (found->edges != edges.size()) Die("check", absl::DataLossError("edge count"));
  const Clock::time_point t2 = Clock::now();
  std::unique_ptr<Client> fresh = Check(Client::Connect(client.socket_path()), "connect");
  result.connect = Seconds(Clock::now() - t2);
  again.reset();
  RemoveHeap(client, "b3");  // frees its tmpfs pages for what follows
  return result;
}

// B3 against `tracked` (may be null) and `untracked` (may be null) heapds,
// in the order `untracked_first`, with the DRAM baseline; returns the
// tracked heapd's figures.
B3Result RunB3Pair(HeapdProcess* tracked, HeapdProcess* untracked, bool untracked_first,
                   const std::vector<std::pair<uint64_t, uint64_t>>& edges) {
  B3Result with, without;
  if (untracked != nullptr && untracked_first) without = RunB3(*untracked, edges, false);
  if (tracked != nullptr) with = RunB3(*tracked, edges, true);
  if (untracked != nullptr && !untracked_first) without = RunB3(*untracked, edges, false);

  AdjacencyList<std::allocator<char>> dram{std::allocator<char>()};
  const double baseline = Ingest(dram, edges);
  double offset_baseline;
  {
    OffsetArena arena(uint64_t{4} << 30);  // B3 takes about 1 GiB of it
    AdjacencyList<OffsetArenaAllocator<char>> offsets{OffsetArenaAllocator<char>()};
    offset_baseline = Ingest(offsets, edges);
  }

  const B3Result& main = tracked != nullptr ? with : without;
  if (tracked != nullptr) {
    Record("B3 heapd Medges/s", edges.size() / with.ingest / 1e6);
  }
  if (untracked != nullptr) {
    Record("B3 heapd --track_contents=false Medges/s", edges.size() / without.ingest / 1e6);
  }
  if (tracked != nullptr && untracked != nullptr) {
    Record("B3 tracking / no tracking (ingest rate, per rep)", without.ingest / with.ingest);
  }
  Record("B3 std::allocator (DRAM) Medges/s", edges.size() / baseline / 1e6);
  Record("B3 heapd / DRAM", baseline / main.ingest);
  Record("B3 offset_ptr bump arena (DRAM) Medges/s", edges.size() / offset_baseline / 1e6);
  Record("B3 heapd / offset_ptr bump arena", offset_baseline / main.ingest);
  if (tracked != nullptr) Record("B3 pre-images taken during the ingest", with.pre_images);
  if (tracked != nullptr) Record("B3 sync+detach ms", with.close * 1e3);
  if (untracked != nullptr)
    Record("B3 sync+detach ms, --track_contents=false", without.close * 1e3);
  Record("B3 attach+find ms (read-only, name prefetched)", main.attach_find * 1e3);
  Record("B3 connect ms", main.connect * 1e3);
  return with;
}

void RunB4(Client& client, const std::string& scratch) {
  RemoveHeap(client, "b4");
  AttachOptions create;
  create.create_if_missing = true;
  create.max_size = uint64_t{8} << 30;
  Check(client.Attach("b4", create), "create b4");  // detached at once
  const std::vector<std::string> outputs = RunChildren(
      2, {"--child=b4", "--socket=" + client.socket_path(), "--heap=b4"}, scratch, 4000);
  double end = 0, start = 0, sum = 0;
  for (const std::string& out : outputs) {
    auto v = Parse(out);
    end = std::max(end, v["end"]);
    start = v["start"];
    sum += v["edges"];
  }
  Record("B4 heapd 2 processes Medges/s (aggregate)", sum / ((end - start) / 1e9) / 1e6);
}

int B4Child() {
  const int part = absl::GetFlag(FLAGS_part);
  const auto edges = Edges(part * kEdges / 2, (part + 1) * kEdges / 2);
  auto client = Check(Client::Connect(absl::GetFlag(FLAGS_socket)), "connect");
  std::unique_ptr<Heap> heap = Check(client->Attach(absl::GetFlag(FLAGS_heap)), "attach");
  WaitUntil(absl::GetFlag(FLAGS_start_at_ns));
  if (MonotonicNs() > absl::GetFlag(FLAGS_start_at_ns) + 1000000) {
    std::fprintf(stderr, "b4 child %d started late\n", part);
    return 1;
  }
  Graph* graph = Check(heap->construct<Graph>(absl::StrCat("graph-", part))(allocator<char>(*heap)),
                       "construct");
  Ingest(*graph, edges);
  const int64_t end = MonotonicNs();
  std::printf("edges=%zu start=%lld end=%lld\n", edges.size(),
              static_cast<long long>(absl::GetFlag(FLAGS_start_at_ns)),
              static_cast<long long>(end));
  return heap->detach().ok() ? 0 : 1;
}

// ---- B5: named-object Lookup latency with concurrent clients.
constexpr double kB5Seconds = 2.0;

void RunB5(Client& client, const std::string& scratch) {
  {
    AttachOptions create;
    create.create_if_missing = true;
    std::unique_ptr<Heap> heap = Check(client.Attach("b5", create), "attach b5");
    if (!heap->find<uint64_t>("answer").ok()) Check(heap->construct<uint64_t>("answer")(42), "x");
  }
  for (const char* via : {"find", "grpc"}) {
    for (int clients : {1, 4, 16}) {
      RunChildren(clients,
                  {"--child=b5", "--socket=" + client.socket_path(), "--heap=b5",
                   std::string("--via=") + via},
                  scratch, 300 + 30 * clients);
      std::vector<uint32_t> all;
      for (int i = 0; i < clients; ++i) {
        std::ifstream in(absl::StrCat(scratch, "/lat.", i), std::ios::binary);
        in.seekg(0, std::ios::end);
        const size_t bytes = static_cast<size_t>(in.tellg());
        in.seekg(0);
        std::vector<uint32_t> samples(bytes / 4);
        in.read(reinterpret_cast<char*>(samples.data()), static_cast<std::streamsize>(bytes));
        all.insert(all.end(), samples.begin(), samples.end());
      }
      std::sort(all.begin(), all.end());
      const std::string prefix =
          absl::StrCat("B5 ", std::string(via) == "find" ? "Heap::find" : "gRPC Lookup", " ",
                       clients, " client", clients > 1 ? "s" : "");
      Record(prefix + " p50 us", all[all.size() / 2] / 1e3);
      Record(prefix + " p99 us", all[all.size() * 99 / 100] / 1e3);
      Record(prefix + " calls/s", all.size() / kB5Seconds);
    }
  }
}

int B5Child() {
  auto client = Check(Client::Connect(absl::GetFlag(FLAGS_socket)), "connect");
  AttachOptions read_only;
  read_only.read_only = true;
  std::unique_ptr<Heap> heap =
      Check(client->Attach(absl::GetFlag(FLAGS_heap), read_only), "attach");
  const bool via_find = absl::GetFlag(FLAGS_via) == "find";
  v1::LookupRequest request;
  request.set_heap(absl::GetFlag(FLAGS_heap));
  request.set_name("answer");
  std::vector<uint32_t> latencies;
  latencies.reserve(1 << 20);
  WaitUntil(absl::GetFlag(FLAGS_start_at_ns));
  const int64_t stop = absl::GetFlag(FLAGS_start_at_ns) + static_cast<int64_t>(kB5Seconds * 1e9);
  for (int64_t now = MonotonicNs(); now < stop;) {
    if (via_find) {
      if (*Check(heap->find<uint64_t>("answer"), "find") != 42) std::abort();
    } else {
      v1::NameEntry entry;
      grpc::ClientContext context;
      if (absl::Status s = FromGrpc(StubOf(*client).Lookup(&context, request, &entry)); !s.ok()) {
        Die("lookup", s);
      }
    }
    const int64_t done = MonotonicNs();
    latencies.push_back(static_cast<uint32_t>(std::min<int64_t>(done - now, UINT32_MAX)));
    now = done;
  }
  std::ofstream(absl::GetFlag(FLAGS_out), std::ios::binary)
      .write(reinterpret_cast<const char*>(latencies.data()),
             static_cast<std::streamsize>(latencies.size() * 4));
  return 0;
}

// ---- B11: N large objects allocated, then freed, through heapd::Heap (a
// session carves them from chunks heapd reserves for it), on a new heap
// and on one grown by an earlier session; baselines in the same rep: one
// AllocateLarge / Free call per object (heapd's path before carving, still
// taken above 128 MiB), and std::allocator. Objects are not written: the
// figures are the allocator's, not first-touch page faults.
struct LargeTimes {
  double allocate_us = 0;
  double free_us = 0;
};

template <typename Alloc, typename Free>
LargeTimes TimeLarge(int count, Alloc&& alloc, Free&& free) {
  std::vector<void*> objects(count);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < count; ++i) objects[i] = alloc();
  const Clock::time_point t1 = Clock::now();
  for (int i = 0; i < count; ++i) free(objects[i]);
  const Clock::time_point t2 = Clock::now();
  return {Seconds(t1 - t0) * 1e6 / count, Seconds(t2 - t1) * 1e6 / count};
}

LargeTimes LargeThroughHeap(Heap& heap, int count, uint64_t size) {
  return TimeLarge(
      count,
      [&] {
        absl::StatusOr<void*> p = heap.allocate(size);
        if (!p.ok()) Die("allocate", p.status());
        return *p;
      },
      [&](void* p) {
        if (absl::Status s = heap.deallocate(p, size); !s.ok()) Die("deallocate", s);
      });
}

// The calls themselves, on `heap`'s session: what each object cost before.
LargeTimes LargeByCalls(Client& client, Heap& heap, int count, uint64_t size) {
  return TimeLarge(
      count,
      [&]() -> void* {
        v1::AllocateLargeRequest request;
        request.set_session(heap.session());
        request.set_size(size);
        v1::AllocateLargeResponse response;
        grpc::ClientContext context;
        if (!StubOf(client).AllocateLarge(&context, request, &response).ok()) {
          Die("AllocateLarge", absl::InternalError("call failed"));
        }
        return heap.at(response.offset());
      },
      [&](void* p) {
        v1::FreeRequest request;
        request.set_session(heap.session());
        v1::ObjectRef* object = request.add_objects();
        object->set_offset(heap.offset_of(p));
        object->set_size(size);
        v1::FreeResponse response;
        grpc::ClientContext context;
        if (!StubOf(client).Free(&context, request, &response).ok()) {
          Die("Free", absl::InternalError("call failed"));
        }
      });
}

// `where`: which heapd, for the figures' names.
void RunB11(Client& client, const std::string& where) {
  struct Case {
    const char* label;
    uint64_t size;
    int count;
  };
  for (const Case& c : {Case{"1.5 MiB", 3 << 19, 1000}, Case{"16 MiB", 16 << 20, 100}}) {
    for (const bool by_calls : {false, true}) {
      RemoveHeap(client, "b11");
      AttachOptions create;
      create.create_if_missing = true;
      create.max_size = uint64_t{4} << 30;
      std::unique_ptr<Heap> heap = Check(client.Attach("b11", create), "attach b11");
      auto run = [&] {
        return by_calls ? LargeByCalls(client, *heap, c.count, c.size)
                        : LargeThroughHeap(*heap, c.count, c.size);
      };
      const LargeTimes fresh = run();  // the heap grows under it
      Check(heap->sync(), "sync");
      if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
      heap = Check(client.Attach("b11"), "attach b11 again");
      const LargeTimes grown = run();
      if (absl::Status s = heap->detach(); !s.ok()) Die("detach", s);
      const std::string name =
          absl::StrCat("B11 ", where, " ", c.label, by_calls ? " one call each" : " heapd::Heap");
      Record(absl::StrCat(name, " new heap us/allocate"), fresh.allocate_us);
      Record(absl::StrCat(name, " new heap us/free"), fresh.free_us);
      Record(absl::StrCat(name, " grown heap us/allocate"), grown.allocate_us);
      Record(absl::StrCat(name, " grown heap us/free"), grown.free_us);
    }
    if (where != "tracked") continue;  // once per rep
    std::allocator<char> a;
    const LargeTimes std_times = TimeLarge(
        c.count, [&] { return static_cast<void*>(a.allocate(c.size)); },
        [&](void* p) { a.deallocate(static_cast<char*>(p), c.size); });
    Record(absl::StrCat("B11 ", c.label, " std::allocator us/allocate"), std_times.allocate_us);
    Record(absl::StrCat("B11 ", c.label, " std::allocator us/free"), std_times.free_us);
  }
  RemoveHeap(client, "b11");
}

int Main() {
  const std::string heapd = absl::GetFlag(FLAGS_heapd);
  const std::string only = absl::GetFlag(FLAGS_only);
  const bool b3 = only.find("b3") != std::string::npos;
  const std::string b3_mode = absl::GetFlag(FLAGS_b3_track_contents);
  if (b3_mode != "both" && b3_mode != "true" && b3_mode != "false") {
    std::fprintf(stderr, "--b3_track_contents: both, true or false\n");
    return 1;
  }
  // heapd as it runs by default (contents tracked), for every benchmark.
  const std::string parent = absl::GetFlag(FLAGS_state_parent);
  absl::StatusOr<std::unique_ptr<HeapdProcess>> daemon =
      HeapdProcess::Start(heapd, {}, /*huge_pages=*/false, parent);
  if (!daemon.ok()) Die("heapd", daemon.status());
  Client& client = (*daemon)->client();
  const bool b11 = only.find("b11") != std::string::npos;
  // A second heapd without content tracking, for B3's and B11's
  // comparisons; a third on a tmpfs with 2 MiB pages for B11's (root only).
  std::unique_ptr<HeapdProcess> untracked;
  if ((b3 && b3_mode != "true") || b11) {
    untracked = Check(HeapdProcess::Start(heapd, {"--track_contents=false"}, false, parent),
                      "heapd untracked");
  }
  std::unique_ptr<HeapdProcess> on_tmpfs;
  if (b3 && absl::GetFlag(FLAGS_b3_tmpfs_baseline)) {
    on_tmpfs = Check(HeapdProcess::Start(heapd, {}, false, "/dev/shm"), "heapd on tmpfs");
  }
  std::unique_ptr<HeapdProcess> huge;
  if (b11) {
    absl::StatusOr<std::unique_ptr<HeapdProcess>> started =
        HeapdProcess::Start(heapd, {}, /*huge_pages=*/true);
    if (started.ok()) {
      huge = *std::move(started);
    } else {
      std::fprintf(stderr, "B11 on 2 MiB pages skipped: %s\n", started.status().ToString().c_str());
    }
  }
  const auto edges = b3 ? Edges(0, kEdges) : std::vector<std::pair<uint64_t, uint64_t>>();
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    if (only.find("b2") != std::string::npos) RunB2(client, (*daemon)->dir());
    if (b3) {
      const bool tmpfs_first = rep % 2 == 1;
      B3Result tmpfs;
      if (on_tmpfs != nullptr && tmpfs_first) tmpfs = RunB3(*on_tmpfs, edges, true);
      const B3Result with =
          RunB3Pair(b3_mode != "false" ? daemon->get() : nullptr,
                    b3_mode != "true" ? untracked.get() : nullptr, rep % 2 == 0, edges);
      if (on_tmpfs != nullptr && !tmpfs_first) tmpfs = RunB3(*on_tmpfs, edges, true);
      if (on_tmpfs != nullptr) {
        Record("B3 heapd on tmpfs Medges/s", edges.size() / tmpfs.ingest / 1e6);
        Record("B3 heapd on tmpfs sync+detach ms", tmpfs.close * 1e3);
        if (with.ingest > 0) {
          Record("B3 --state_parent / tmpfs (ingest rate, per rep)", tmpfs.ingest / with.ingest);
        }
      }
    }
    if (only.find("b4") != std::string::npos) RunB4(client, (*daemon)->dir());
    if (only.find("b5") != std::string::npos) RunB5(client, (*daemon)->dir());
    if (b11) {
      RunB11(client, "tracked");
      RunB11(untracked->client(), "untracked");
      if (huge != nullptr) RunB11(huge->client(), "tracked, 2 MiB pages");
    }
    std::fprintf(stderr, "rep %d done\n", rep + 1);
  }
  std::printf("%-52s %12s   (runs)\n", "figure", "median");
  for (const std::string& name : order) {
    std::string runs;
    for (double v : figures[name]) runs += absl::StrFormat(" %.3g", v);
    std::printf("%-52s %12.3f  %s\n", name.c_str(), Median(figures[name]), runs.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string child = absl::GetFlag(FLAGS_child);
  if (child == "b2") return heapd::B2Child();
  if (child == "b4") return heapd::B4Child();
  if (child == "b5") return heapd::B5Child();
  return heapd::Main();
}
