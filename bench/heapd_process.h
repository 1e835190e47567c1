// A heapd of a benchmark's own: started on tmpfs (/dev/shm) with the flags
// the benchmark asks for, connected to, stopped and removed with its
// directory when destroyed. Shared by daemon_bench and update_bench.
#ifndef HEAPD_BENCH_HEAPD_PROCESS_H_
#define HEAPD_BENCH_HEAPD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "heapd/client.h"

namespace heapd {

class HeapdProcess {
 public:
  // Starts `binary` with --state_dir and --runtime_dir in a new directory
  // `parent`/heapd-bench-XXXXXX (tmpfs by default; a file system's
  // directory gives heaps with a working image), --log_level=warn and
  // `flags`, and waits (up to 4 s) until it answers on its socket. With
  // `huge_pages`, the directory is a tmpfs of its own mounted
  // huge=within_size (2 MiB pages; needs root), unmounted when this is
  // destroyed.
  static absl::StatusOr<std::unique_ptr<HeapdProcess>> Start(
      const std::string& binary, const std::vector<std::string>& flags, bool huge_pages = false,
      const std::string& parent = "/dev/shm");
  // Closes the client, stops heapd (SIGTERM), waits for it and removes the
  // directory. Heaps attached through client() must be gone by then.
  ~HeapdProcess();

  // Stops heapd (SIGTERM: it syncs every heap) and, once it exited, runs
  // `while_down`, then starts it again on the same directories and waits
  // up to `wait_s` seconds until it answers (it opens every heap first).
  // Heaps attached through client() must be gone.
  absl::Status Restart(const std::function<void()>& while_down, int wait_s);
  HeapdProcess(const HeapdProcess&) = delete;
  HeapdProcess& operator=(const HeapdProcess&) = delete;

  Client& client() { return *client_; }
  const std::string& dir() const { return dir_; }  // scratch space too
  pid_t pid() const { return pid_; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string socket() const { return dir_ + "/run/heapd.sock"; }

 private:
  HeapdProcess() = default;
  // Starts heapd with argv_ and waits up to `wait_s` until it answers.
  absl::Status Spawn(int wait_s);
  std::vector<std::string> argv_;
  pid_t pid_ = -1;
  std::string dir_;
  bool mounted_ = false;
  std::unique_ptr<Client> client_;
};

// Removes heap `name` through `client`, if it exists (an error is ignored:
// the benchmarks call it to start clean and to free tmpfs pages).
void RemoveHeap(Client& client, const std::string& name);

// The median (the upper one of an even count). REQUIRES: !values.empty().
double Median(std::vector<double> values);

}  // namespace heapd

#endif  // HEAPD_BENCH_HEAPD_PROCESS_H_
