#include "util/run_as_spawner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "util/errno_status.h"
#include "util/run_as_packets.h"
#include "util/running_thread.h"

extern char** environ;

namespace heapd {
namespace run_as_internal {
namespace {

// Packets heapd and the spawner exchange.
constexpr char kForkRequest = 'S';  // heapd: fork a helper; fds: channel, status
constexpr char kForked = 'P';       // spawner, on status: forked; fd: its pidfd
constexpr char kForkFailed = 'E';   // spawner, on status: fork failed; body: errno
constexpr char kReaped = 'X';       // spawner, on status: reaped; body: wait status

// How a program asks a copy of itself to be the spawner: the flag, then
// the pid of the process that starts it.
constexpr char kSpawnerFlag[] = "--heapd_run_as_spawner";
// The spawner's descriptors as started: its end of the control socket, and
// the executable (only while it is executed: the spawner closes it first).
constexpr int kControlFd = 3;
constexpr int kExecutableFd = 4;
constexpr char kExecutablePath[] = "/proc/self/fd/4";

// How long heapd waits for its spawner to take a request or answer one
// before it counts the spawner as hung and replaces it.
constexpr absl::Duration kSpawnerPatience = absl::Seconds(10);

// The running executable; -1 before OpenExecutable.
std::atomic<int> executable_fd{-1};
// In the spawner: the pid that started it.
pid_t spawner_parent = 0;

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSendSignal(int pidfd, int signal) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}

// True once `fd` is readable (or hung up) before `until`.
bool Readable(int fd, absl::Time until) {
  for (;;) {
    pollfd polled{fd, POLLIN, 0};
    const int64_t left_ms = absl::ToInt64Milliseconds(until - absl::Now());
    const int ready = poll(&polled, 1, static_cast<int>(std::clamp<int64_t>(left_ms + 1, 0, 1000)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
    if (absl::Now() >= until) return false;
  }
}

// ---- The spawner process ----

// Forks a helper for a request's `channel`, answering on `status`. The
// child keeps only fds 0-2 and its channel, with no signal blocked.
void ForkHelper(UniqueFd channel, UniqueFd status, std::map<pid_t, UniqueFd>* status_of,
                int (*helper_main)(pid_t spawner)) {
  const pid_t spawner = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Dies with the spawner from here on (until its credentials change,
    // which clears this; the helper sets it again).
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != spawner) _exit(127);
    // The channel replaces the control socket (kControlFd): a helper must
    // never hold it (it could ask for a helper of any uid).
    static_assert(kHelperChannelFd == kControlFd,
                  "the channel must take the control socket's place");
    if (dup2(channel.get(), kHelperChannelFd) != kHelperChannelFd) _exit(127);
    if (close_range(kHelperChannelFd + 1, ~0U, 0) != 0) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const int exit_status = helper_main(spawner);
    std::fflush(nullptr);
    _exit(exit_status);
  }
  if (pid < 0) {
    const int error = errno;
    SendPacket(status.get(), kForkFailed, std::string(reinterpret_cast<const char*>(&error), 4), {},
               0);
    return;
  }
  // Not reaped before this loop's next turn, so the pid is still the
  // helper's.
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) {
    const int error = errno;
    kill(pid, SIGKILL);  // reaped with the others; no one waits for it
    SendPacket(status.get(), kForkFailed, std::string(reinterpret_cast<const char*>(&error), 4), {},
               0);
    return;
  }
  SendPacket(status.get(), kForked, "", {pidfd.get()}, 0);
  status_of->emplace(pid, std::move(status));
}

// Reaps every exited helper, telling heapd each one's wait status.
void ReapHelpers(std::map<pid_t, UniqueFd>* status_of) {
  int wait_status;
  pid_t pid;
  while ((pid = waitpid(-1, &wait_status, WNOHANG)) > 0) {
    const auto it = status_of->find(pid);
    if (it == status_of->end()) continue;
    SendPacket(it->second.get(), kReaped,
               std::string(reinterpret_cast<const char*>(&wait_status), sizeof(wait_status)), {},
               0);
    status_of->erase(it);  // closes heapd's status socket: nothing more comes
  }
}

}  // namespace

bool IsSpawnerInvocation(int argc, char** argv) {
  int parent = 0;
  if (argc != 3 || std::strcmp(argv[1], kSpawnerFlag) != 0 || !absl::SimpleAtoi(argv[2], &parent)) {
    return false;
  }
  spawner_parent = parent;
  return true;
}

void RunSpawner(int (*helper_main)(pid_t spawner)) {
  close(kExecutableFd);
  prctl(PR_SET_NAME, "heapd-spawner");
  // Killed with the thread that started it, which lives as long as its
  // process; checked after, in case that process died first.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != spawner_parent) _exit(1);
  if (chdir("/") != 0) _exit(1);
  sigset_t child_exits;
  sigemptyset(&child_exits);
  sigaddset(&child_exits, SIGCHLD);
  sigprocmask(SIG_BLOCK, &child_exits, nullptr);
  const UniqueFd exits(signalfd(-1, &child_exits, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!exits.valid()) _exit(1);
  std::map<pid_t, UniqueFd> status_of;
  for (;;) {
    pollfd polled[2] = {{kControlFd, POLLIN, 0}, {exits.get(), POLLIN, 0}};
    if (poll(polled, 2, -1) < 0) {
      if (errno == EINTR) continue;
      _exit(1);
    }
    if (polled[1].revents != 0) {
      signalfd_siginfo drained[8];
      while (read(exits.get(), drained, sizeof(drained)) > 0) {
      }
      ReapHelpers(&status_of);
    }
    if (polled[0].revents == 0) continue;
    std::string packet;
    std::vector<UniqueFd> fds;
    const ssize_t n = ReceivePacket(kControlFd, &packet, &fds, 0);
    if (n == 0 || (n < 0 && errno != EPROTO)) _exit(0);  // heapd closed its end
    if (n == 1 && packet[0] == kForkRequest && fds.size() == 2) {
      ForkHelper(std::move(fds[0]), std::move(fds[1]), &status_of, helper_main);
    }
  }
}

namespace {

// ---- heapd's side ----

// Runs work on one thread that lives as long as the process: the
// spawner's parent-death signal fires when the thread that started it
// exits, and gRPC retires idle threads.
class LongLivedThread {
 public:
  LongLivedThread() {
    StartRunningThread([this] { Serve(); }).detach();
  }

  void Run(const std::function<void()>& work) {
    Job job{&work};
    absl::MutexLock lock(&mu_);
    queue_.push_back(&job);
    mu_.Await(absl::Condition(&job.done));
  }

 private:
  struct Job {
    const std::function<void()>* work;
    bool done = false;
  };

  [[noreturn]] void Serve() {
    for (;;) {
      Job* job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<Job*>* queue) { return !queue->empty(); }, &queue_));
        job = queue_.front();
        queue_.pop_front();
      }
      (*job->work)();
      absl::MutexLock lock(&mu_);
      job->done = true;
    }
  }

  absl::Mutex mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
};

// A running spawner: heapd's end of its control socket, and its pidfd.
struct Spawner {
  UniqueFd control;
  UniqueFd pidfd;

  bool Alive() const {
    pollfd exited{pidfd.get(), POLLIN, 0};
    return poll(&exited, 1, 0) == 0;
  }
};

// Starts a spawner (on `thread`): its pidfd and control socket, or an errno.
int ExecuteSpawner(Spawner* spawner) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return errno;
  spawner->control.reset(pair[0]);
  const UniqueFd theirs(pair[1]);
  const timeval patience{absl::ToInt64Seconds(kSpawnerPatience), 0};
  setsockopt(spawner->control.get(), SOL_SOCKET, SO_SNDTIMEO, &patience, sizeof(patience));
  posix_spawn_file_actions_t actions;
  if (const int error = posix_spawn_file_actions_init(&actions); error != 0) return error;
  posix_spawnattr_t attributes;
  if (const int error = posix_spawnattr_init(&attributes); error != 0) {
    posix_spawn_file_actions_destroy(&actions);
    return error;
  }
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  char name[] = "heapd-spawner";
  char flag[sizeof(kSpawnerFlag)];
  std::memcpy(flag, kSpawnerFlag, sizeof(flag));
  std::string parent = std::to_string(getpid());
  char* argv[] = {name, flag, parent.data(), nullptr};
  int error = posix_spawn_file_actions_adddup2(&actions, theirs.get(), kControlFd);
  if (error == 0) {
    error = posix_spawn_file_actions_adddup2(&actions, executable_fd.load(), kExecutableFd);
  }
  if (error == 0) error = posix_spawn_file_actions_addclosefrom_np(&actions, kExecutableFd + 1);
  // heapd blocks SIGTERM for sigwait: the spawner, and so every helper,
  // starts with no signal blocked and every disposition at its default.
  if (error == 0) error = posix_spawnattr_setsigmask(&attributes, &none);
  if (error == 0) error = posix_spawnattr_setsigdefault(&attributes, &all);
  if (error == 0) {
    error = posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  pid_t pid = -1;
  if (error == 0) error = posix_spawn(&pid, kExecutablePath, &actions, &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) return error;
  spawner->pidfd.reset(PidfdOpen(pid));
  if (!spawner->pidfd.valid()) {
    error = errno;
    kill(pid, SIGKILL);  // not reaped yet: the pid is still the spawner's
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return error;
  }
  return 0;
}

// This process's spawner, started on first use and again after it died.
// A forked child (tests) gets one of its own.
class SpawnerOfThisProcess {
 public:
  static SpawnerOfThisProcess& Get() {
    static absl::Mutex mu(absl::kConstInit);
    static SpawnerOfThisProcess* current = nullptr;
    absl::MutexLock lock(&mu);
    if (current == nullptr || current->pid_ != getpid()) {
      if (current != nullptr) current->CloseInheritedDescriptors();
      current = new SpawnerOfThisProcess();  // never freed: its thread runs on
    }
    return *current;
  }

  absl::StatusOr<SpawnedHelper> Spawn(int channel, absl::string_view what) {
    // A spawner found dead before it took the request is replaced once:
    // the request never reached it, so no helper holds `channel`. One that
    // dies after taking it fails this call only (its helpers died with it).
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<std::shared_ptr<Spawner>> spawner = Running(what);
      if (!spawner.ok()) return spawner.status();
      bool not_taken = false;
      absl::StatusOr<SpawnedHelper> helper = Ask(**spawner, channel, what, &not_taken);
      if (helper.ok() || (*spawner)->Alive()) return helper;
      Replace(*spawner);
      if (!not_taken || attempt == 1) return helper;
    }
  }

  // The running spawner, started if there is none or it died.
  absl::StatusOr<std::shared_ptr<Spawner>> Running(absl::string_view what) {
    absl::MutexLock lock(&mu_);
    if (spawner_ != nullptr && spawner_->Alive()) return spawner_;
    if (spawner_ != nullptr) Stop(*spawner_);
    auto started = std::make_shared<Spawner>();
    int error = 0;
    thread_.Run([&] { error = ExecuteSpawner(started.get()); });
    if (error != 0) {
      spawner_ = nullptr;
      return ErrnoStatus(error, absl::StrCat(what, ": start the helpers' spawner"));
    }
    spawner_ = started;
    return spawner_;
  }

 private:
  SpawnerOfThisProcess() : pid_(getpid()) {}

  // In a forked child: the parent's spawner is not this process's; its
  // descriptors go. Its lock is not taken: the thread that held it at the
  // fork, if any, does not exist here, and nothing else reaches this
  // object any more.
  void CloseInheritedDescriptors() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (spawner_ == nullptr) return;
    spawner_->control.reset();
    spawner_->pidfd.reset();
  }

  // Stops and reaps `spawner` if it is still this process's current one.
  void Replace(const std::shared_ptr<Spawner>& spawner) {
    absl::MutexLock lock(&mu_);
    if (spawner_ != spawner) return;
    Stop(*spawner_);
    spawner_ = nullptr;
  }

  // Kills `spawner` and reaps it once it exited, waiting a bounded time (a
  // process in uninterruptible sleep dies only when that ends: then it is
  // left a zombie).
  static void Stop(const Spawner& spawner) {
    PidfdSendSignal(spawner.pidfd.get(), SIGKILL);
    pollfd exited{spawner.pidfd.get(), POLLIN, 0};
    if (poll(&exited, 1, static_cast<int>(absl::ToInt64Milliseconds(kSpawnerPatience))) <= 0) {
      return;
    }
    siginfo_t info;
    while (waitid(P_PIDFD, static_cast<id_t>(spawner.pidfd.get()), &info, WEXITED | WNOHANG) != 0 &&
           errno == EINTR) {
    }
  }

  // Sends the request; returns the helper or why not. `not_taken`: the
  // spawner did not receive the request (it had closed its end).
  static absl::StatusOr<SpawnedHelper> Ask(const Spawner& spawner, int channel,
                                           absl::string_view what, bool* not_taken) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
      return ErrnoStatus(errno, absl::StrCat(what, ": socketpair"));
    }
    SpawnedHelper helper;
    helper.status.reset(pair[0]);
    {
      // Closed once sent: if the spawner dies, the status socket ends.
      const UniqueFd theirs(pair[1]);
      if (!SendPacket(spawner.control.get(), kForkRequest, "", {channel, theirs.get()}, 0)) {
        *not_taken = errno == EPIPE || errno == ECONNRESET;
        return ErrnoStatus(errno, absl::StrCat(what, ": ask the helpers' spawner for a helper"));
      }
    }
    if (!Readable(helper.status.get(), absl::Now() + kSpawnerPatience)) {
      return absl::UnavailableError(absl::StrCat(what,
                                                 ": the helpers' spawner did not answer within ",
                                                 absl::FormatDuration(kSpawnerPatience)));
    }
    std::string packet;
    std::vector<UniqueFd> fds;
    const ssize_t n = ReceivePacket(helper.status.get(), &packet, &fds, MSG_DONTWAIT);
    if (n == 1 && packet[0] == kForked && fds.size() == 1) {
      helper.pidfd = std::move(fds[0]);
      return helper;
    }
    if (n == 5 && packet[0] == kForkFailed) {
      int error;
      std::memcpy(&error, packet.data() + 1, sizeof(error));
      return ErrnoStatus(error, absl::StrCat(what, ": fork a helper"));
    }
    if (n < 0) {
      // heapd out of descriptors for the pidfd, say. The helper, if forked,
      // ends when heapd closes its channel.
      return ErrnoStatus(errno, absl::StrCat(what, ": receive the helper's pidfd"));
    }
    return absl::UnavailableError(absl::StrCat(what, ": the helpers' spawner died"));
  }

  const pid_t pid_;
  LongLivedThread thread_;
  absl::Mutex mu_;
  std::shared_ptr<Spawner> spawner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status StartSpawner(absl::string_view what) {
  return SpawnerOfThisProcess::Get().Running(what).status();
}

absl::StatusOr<SpawnedHelper> SpawnHelper(int channel, absl::string_view what) {
  return SpawnerOfThisProcess::Get().Spawn(channel, what);
}

void KillHelper(const SpawnedHelper& helper) { PidfdSendSignal(helper.pidfd.get(), SIGKILL); }

bool HelperExited(const SpawnedHelper& helper, absl::Time until) {
  return Readable(helper.pidfd.get(), until);
}

absl::StatusOr<int> ReapedStatus(const SpawnedHelper& helper, absl::string_view what) {
  if (!Readable(helper.status.get(), absl::Now() + kSpawnerPatience)) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the helpers' spawner did not report the helper's exit"));
  }
  std::string packet;
  std::vector<UniqueFd> fds;
  const ssize_t n = ReceivePacket(helper.status.get(), &packet, &fds, MSG_DONTWAIT);
  int wait_status;
  if (n != 1 + static_cast<ssize_t>(sizeof(wait_status)) || packet[0] != kReaped) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the helpers' spawner died before the helper's exit"));
  }
  std::memcpy(&wait_status, packet.data() + 1, sizeof(wait_status));
  return wait_status;
}

bool OpenExecutable() {
  // /proc/self/exe names the image running now even once a newer package
  // replaced the file; kept above the spawner's fixed descriptors.
  const int fd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
  if (fd < 0) return false;
  executable_fd.store(fcntl(fd, F_DUPFD_CLOEXEC, kExecutableFd + 1));
  close(fd);
  return executable_fd.load() >= 0;
}

bool ExecutableOpened() { return executable_fd.load() >= 0; }

}  // namespace run_as_internal
}  // namespace heapd
