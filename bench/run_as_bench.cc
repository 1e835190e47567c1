// What a RunAs call costs from request to reaped helper (util/run_as.h):
// each call has the spawner fork a helper that switches to a user, runs a
// job that sends one byte back, and exits. Median of `--calls` calls, and
// the first call apart (it starts the spawner). Needs root (the helper
// switches credentials).
//
//   bazel run -c opt //bench:run_as_bench -- --calls=200
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/run_as.h"

namespace heapd {
namespace {

absl::Status SendOneByte(JobInput&, MessageSink& out) { return out.Send("x"); }
HEAPD_RUN_AS_JOB(kSendOneByte, "bench.one_byte", SendOneByte);

double CallMicroseconds() {
  RunAsRequest request;
  request.job = &kSendOneByte;
  const auto start = std::chrono::steady_clock::now();
  const auto messages = RunAs(Credentials{65534, 65534, {}}, request, {});
  const auto end = std::chrono::steady_clock::now();
  if (!messages.ok()) {
    std::fprintf(stderr, "%s\n", std::string(messages.status().message()).c_str());
    std::exit(1);
  }
  return std::chrono::duration<double, std::micro>(end - start).count();
}

}  // namespace
}  // namespace heapd

int main(int argc, char** argv) {
  if (heapd::StartedAsRunAsHelper(argc, argv)) return heapd::RunAsHelperMain();
  int calls = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--calls=", 8) == 0) calls = std::atoi(argv[i] + 8);
  }
  if (geteuid() != 0 || calls < 1) {
    std::fprintf(stderr, "run_as_bench: run as root, --calls=N (N >= 1)\n");
    return 2;
  }
  const double first = heapd::CallMicroseconds();
  std::vector<double> times;
  for (int i = 0; i < calls; ++i) times.push_back(heapd::CallMicroseconds());
  std::sort(times.begin(), times.end());
  std::printf("first call (starts the spawner): %.0f us\n", first);
  std::printf("median of %d calls: %.0f us (p10 %.0f, p90 %.0f)\n", calls, times[times.size() / 2],
              times[times.size() / 10], times[times.size() * 9 / 10]);
  return 0;
}
