#include "testing/test_daemon.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace heapd {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
  pid_t pid = -1;
  const int error = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    std::fprintf(stderr, "cannot start %s: %s\n", args[0], std::strerror(error));
    std::abort();
  }
  return pid;
}

bool CanConnect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

}  // namespace

std::string Runfile(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    std::fprintf(stderr, "runfile %s not found\n", path.c_str());
    std::abort();
  }
  return resolved;
}

bool ChildResult::Exited(int code) const {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code;
}

bool ChildResult::KilledBy(int signal) const {
  return WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == signal;
}

Child::Child(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) std::abort();
  pid_ = Spawn(argv, pipe_fds[1]);
  close(pipe_fds[1]);
  out_fd_ = pipe_fds[0];
}

Child::~Child() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool Child::WaitForOutput(const std::string& text, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (output_.find(text) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd polled{out_fd_, POLLIN, 0};
    if (poll(&polled, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(out_fd_, buffer, sizeof(buffer));
    if (n <= 0) return output_.find(text) != std::string::npos;
    output_.append(buffer, static_cast<size_t>(n));
  }
  return true;
}

void Child::Kill(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

ChildResult Child::Wait() {
  char buffer[4096];
  ssize_t n;
  while ((n = read(out_fd_, buffer, sizeof(buffer))) > 0) output_.append(buffer, n);
  ChildResult result;
  waitpid(pid_, &result.wait_status, 0);
  pid_ = -1;
  result.output = output_;
  return result;
}

ChildResult RunChild(const std::vector<std::string>& argv) { return Child(argv).Wait(); }

TestDaemon::TestDaemon(std::vector<std::string> extra_flags, std::string state_parent)
    : dir_("/tmp"), extra_flags_(std::move(extra_flags)) {
  chmod(dir_.path().c_str(), 0755);
  if (!state_parent.empty()) {
    state_parent_ = std::make_unique<TestDir>(state_parent);
    chmod(state_parent_->path().c_str(), 0755);
  }
}

TestDaemon::~TestDaemon() {
  if (pid_ > 0) Stop();
}

void TestDaemon::Start() {
  // HEAPD_TEST_DAEMON runs the tests against another heapd binary (an older
  // build, to show a test fails there).
  const char* other = getenv("HEAPD_TEST_DAEMON");
  std::vector<std::string> argv = launcher_;
  for (const std::string& arg :
       {other != nullptr && other[0] != '\0' ? std::string(other) : Runfile("daemon/heapd"),
        "--state_dir=" + (state_parent_ ? state_parent_->Sub("state") : dir_.Sub("state")),
        "--runtime_dir=" + dir_.Sub("run"), std::string("--log_level=debug")}) {
    argv.push_back(arg);
  }
  argv.insert(argv.end(), extra_flags_.begin(), extra_flags_.end());
  const int log =
      open(dir_.Sub("heapd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  unlink(socket().c_str());
  const size_t earlier_log = Log().size();  // of an earlier start of this daemon
  pid_ = Spawn(argv, log);
  close(log);
  // Started: it says it serves (its threads run by then), and both
  // sockets take connections.
  for (int i = 0; i < 500; ++i) {
    if (Log().find("heapd serving", earlier_log) != std::string::npos && CanConnect(socket()) &&
        CanConnect(fd_socket())) {
      return;
    }
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "heapd did not start:\n%s\n", Log().c_str());
  std::abort();
}

int TestDaemon::Stop() {
  int status = 0;
  kill(pid_, SIGTERM);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

void TestDaemon::Crash() {
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string TestDaemon::Log() const {
  std::ifstream in(dir_.Sub("heapd.log"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace heapd
