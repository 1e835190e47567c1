// Test helpers that run real processes: a heapd daemon on sockets in a
// short directory under /tmp (socket paths must fit 107 bytes), and child
// programs whose output is captured. Everything started is stopped by PID
// when the helper goes away.
#ifndef HEAPD_TESTING_TEST_DAEMON_H_
#define HEAPD_TESTING_TEST_DAEMON_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "heap/test_dir.h"

namespace heapd {

// The absolute path of a file among the test's runfiles, e.g.
// "daemon/heapd".
std::string Runfile(const std::string& path);

struct ChildResult {
  int wait_status = 0;  // as from waitpid
  std::string output;   // stdout and stderr

  bool Exited(int code) const;
  bool KilledBy(int signal) const;
};

// A child process with its stdout and stderr on a pipe.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv);
  ~Child();  // kills and reaps the child if it still runs
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `text` appears or the child closes its output;
  // true if it appeared.
  bool WaitForOutput(const std::string& text, int timeout_ms = 30000);
  void Kill(int signal);
  ChildResult Wait();
  // What the child printed so far (as read by WaitForOutput).
  const std::string& output() const { return output_; }  // reads the rest of the output and reaps

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string output_;
};

// Runs `argv` to completion.
ChildResult RunChild(const std::vector<std::string>& argv);

// heapd on its own state and runtime directories.
class TestDaemon {
 public:
  // `extra_flags` go to heapd as they are. The directories are world
  // readable so unprivileged test users can reach the sockets.
  // `state_parent`: where heapd's state directory (its heaps) goes, e.g.
  // /dev/shm for heaps on tmpfs (default: beside the sockets, under /tmp).
  explicit TestDaemon(std::vector<std::string> extra_flags = {}, std::string state_parent = "");
  ~TestDaemon();

  // Starts heapd and waits until it answers; aborts the test run if not.
  void Start();
  // Runs heapd under `launcher` (a command that execs its arguments, e.g.
  // prlimit), from the next Start.
  void set_launcher(std::vector<std::string> launcher) { launcher_ = std::move(launcher); }
  // Replaces the extra flags, from the next Start.
  void set_extra_flags(std::vector<std::string> flags) { extra_flags_ = std::move(flags); }
  // SIGTERM and wait; returns heapd's wait status.
  int Stop();
  // SIGKILL and reap (a daemon crash).
  void Crash();

  std::string socket() const { return dir_.Sub("run/heapd.sock"); }
  std::string fd_socket() const { return dir_.Sub("run/heapd.fd.sock"); }
  const TestDir& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  // The daemon's log so far.
  std::string Log() const;

 private:
  TestDir dir_;
  std::unique_ptr<TestDir> state_parent_;  // set when the state is elsewhere
  std::vector<std::string> extra_flags_;
  std::vector<std::string> launcher_;
  pid_t pid_ = -1;
};

}  // namespace heapd

#endif  // HEAPD_TESTING_TEST_DAEMON_H_
