// Opening a heap with a working image after a reboot (issue 21): a heap of
// --heap_gib GiB on a file system (--state_parent, ext4 on this disk) is
// filled with non-zero bytes through a client and synced; then, --reps
// times, heapd is stopped, the page cache dropped (as a reboot leaves it),
// and heapd started again: the time until it answers a call on the heap is
// the open, in which it applies its redo logs and loads the working image
// from the data file.
// The same-run baseline is the device's read bandwidth: dd of the data
// file with iflag=direct after the same cache drop.
//
//   open_bench --heapd=PATH [--heap_gib=16] [--reps=3] [--state_parent=/var/tmp]
//
// Needs root (drop_caches). Prints each rep and the medians.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/heapd_process.h"
#include "client/client_channel.h"
#include "heapd/client.h"
#include "heapd/heap.h"

ABSL_FLAG(std::string, heapd, "bazel-bin/daemon/heapd", "the heapd binary");
ABSL_FLAG(int, heap_gib, 16, "GiB of objects in the heap");
ABSL_FLAG(int, reps, 3, "restarts timed");
ABSL_FLAG(std::string, state_parent, "/var/tmp", "a file system's directory for the heap");

namespace heapd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kObjectBytes = uint64_t{1} << 30;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "open_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

void DropCaches() {
  sync();
  const int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, "3", 1) != 1) Die("drop caches", absl::PermissionDeniedError("root?"));
  close(fd);
}

// Seconds dd takes to read `path` with direct I/O in 2 MiB reads.
double DdReadSeconds(const std::string& path) {
  const std::string dd =
      absl::StrCat("dd if=", path, " of=/dev/null bs=2M iflag=direct status=none");
  const Clock::time_point start = Clock::now();
  if (std::system(dd.c_str()) != 0) Die("dd", absl::InternalError(dd));
  return Seconds(Clock::now() - start);
}

int Main() {
  const uint64_t objects = static_cast<uint64_t>(absl::GetFlag(FLAGS_heap_gib));
  absl::StatusOr<std::unique_ptr<HeapdProcess>> started = HeapdProcess::Start(
      absl::GetFlag(FLAGS_heapd), {}, /*huge_pages=*/false, absl::GetFlag(FLAGS_state_parent));
  if (!started.ok()) Die("start heapd", started.status());
  HeapdProcess& daemon = **started;
  const Clock::time_point fill_start = Clock::now();
  std::vector<uint64_t> offsets;  // of each object
  {
    AttachOptions options;
    options.create_if_missing = true;
    options.max_size = (objects + 1) * kObjectBytes;
    absl::StatusOr<std::unique_ptr<Heap>> heap = daemon.client().Attach("big", options);
    if (!heap.ok()) Die("attach", heap.status());
    for (uint64_t i = 0; i < objects; ++i) {
      absl::StatusOr<void*> object = (*heap)->allocate(kObjectBytes);
      if (!object.ok()) Die("allocate", object.status());
      std::memset(*object, static_cast<int>(0x41 + i), kObjectBytes);
      offsets.push_back((*heap)->offset_of(*object));
    }
    if (absl::Status s = (*heap)->sync().status(); !s.ok()) Die("sync", s);
    if (absl::Status s = (*heap)->detach(); !s.ok()) Die("detach", s);
  }
  std::printf("filled and synced %llu GiB in %.1f s\n", static_cast<unsigned long long>(objects),
              Seconds(Clock::now() - fill_start));
  const std::string data = daemon.state_dir() + "/heaps/big/data";
  std::vector<double> opens, reads;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    double read_s = 0;
    Clock::time_point restart;
    absl::Status restarted = daemon.Restart(
        [&] {
          DropCaches();
          read_s = DdReadSeconds(data);
          DropCaches();
          restart = Clock::now();
        },
        /*wait_s=*/1200);
    if (!restarted.ok()) Die("restart", restarted);
    // heapd takes connections before its heaps are open; it answers calls
    // once they are.
    absl::StatusOr<v1::HeapStats> stats = StatHeap(daemon.client(), "big");
    if (!stats.ok()) Die("stat", stats.status());
    const double open_s = Seconds(Clock::now() - restart);
    const double bytes = static_cast<double>(stats->info().capacity_bytes());
    std::printf("rep %d: open %.2f s (%.0f MB/s of %.1f GiB), dd read %.2f s (%.0f MB/s)\n",
                rep + 1, open_s, bytes / open_s / 1e6, bytes / (1 << 30), read_s,
                bytes / read_s / 1e6);
    std::fflush(stdout);
    opens.push_back(bytes / open_s / 1e6);
    reads.push_back(bytes / read_s / 1e6);
  }
  // The contents survived: a read-only attach checks both ends of each object.
  {
    AttachOptions options;
    options.read_only = true;
    absl::StatusOr<std::unique_ptr<Heap>> heap = daemon.client().Attach("big", options);
    if (!heap.ok()) Die("attach read-only", heap.status());
    for (uint64_t i = 0; i < offsets.size(); ++i) {
      const char* object = (*heap)->at<char>(offsets[i]);
      if (object[0] != static_cast<char>(0x41 + i) ||
          object[kObjectBytes - 1] != static_cast<char>(0x41 + i)) {
        Die("check", absl::DataLossError(absl::StrCat("object ", i, " lost its bytes")));
      }
    }
  }
  std::printf("medians: open %.0f MB/s, device read (dd) %.0f MB/s: %.2fx\n", Median(opens),
              Median(reads), Median(opens) / Median(reads));
  return 0;
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return heapd::Main();
}
