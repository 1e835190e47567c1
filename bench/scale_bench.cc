// B12 of issue 25: how heapd's costs grow with the size of the work. Each
// curve runs on a heapd of its own (tmpfs) and writes CSV to --out_dir:
//
//   heap_size.csv   attach, find and sync time and heapd's RSS against a
//                   heap's maximum size (sparse: 64 MiB of objects in it)
//   names.csv       bind, find, attach and sync time, heapd's RSS and its
//                   restart (reopen) time against names in one heap
//   heaps.csv       heapd's RSS, descriptors and metric series, create,
//                   attach and list time and restart time against heaps
//   clients.csv     attach, find, sync and stat time, heapd's RSS and
//                   descriptors against sessions attached to one heap, and
//                   how long heapd takes to end them all when their
//                   process is killed at once
//   versions.csv    a snapshot store's create, ls, du, gc and restore time
//                   and its bytes on disk against the versions in it (each
//                   version rewrites 1 MiB of a 64 MiB object)
//
//   scale_bench --heapd=PATH --out_dir=DIR
//               [--curves=heap_size,names,heaps,clients,versions]
//               [--max_names=1000000] [--max_heaps=10000] [--max_heap_gib=1024]
//               [--max_clients=256] [--max_versions=100]
//
// bench/plot_curves.py draws the CSVs. Times are medians of --reps calls.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/heapd_process.h"
#include "client/client_channel.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "proto/heapd.grpc.pb.h"
#include "util/errno_status.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "heapd binary");
ABSL_FLAG(std::string, out_dir, ".", "directory of the CSV files");
ABSL_FLAG(std::string, curves, "heap_size,names,heaps,clients,versions", "curves to measure");
ABSL_FLAG(uint64_t, max_clients, 256, "largest count of sessions on one heap (from 1, x4)");
ABSL_FLAG(uint64_t, max_versions, 100, "versions in the snapshot store (points at 1, 2, 5, ...)");
ABSL_FLAG(uint64_t, hold_sessions, 0, "internal: attach this many sessions, say so, wait");
ABSL_FLAG(std::string, socket, "", "internal: with --hold_sessions");
ABSL_FLAG(std::string, heap, "", "internal: with --hold_sessions");
ABSL_FLAG(uint64_t, max_names, 1000000, "largest count of names (from 10^3, x10)");
ABSL_FLAG(uint64_t, max_heaps, 10000, "largest count of heaps (from 10, x10)");
ABSL_FLAG(uint64_t, max_heap_gib, 1024, "largest heap maximum size in GiB (from 1, x4)");
ABSL_FLAG(int, reps, 21, "calls per timed figure (their median)");

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "scale_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(what, value.status());
  return *std::move(value);
}
void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(what, status);
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The median time of `reps` calls of `call`, in microseconds.
double MedianMicros(int reps, const std::function<void()>& call) {
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const Clock::time_point start = Clock::now();
    call();
    times.push_back(Seconds(Clock::now() - start) * 1e6);
  }
  return Median(times);
}

// heapd's resident memory (VmRSS) in bytes.
uint64_t RssBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

uint64_t OpenDescriptors(pid_t pid) {
  uint64_t count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    ++count;
  }
  return count;
}

// The series (sample lines) of heapd's metrics on 127.0.0.1:`port`.
uint64_t MetricSeries(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Die("scrape", absl::UnavailableError("socket"));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    Die("scrape", absl::UnavailableError(absl::StrCat("connect to port ", port)));
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string answer;
  char buffer[1 << 16];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) answer.append(buffer, n);
  close(fd);
  const size_t body = answer.find("\r\n\r\n");
  if (body == std::string::npos) Die("scrape", absl::DataLossError("no HTTP header end"));
  uint64_t series = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(answer).substr(body + 4), '\n')) {
    series += !line.empty() && line[0] != '#';
  }
  return series;
}

std::unique_ptr<Heap> Attach(HeapdProcess& daemon, const std::string& name, uint64_t max_size = 0) {
  AttachOptions options;
  options.create_if_missing = max_size != 0;
  options.max_size = max_size;
  return Check(daemon.client().Attach(name, options), "attach " + name);
}

class Csv {
 public:
  Csv(const std::string& path, const std::string& header) : out_(path) {
    if (!out_) Die("write the CSV", ErrnoStatus(errno, "create " + path));
    out_ << header << "\n";
    std::printf("%s\n", header.c_str());
  }
  void Row(const std::string& row) {
    out_ << row << "\n";
    out_.flush();
    std::printf("%s\n", row.c_str());
    std::fflush(stdout);
  }

 private:
  std::ofstream out_;
};

std::unique_ptr<HeapdProcess> StartHeapd(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags = {"--max_heaps_per_user=100000", "--max_heap_bytes_per_user=64T",
                                    "--max_names_per_heap=100000000"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return Check(HeapdProcess::Start(absl::GetFlag(FLAGS_heapd), flags), "start heapd");
}

// Attach (with a find of "root" through the attach's prefetch: one call),
// a find (a Lookup call) and a sync that carries one dirty object.
struct SessionCosts {
  double attach_us, find_us, sync_us;
};
SessionCosts MeasureSession(HeapdProcess& daemon, const std::string& heap_name) {
  const int reps = absl::GetFlag(FLAGS_reps);
  SessionCosts costs;
  costs.attach_us = MedianMicros(reps, [&] {
    std::unique_ptr<Heap> heap = Attach(daemon, heap_name);
    Check(heap->detach(), "detach");
  });
  std::unique_ptr<Heap> heap = Attach(daemon, heap_name);
  costs.find_us = MedianMicros(reps, [&] { Check(heap->Lookup("root"), "find root"); });
  uint64_t* root = static_cast<uint64_t*>(Check(heap->Lookup("root"), "find root").object);
  costs.sync_us = MedianMicros(reps, [&] {
    ++*root;
    Check(heap->sync(), "sync");
  });
  Check(heap->detach(), "detach");
  return costs;
}

void HeapSizeCurve(const std::string& out_dir) {
  Csv csv(out_dir + "/heap_size.csv", "max_size_bytes,attach_us,find_us,sync_us,heapd_rss_bytes");
  for (uint64_t gib = 1; gib <= absl::GetFlag(FLAGS_max_heap_gib); gib *= 4) {
    std::unique_ptr<HeapdProcess> daemon = StartHeapd();
    const std::string name = absl::StrCat("size-", gib, "g");
    {
      std::unique_ptr<Heap> heap = Attach(*daemon, name, gib * kGiB);
      // 64 MiB of objects: 32 MiB of small ones and two large ones.
      for (int i = 0; i < 2048; ++i) Check(heap->allocate(16 << 10), "allocate");
      for (int i = 0; i < 2; ++i) Check(heap->allocate(16 * kMiB), "allocate large");
      void* root = Check(heap->allocate(8), "allocate root");
      Check(heap->Bind("root", root, 8, "uint64_t"), "bind root");
      Check(heap->detach(), "detach");
    }
    const SessionCosts costs = MeasureSession(*daemon, name);
    csv.Row(absl::StrCat(gib * kGiB, ",", costs.attach_us, ",", costs.find_us, ",", costs.sync_us,
                         ",", RssBytes(daemon->pid())));
  }
}

void NamesCurve(const std::string& out_dir) {
  Csv csv(out_dir + "/names.csv",
          "names,bind_us,attach_us,find_us,sync_us,heapd_rss_bytes,restart_s");
  std::unique_ptr<HeapdProcess> daemon = StartHeapd();
  std::unique_ptr<Heap> heap = Attach(*daemon, "names", 16 * kGiB);
  void* root = Check(heap->allocate(8), "allocate root");
  Check(heap->Bind("root", root, 8, "uint64_t"), "bind root");
  uint64_t bound = 1;
  for (uint64_t target = 1000; target <= absl::GetFlag(FLAGS_max_names); target *= 10) {
    const Clock::time_point start = Clock::now();
    const uint64_t from = bound;
    for (; bound < target; ++bound) {
      void* object = Check(heap->allocate(8), "allocate");
      Check(heap->Bind(absl::StrCat("object-", bound), object, 8, "uint64_t"), "bind");
      if (bound % 65536 == 0) Check(heap->sync(), "sync");
    }
    const double bind_us = Seconds(Clock::now() - start) * 1e6 / static_cast<double>(target - from);
    Check(heap->detach(), "detach");
    const SessionCosts costs = MeasureSession(*daemon, "names");
    const uint64_t rss = RssBytes(daemon->pid());
    const Clock::time_point restart = Clock::now();
    Check(daemon->Restart([] {}, 600), "restart");
    Check(StatHeap(daemon->client(), "names"), "stat after restart");
    const double restart_s = Seconds(Clock::now() - restart);
    csv.Row(absl::StrCat(target, ",", bind_us, ",", costs.attach_us, ",", costs.find_us, ",",
                         costs.sync_us, ",", rss, ",", restart_s));
    heap = Attach(*daemon, "names");
  }
  Check(heap->detach(), "detach");
}

void HeapsCurve(const std::string& out_dir) {
  Csv csv(out_dir + "/heaps.csv",
          "heaps,create_us,attach_us,list_us,heapd_rss_bytes,heapd_fds,metric_series,restart_s");
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  std::unique_ptr<HeapdProcess> daemon =
      StartHeapd({absl::StrCat("--metrics_address=127.0.0.1:", port)});
  {
    std::unique_ptr<Heap> heap = Attach(*daemon, "heap-0", 64 * kMiB);
    void* root = Check(heap->allocate(8), "allocate root");
    Check(heap->Bind("root", root, 8, "uint64_t"), "bind root");
    Check(heap->detach(), "detach");
  }
  uint64_t created = 1;
  bool refused = false;  // heapd refused a heap: the curve ends at `created`
  for (uint64_t target = 10; target <= absl::GetFlag(FLAGS_max_heaps) && !refused; target *= 10) {
    std::vector<double> creates;
    for (; created < target; ++created) {
      v1::CreateHeapRequest request;
      request.set_name(absl::StrCat("heap-", created));
      request.set_max_size(64 * kMiB);
      v1::HeapInfo info;
      grpc::ClientContext context;
      ChannelOf(daemon->client()).Prepare(&context);
      const Clock::time_point start = Clock::now();
      const absl::Status made =
          FromGrpc(StubOf(daemon->client()).CreateHeap(&context, request, &info));
      if (made.code() == absl::StatusCode::kResourceExhausted) {
        std::printf("# heapd refused heap %" PRIu64 ": %s\n", created + 1,
                    std::string(made.message()).c_str());
        refused = true;
        target = created;
        break;
      }
      Check(made, "create " + request.name());
      creates.push_back(Seconds(Clock::now() - start) * 1e6);
    }
    const SessionCosts costs = MeasureSession(*daemon, "heap-0");
    const double list_us = MedianMicros(5, [&] {
      v1::ListHeapsResponse response;
      grpc::ClientContext context;
      ChannelOf(daemon->client()).Prepare(&context);
      Check(
          FromGrpc(StubOf(daemon->client()).ListHeaps(&context, v1::ListHeapsRequest(), &response)),
          "list heaps");
    });
    const uint64_t rss = RssBytes(daemon->pid());
    const uint64_t fds = OpenDescriptors(daemon->pid());
    const uint64_t series = MetricSeries(port);
    const Clock::time_point restart = Clock::now();
    Check(daemon->Restart([] {}, 1200), "restart");
    Check(StatHeap(daemon->client(), "heap-0"), "stat after restart");
    const double restart_s = Seconds(Clock::now() - restart);
    csv.Row(absl::StrCat(target, ",", creates.empty() ? 0.0 : Median(creates), ",", costs.attach_us,
                         ",", list_us, ",", rss, ",", fds, ",", series, ",", restart_s));
  }
}

template <typename Request, typename Response>
absl::Status Call(HeapdProcess& daemon,
                  grpc::Status (v1::Heapd::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          Response*),
                  const Request& request, Response* response) {
  grpc::ClientContext context;
  ChannelOf(daemon.client()).Prepare(&context);
  return FromGrpc((StubOf(daemon.client()).*method)(&context, request, response));
}

uint32_t ClientsOf(HeapdProcess& daemon, const std::string& heap) {
  return Check(StatHeap(daemon.client(), heap), "stat " + heap).info().clients();
}

// --hold_sessions: `count` read-write sessions on --heap, then "ready" on
// stdout, then waits to be killed.
int HoldSessions(uint64_t count) {
  std::unique_ptr<Client> client =
      Check(Client::Connect(absl::GetFlag(FLAGS_socket)), "connect to hold sessions");
  std::vector<std::unique_ptr<Heap>> held;
  for (uint64_t i = 0; i < count; ++i) {
    held.push_back(Check(client->Attach(absl::GetFlag(FLAGS_heap)), "attach a held session"));
  }
  std::printf("ready\n");
  std::fflush(stdout);
  pause();
  return 0;
}

// Starts this program holding `count` sessions on `heap`, waits until they
// are attached, kills it (SIGKILL) and returns how long heapd took to end
// every session it held (no client listed).
double SecondsToReclaim(HeapdProcess& daemon, const std::string& heap, uint64_t count) {
  int out[2];
  if (pipe(out) != 0) Die("pipe", ErrnoStatus(errno, "pipe"));
  const uint32_t before = ClientsOf(daemon, heap);
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl("/proc/self/exe", "scale_bench", absl::StrCat("--hold_sessions=", count).c_str(),
          ("--socket=" + daemon.socket()).c_str(), ("--heap=" + heap).c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  char ready[6] = {};
  if (read(out[0], ready, 5) != 5 || std::string(ready) != "ready") {
    Die("hold sessions", absl::InternalError("the holding process did not attach"));
  }
  close(out[0]);
  const Clock::time_point killed = Clock::now();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  while (ClientsOf(daemon, heap) > before) usleep(1000);
  return Seconds(Clock::now() - killed);
}

void ClientsCurve(const std::string& out_dir) {
  Csv csv(out_dir + "/clients.csv",
          "clients,attach_us,find_us,sync_us,stat_us,heapd_rss_bytes,heapd_fds,reclaim_all_s");
  std::unique_ptr<HeapdProcess> daemon = StartHeapd();
  {
    std::unique_ptr<Heap> heap = Attach(*daemon, "shared", kGiB);
    void* root = Check(heap->allocate(8), "allocate root");
    Check(heap->Bind("root", root, 8, "uint64_t"), "bind root");
    Check(heap->detach(), "detach");
  }
  std::vector<std::unique_ptr<Heap>> held;
  for (uint64_t target = 1; target <= absl::GetFlag(FLAGS_max_clients); target *= 4) {
    while (held.size() < target) held.push_back(Attach(*daemon, "shared"));
    const SessionCosts costs = MeasureSession(*daemon, "shared");
    const double stat_us = MedianMicros(
        absl::GetFlag(FLAGS_reps), [&] { Check(StatHeap(daemon->client(), "shared"), "stat"); });
    const uint64_t rss = RssBytes(daemon->pid());
    const uint64_t fds = OpenDescriptors(daemon->pid());
    // As many again, in one process killed at once.
    const double reclaim_s = SecondsToReclaim(*daemon, "shared", target);
    csv.Row(absl::StrCat(target, ",", costs.attach_us, ",", costs.find_us, ",", costs.sync_us, ",",
                         stat_us, ",", rss, ",", fds, ",", reclaim_s));
  }
  for (std::unique_ptr<Heap>& heap : held) Check(heap->detach(), "detach");
}

void VersionsCurve(const std::string& out_dir) {
  Csv csv(out_dir + "/versions.csv", "versions,create_ms,ls_ms,du_ms,gc_ms,restore_ms,store_bytes");
  std::unique_ptr<HeapdProcess> daemon = StartHeapd();
  const std::string store = daemon->dir() + "/store";
  std::filesystem::create_directories(store);
  constexpr uint64_t kObject = 64 * kMiB;
  {
    std::unique_ptr<Heap> heap = Attach(*daemon, "versioned", kGiB);
    char* data = static_cast<char*>(Check(heap->allocate(kObject), "allocate"));
    std::mt19937_64 random(12);
    for (uint64_t i = 0; i < kObject / 8; ++i) reinterpret_cast<uint64_t*>(data)[i] = random();
    Check(heap->Bind("data", data, kObject, "bytes"), "bind data");
    Check(heap->detach(), "detach");
  }
  const uint64_t max_versions = absl::GetFlag(FLAGS_max_versions);
  std::vector<uint64_t> points;
  for (uint64_t decade = 1; decade <= max_versions; decade *= 10) {
    for (uint64_t step : {1, 2, 5}) {
      if (decade * step <= max_versions) points.push_back(decade * step);
    }
  }
  auto ms_of = [](const std::function<void()>& call) {
    const Clock::time_point start = Clock::now();
    call();
    return Seconds(Clock::now() - start) * 1e3;
  };
  for (uint64_t version = 1; version <= max_versions; ++version) {
    {  // Rewrite 1 MiB, a different one each version.
      std::unique_ptr<Heap> heap = Attach(*daemon, "versioned");
      char* data = static_cast<char*>(Check(heap->Lookup("data"), "find data").object);
      char* changed = data + (version * kMiB) % kObject;
      for (uint64_t i = 0; i < kMiB / 8; ++i) reinterpret_cast<uint64_t*>(changed)[i] += version;
      Check(heap->detach(), "detach");
    }
    v1::CreateSnapshotRequest create;
    create.set_heap("versioned");
    create.set_name(absl::StrCat("v", version));
    create.set_store_dir(store);
    v1::SnapshotManifest manifest;
    const double create_ms = ms_of([&] {
      Check(Call(*daemon, &v1::Heapd::Stub::CreateSnapshot, create, &manifest), "store a version");
    });
    if (std::find(points.begin(), points.end(), version) == points.end()) continue;
    v1::ListSnapshotsRequest ls;
    ls.set_store_dir(store);
    v1::ListSnapshotsResponse listed;
    const double ls_ms =
        ms_of([&] { Check(Call(*daemon, &v1::Heapd::Stub::ListSnapshots, ls, &listed), "ls"); });
    if (listed.snapshots_size() != static_cast<int>(version)) {
      Die("ls", absl::DataLossError(absl::StrCat(listed.snapshots_size(), " versions listed")));
    }
    v1::StoreUsageRequest du;
    du.set_store_dir(store);
    v1::StoreUsageResponse usage;
    const double du_ms =
        ms_of([&] { Check(Call(*daemon, &v1::Heapd::Stub::StoreUsage, du, &usage), "du"); });
    v1::GcStoreRequest gc;
    gc.set_store_dir(store);
    gc.set_grace_s(60);  // the least heapd takes: blocks of the last minute are kept
    v1::GcStoreResponse collected;
    const double gc_ms =
        ms_of([&] { Check(Call(*daemon, &v1::Heapd::Stub::GcStore, gc, &collected), "gc"); });
    v1::RestoreSnapshotRequest restore;
    restore.set_store_dir(store);
    restore.set_name(create.name());
    restore.set_heap("restored");
    restore.set_replace(true);
    v1::HeapInfo info;
    const double restore_ms = ms_of([&] {
      Check(Call(*daemon, &v1::Heapd::Stub::RestoreSnapshot, restore, &info), "restore");
    });
    csv.Row(absl::StrCat(version, ",", create_ms, ",", ls_ms, ",", du_ms, ",", gc_ms, ",",
                         restore_ms, ",", usage.stored_bytes()));
  }
}

// As heapd.service does (LimitNOFILE=1048576): the heapds started here
// inherit the limit, and 10^4 heaps hold about 70,000 descriptors. Needs
// root beyond the hard limit; without it, the curve stops where heapd
// refuses a heap.
void RaiseDescriptorLimit() {
  rlimit limit{1 << 20, 1 << 20};
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::fprintf(stderr,
                 "scale_bench: cannot raise RLIMIT_NOFILE to 2^20 (%s; raising the hard limit "
                 "needs CAP_SYS_RESOURCE): the heaps curve stops where heapd refuses a heap\n",
                 std::strerror(errno));
  }
}

int Main() {
  if (const uint64_t count = absl::GetFlag(FLAGS_hold_sessions); count != 0) {
    return HoldSessions(count);
  }
  RaiseDescriptorLimit();
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  std::filesystem::create_directories(out_dir);
  for (absl::string_view curve : absl::StrSplit(absl::GetFlag(FLAGS_curves), ',')) {
    std::printf("== %.*s\n", static_cast<int>(curve.size()), curve.data());
    if (curve == "heap_size") {
      HeapSizeCurve(out_dir);
    } else if (curve == "names") {
      NamesCurve(out_dir);
    } else if (curve == "heaps") {
      HeapsCurve(out_dir);
    } else if (curve == "clients") {
      ClientsCurve(out_dir);
    } else if (curve == "versions") {
      VersionsCurve(out_dir);
    } else {
      Die("--curves", absl::InvalidArgumentError(absl::StrCat("no curve '", curve, "'")));
    }
  }
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Main();
}
