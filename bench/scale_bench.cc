// B12 of issue 25: how heapd's costs grow with the size of the work. Each
// curve runs on a heapd of its own (tmpfs) and writes CSV to --out_dir:
//
//   heap_size.csv   attach, find and sync time and heapd's RSS against a
//                   heap's maximum size (sparse: 64 MiB of objects in it)
//   names.csv       bind, find, attach and sync time, heapd's RSS and its
//                   restart (reopen) time against names in one heap
//   heaps.csv       heapd's RSS, descriptors and metric series, create,
//                   attach and list time and restart time against heaps
//
//   scale_bench --heapd=PATH --out_dir=DIR [--curves=heap_size,names,heaps]
//               [--max_names=1000000] [--max_heaps=10000] [--max_heap_gib=1024]
//
// bench/plot_curves.py draws the CSVs. Times are medians of --reps calls.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
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
ABSL_FLAG(std::string, curves, "heap_size,names,heaps", "curves to measure");
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
