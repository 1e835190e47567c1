#include "util/run_as.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "util/dir_files.h"
#include "util/errno_status.h"

extern char** environ;

namespace heapd {
namespace {

// Wire format on the SOCK_SEQPACKET pair, both ways: one packet per part,
// its first byte the part's kind.
constexpr char kPart = 'C';   // a part of a message; more follow
constexpr char kLast = 'M';   // the last part of a message (may carry fds)
constexpr char kError = 'E';  // the job failed: status code byte, message
constexpr char kFds = 'F';    // heapd to helper, after the request: the lent fds
constexpr size_t kPartBytes = 32 << 10;
constexpr size_t kMaxFdsPerMessage = 16;

// How heapd asks a spawned copy of itself to be a helper.
constexpr char kHelperFlag[] = "--heapd_run_as_helper";
// The helper's descriptors as spawned: its end of the socket pair, and the
// executable (only while it is executed: the helper closes it first).
constexpr int kChannelFd = 3;
constexpr int kExecutableFd = 4;
constexpr char kExecutablePath[] = "/proc/self/fd/4";

// Exit statuses of a helper that did not get as far as its job.
constexpr int kHeapdGone = 123;
constexpr int kBadRequest = 124;
constexpr int kNoCredentials = 125;

// glibc 2.36's <sys/pidfd.h> declares these without C linkage: called
// directly.
int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSendSignal(int pidfd, int signal) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}

// The executable, opened by StartedAsRunAsHelper; -1 before.
std::atomic<int> executable_fd{-1};

// Filled at static initialization, read only afterwards.
std::map<std::string, RunAsJob>& Jobs() {
  static auto* jobs = new std::map<std::string, RunAsJob>();
  return *jobs;
}

bool SendPacket(int socket, char kind, absl::string_view bytes, const std::vector<int>& fds,
                int flags) {
  std::string packet(1, kind);
  packet.append(bytes.data(), bytes.size());
  iovec iov{packet.data(), packet.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  if (!fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    if (sendmsg(socket, &message, MSG_NOSIGNAL | flags) == static_cast<ssize_t>(packet.size())) {
      return true;
    }
    if (errno != EINTR) return false;
  }
}

// Reads one packet into `packet`, appending its fds to `fds`. Returns the
// number of bytes, 0 at the end, -1 on error (errno set; EPROTO for a
// truncated packet).
ssize_t ReceivePacket(int socket, std::string* packet, std::vector<UniqueFd>* fds, int flags) {
  packet->resize(kPartBytes + 1);
  iovec iov{packet->data(), packet->size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC | flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
       header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
      fds->emplace_back(received);
    }
  }
  if ((message.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    errno = EPROTO;
    return -1;
  }
  packet->resize(static_cast<size_t>(n));
  return n;
}

// The helper's end: sends each message in parts, blocking.
class HelperChannel final : public MessageSink {
 public:
  absl::Status Send(absl::string_view bytes, int fd = -1) override {
    do {
      const absl::string_view part = bytes.substr(0, kPartBytes);
      bytes.remove_prefix(part.size());
      const bool last = bytes.empty();
      std::vector<int> fds;
      if (last && fd >= 0) fds.push_back(fd);
      if (!SendPacket(kChannelFd, last ? kLast : kPart, part, fds, 0)) {
        return ErrnoStatus(errno, "send to heapd");
      }
    } while (!bytes.empty());
    return absl::OkStatus();
  }
};

// Becomes `who` for good: groups first (it needs privilege), the uid last.
bool SwitchCredentials(const Credentials& who) {
  const std::vector<gid_t> groups(who.groups.begin(), who.groups.end());
  if (setgroups(groups.size(), groups.data()) != 0) return false;
  if (setresgid(who.gid, who.gid, who.gid) != 0) return false;
  if (setresuid(who.uid, who.uid, who.uid) != 0) return false;
  uid_t r, e, s;
  return getresuid(&r, &e, &s) == 0 && r == who.uid && e == who.uid && s == who.uid;
}

// The request as sent to the helper: who, which job, where, then the
// job's own arguments; the lent descriptors ride with its last part.
std::string EncodeRequest(const Credentials& who, const RunAsRequest& request) {
  ArgsWriter writer;
  writer.Add(static_cast<uint64_t>(getpid()));
  writer.Add(who.uid).Add(who.gid).Add(who.groups.size());
  for (uint32_t group : who.groups) writer.Add(group);
  writer.Add(request.job->name).Add(request.dir);
  writer.Add(static_cast<uint64_t>(request.forbidden_device));
  writer.Add(static_cast<uint64_t>(request.forbidden_inode));
  writer.Add(request.args);
  return writer.Take();
}

struct DecodedRequest {
  pid_t parent = 0;
  Credentials who;
  std::string job;
  std::string dir;
  uint64_t forbidden_device = 0;
  uint64_t forbidden_inode = 0;
  std::string args;
};

bool DecodeRequest(absl::string_view bytes, DecodedRequest* request) {
  ArgsReader reader(bytes);
  uint64_t parent = 0, uid = 0, gid = 0, groups = 0;
  if (!reader.Next(&parent) || !reader.Next(&uid) || !reader.Next(&gid) || !reader.Next(&groups) ||
      groups > 65536) {
    return false;
  }
  request->parent = static_cast<pid_t>(parent);
  request->who.uid = static_cast<uint32_t>(uid);
  request->who.gid = static_cast<uint32_t>(gid);
  for (uint64_t i = 0; i < groups; ++i) {
    uint64_t group = 0;
    if (!reader.Next(&group)) return false;
    request->who.groups.push_back(static_cast<uint32_t>(group));
  }
  return reader.Next(&request->job) && reader.Next(&request->dir) &&
         reader.Next(&request->forbidden_device) && reader.Next(&request->forbidden_inode) &&
         reader.Next(&request->args) && reader.Done();
}

// Opens the job's directory as the user, refusing heapd's own.
absl::StatusOr<UniqueFd> OpenJobDirectory(const DecodedRequest& request) {
  open_how how{};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  UniqueFd dir(
      static_cast<int>(syscall(SYS_openat2, AT_FDCWD, request.dir.c_str(), &how, sizeof(how))));
  if (!dir.valid()) return ErrnoStatus(errno, absl::StrCat("open directory ", request.dir));
  if (request.forbidden_inode != 0 &&
      IsWithinDirectory(dir.get(), static_cast<dev_t>(request.forbidden_device),
                        static_cast<ino_t>(request.forbidden_inode))) {
    return absl::InvalidArgumentError(
        absl::StrCat("directory ", request.dir, " is inside heapd's state directory"));
  }
  return dir;
}

// The parent's side of one helper: its socket and pidfd, and what ends the
// wait for it.
class Helper {
 public:
  Helper(UniqueFd socket, UniqueFd pidfd, const RunAsOptions& options)
      : socket_(std::move(socket)),
        pidfd_(std::move(pidfd)),
        options_(options),
        deadline_(absl::Now() + options.timeout) {}

  // Waits until the socket has `events` (or hung up). OK then; otherwise
  // why the helper is to be given up on.
  absl::Status Wait(short events) {
    for (;;) {
      pollfd polled[2] = {{socket_.get(), events, 0}, {options_.cancel_fd, POLLIN, 0}};
      const absl::Duration left = deadline_ - absl::Now();
      const int wait_ms =
          static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 0, 100));
      const int ready = poll(polled, options_.cancel_fd >= 0 ? 2 : 1, wait_ms);
      if (ready < 0 && errno != EINTR) {
        return ErrnoStatus(errno, absl::StrCat(options_.what, ": poll"));
      }
      if (options_.cancel_fd >= 0 && polled[1].revents != 0) {
        return absl::UnavailableError(absl::StrCat(options_.what, ": heapd is stopping"));
      }
      if (options_.cancelled && options_.cancelled()) {
        return absl::CancelledError(absl::StrCat(options_.what, ": the call was cancelled"));
      }
      if (polled[0].revents != 0) return absl::OkStatus();
      if (absl::Now() >= deadline_) {
        return absl::DeadlineExceededError(absl::StrCat(options_.what, ": did not finish within ",
                                                        absl::FormatDuration(options_.timeout)));
      }
    }
  }

  // Sends the request, then the lent descriptors in a packet of their own
  // (the helper takes them only once it is the user and not dumpable). A
  // helper gone meanwhile is not an error here: its exit status says why.
  absl::Status SendRequest(absl::string_view bytes, const std::vector<int>& fds) {
    bool last = false;
    while (!last) {
      const absl::string_view part = bytes.substr(0, kPartBytes);
      last = bytes.size() == part.size();
      if (absl::Status s = SendPacket(last ? kLast : kPart, part, {}); !s.ok()) return s;
      bytes.remove_prefix(part.size());
    }
    return SendPacket(kFds, "", fds);
  }

  // Receives messages until the helper closes its end. `failure` gets the
  // job's error, if it sent one.
  absl::Status Receive(std::vector<ChildMessage>* messages, absl::Status* failure) {
    ChildMessage current;
    uint64_t received = 0;
    uint64_t budgeted = 0;  // of options_.budget, given back at the end
    absl::Status interruption;
    for (;;) {
      if (interruption = Wait(POLLIN); !interruption.ok()) break;
      std::string packet;
      std::vector<UniqueFd> fds;
      const ssize_t n = ReceivePacket(socket_.get(), &packet, &fds, MSG_DONTWAIT);
      if (n < 0 && errno == EAGAIN) continue;
      if (n == 0) break;  // the helper is gone: judged by its exit
      if (n < 0) {
        // A truncated packet (heapd out of descriptors for the one sent)
        // or a failed receive: the helper may still be sending.
        interruption = ErrnoStatus(errno, absl::StrCat(options_.what, ": receive from the helper"));
        break;
      }
      received += static_cast<uint64_t>(n);
      if (received > options_.max_reply_bytes) {
        interruption = absl::ResourceExhaustedError(absl::StrCat(
            options_.what, ": more than ", options_.max_reply_bytes, " bytes to read"));
        break;
      }
      if (options_.budget != nullptr &&
          options_.budget->used.fetch_add(static_cast<uint64_t>(n)) + static_cast<uint64_t>(n) >
              options_.budget->limit) {
        options_.budget->used.fetch_sub(static_cast<uint64_t>(n));
        interruption = absl::ResourceExhaustedError(absl::StrCat(
            options_.what, ": heapd is reading too much for other calls at once; try again"));
        break;
      }
      budgeted += static_cast<uint64_t>(n);
      const absl::string_view body = absl::string_view(packet).substr(1);
      if (packet[0] == kError && !body.empty()) {
        const int code = static_cast<unsigned char>(body[0]);
        *failure = absl::Status(code >= 1 && code <= 16 ? static_cast<absl::StatusCode>(code)
                                                        : absl::StatusCode::kInternal,
                                body.substr(1));
      } else if (packet[0] == kPart || packet[0] == kLast) {
        current.bytes.append(body.data(), body.size());
        if (!fds.empty()) current.fd = std::move(fds.front());
        if (packet[0] == kLast) messages->push_back(std::exchange(current, ChildMessage{}));
      }
    }
    if (options_.budget != nullptr) options_.budget->used.fetch_sub(budgeted);
    return interruption;
  }

  void Kill() { PidfdSendSignal(pidfd_.get(), SIGKILL); }

  // Reaps the helper once it exits: by the deadline, or, once `killed` (or
  // killed here at the deadline), within kKilledExitGrace (a process in
  // uninterruptible I/O, a hung NFS server, dies only when that ends).
  // Past that it is left behind: DEADLINE_EXCEEDED.
  absl::StatusOr<siginfo_t> Reap(bool killed) {
    if (!killed && !Exited(deadline_)) {
      Kill();
      killed = true;
    }
    if (killed && !Exited(absl::Now() + kKilledExitGrace)) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.what, ": the helper did not exit when killed; it is left behind"));
    }
    siginfo_t info{};
    while (waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED) != 0 &&
           errno == EINTR) {
    }
    return info;
  }

 private:
  static constexpr absl::Duration kKilledExitGrace = absl::Seconds(10);

  absl::Status SendPacket(char kind, absl::string_view bytes, const std::vector<int>& fds) {
    for (;;) {
      if (heapd::SendPacket(socket_.get(), kind, bytes, fds, MSG_DONTWAIT)) {
        return absl::OkStatus();
      }
      if (errno == EPIPE || errno == ECONNRESET) return absl::OkStatus();  // judged by its exit
      if (errno != EAGAIN) {
        return ErrnoStatus(errno, absl::StrCat(options_.what, ": send the helper its request"));
      }
      if (absl::Status s = Wait(POLLOUT); !s.ok()) return s;
    }
  }

  // True once the helper exited (its pidfd readable) before `until`.
  bool Exited(absl::Time until) {
    for (;;) {
      pollfd exited{pidfd_.get(), POLLIN, 0};
      const int64_t left_ms = absl::ToInt64Milliseconds(until - absl::Now());
      const int ready =
          poll(&exited, 1, static_cast<int>(std::clamp<int64_t>(left_ms + 1, 0, 1000)));
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
      if (absl::Now() >= until) return false;
    }
  }

  UniqueFd socket_;
  UniqueFd pidfd_;
  const RunAsOptions& options_;
  const absl::Time deadline_;
};

// Spawns a helper whose end of the channel is `theirs`; its pid or an
// errno.
int SpawnHelperHere(int theirs, pid_t* pid) {
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
  char name[] = "heapd-run-as";
  char flag[sizeof(kHelperFlag)];
  std::memcpy(flag, kHelperFlag, sizeof(flag));
  char* argv[] = {name, flag, nullptr};
  int error = posix_spawn_file_actions_adddup2(&actions, theirs, kChannelFd);
  if (error == 0) {
    error = posix_spawn_file_actions_adddup2(&actions, executable_fd.load(), kExecutableFd);
  }
  if (error == 0) error = posix_spawn_file_actions_addclosefrom_np(&actions, kExecutableFd + 1);
  // heapd blocks SIGTERM for sigwait: the helper starts with no signal
  // blocked and every disposition at its default.
  if (error == 0) error = posix_spawnattr_setsigmask(&attributes, &none);
  if (error == 0) error = posix_spawnattr_setsigdefault(&attributes, &all);
  if (error == 0) {
    error = posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  if (error == 0) error = posix_spawn(pid, kExecutablePath, &actions, &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  return error;
}

// Spawns every helper of this process from one thread that lives as long
// as the process: a helper's parent-death signal fires when the thread
// that spawned it exits, and gRPC retires idle threads. A forked child
// (tests) gets a thread of its own.
class Spawner {
 public:
  static Spawner& OfThisProcess() {
    static absl::Mutex mu(absl::kConstInit);
    static Spawner* spawner = nullptr;
    absl::MutexLock lock(&mu);
    if (spawner == nullptr || spawner->pid_ != getpid()) spawner = new Spawner();  // never freed
    return *spawner;
  }

  // The helper's pid, or an errno.
  int Spawn(int theirs, pid_t* pid) {
    Request request{theirs, pid};
    absl::MutexLock lock(&mu_);
    queue_.push_back(&request);
    mu_.Await(absl::Condition(&request.done));
    return request.error;
  }

 private:
  struct Request {
    int theirs;
    pid_t* pid;
    int error = 0;
    bool done = false;
  };

  Spawner() : pid_(getpid()) {
    std::thread([this] { Run(); }).detach();
  }

  [[noreturn]] void Run() {
    for (;;) {
      Request* request;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](std::deque<Request*>* queue) { return !queue->empty(); }, &queue_));
        request = queue_.front();
        queue_.pop_front();
      }
      const int error = SpawnHelperHere(request->theirs, request->pid);
      absl::MutexLock lock(&mu_);
      request->error = error;
      request->done = true;
    }
  }

  const pid_t pid_;
  absl::Mutex mu_;
  std::deque<Request*> queue_ ABSL_GUARDED_BY(mu_);
};

// Spawns a helper whose end of the channel is `theirs`; its pidfd.
absl::StatusOr<UniqueFd> SpawnHelper(int theirs, const std::string& what) {
  pid_t pid = -1;
  if (const int error = Spawner::OfThisProcess().Spawn(theirs, &pid); error != 0) {
    return ErrnoStatus(error, absl::StrCat(what, ": spawn a helper"));
  }
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) {
    // Not reaped yet, so the pid is still the helper's.
    const int open_error = errno;
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return ErrnoStatus(open_error, absl::StrCat(what, ": pidfd_open"));
  }
  return pidfd;
}

}  // namespace

RunAsJob RegisterRunAsJob(const RunAsJob& job) {
  if (!Jobs().emplace(job.name, job).second) {
    std::fprintf(stderr, "RunAs job %s registered twice\n", job.name);
    std::abort();
  }
  return job;
}

absl::Status MessageList::Send(absl::string_view bytes, int fd) {
  ChildMessage message{std::string(bytes), UniqueFd()};
  if (fd >= 0) {
    message.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 3));
    if (!message.fd.valid()) return ErrnoStatus(errno, "duplicate a descriptor");
  }
  messages_.push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChildMessage>> RunJobHere(const RunAsJob& job, int dir,
                                                     const std::vector<int>& fds,
                                                     absl::string_view args) {
  JobInput input;
  input.dir = dir;
  input.fds = fds;
  input.args = ArgsReader(args);
  MessageList here;
  if (absl::Status s = job.run(input, here); !s.ok()) return s;
  return std::move(here.messages());
}

absl::StatusOr<std::vector<ChildMessage>> RunAs(const Credentials& who, const RunAsRequest& request,
                                                const RunAsOptions& options) {
  if (executable_fd.load() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.what,
                     ": this program cannot spawn helpers (its main() does not start with "
                     "StartedAsRunAsHelper)"));
  }
  if (request.job == nullptr || Jobs().count(request.job->name) == 0 ||
      request.fds.size() > kMaxFdsPerMessage) {
    return absl::InternalError(absl::StrCat(options.what, ": no such job, or too many fds"));
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return ErrnoStatus(errno, absl::StrCat(options.what, ": socketpair"));
  }
  UniqueFd ours(pair[0]);
  // Above the helper's fixed descriptors, so that placing them there
  // cannot overwrite it.
  UniqueFd theirs(fcntl(pair[1], F_DUPFD_CLOEXEC, kExecutableFd + 1));
  close(pair[1]);
  if (!theirs.valid()) return ErrnoStatus(errno, absl::StrCat(options.what, ": dup"));
  absl::StatusOr<UniqueFd> pidfd = SpawnHelper(theirs.get(), options.what);
  if (!pidfd.ok()) return pidfd.status();
  theirs.reset();

  Helper helper(std::move(ours), *std::move(pidfd), options);
  std::vector<ChildMessage> messages;
  absl::Status failure;  // set when the job reported an error
  absl::Status interruption = helper.SendRequest(EncodeRequest(who, request), request.fds);
  if (interruption.ok()) interruption = helper.Receive(&messages, &failure);
  if (!interruption.ok()) helper.Kill();
  const absl::StatusOr<siginfo_t> reaped = helper.Reap(/*killed=*/!interruption.ok());
  if (!interruption.ok()) return interruption;
  if (!reaped.ok()) return reaped.status();
  const siginfo_t& exit = *reaped;
  if (!failure.ok()) return failure;
  if (exit.si_code == CLD_EXITED && exit.si_status == 0) return messages;
  if (exit.si_code == CLD_EXITED && exit.si_status == kNoCredentials) {
    return absl::InternalError(
        absl::StrCat(options.what, ": could not switch to uid ", who.uid, " gid ", who.gid));
  }
  return absl::AbortedError(absl::StrCat(
      options.what, ": the process working as uid ", who.uid, " ",
      exit.si_code == CLD_EXITED ? absl::StrCat("exited with status ", exit.si_status)
                                 : absl::StrCat("was killed by signal ", exit.si_status)));
}

bool StartedAsRunAsHelper(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], kHelperFlag) == 0) return true;
  // /proc/self/exe names the image running now even once a newer package
  // replaced the file; kept above the helper's fixed descriptors.
  const int fd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
  if (fd >= 0) {
    executable_fd.store(fcntl(fd, F_DUPFD_CLOEXEC, kExecutableFd + 1));
    close(fd);
  }
  return false;
}

namespace {

int RunHelper() {
  close(kExecutableFd);
  prctl(PR_SET_NAME, "heapd-run-as");
  // The helper works for the user: it must not keep heapd's shelter from
  // the OOM killer (--oom_score_adj), so memory it takes, its request
  // first, is the user's.
  if (const int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); adj >= 0) {
    (void)!write(adj, "0", 1);
    close(adj);
  }
  std::string request_bytes;
  std::vector<UniqueFd> none;
  for (;;) {
    std::string packet;
    if (ReceivePacket(kChannelFd, &packet, &none, 0) <= 0 || !none.empty()) return kBadRequest;
    request_bytes.append(packet, 1, std::string::npos);
    if (packet[0] == kLast) break;
    if (packet[0] != kPart) return kBadRequest;
  }
  DecodedRequest request;
  if (!DecodeRequest(request_bytes, &request)) return kBadRequest;
  request_bytes = std::string();
  umask(077);
  // heapd's working directory may be one the user cannot reach; the helper
  // must not start there (a target of /proc/self/cwd would lead into it).
  if (chdir("/") != 0) return kNoCredentials;
  if (!SwitchCredentials(request.who)) return kNoCredentials;
  // The credential change set "dumpable" to fs.suid_dumpable: cleared
  // before the lent descriptors are taken, so the user can neither trace
  // the helper nor reach them through /proc.
  if (prctl(PR_SET_DUMPABLE, 0) != 0) return kNoCredentials;
  // Killed with the thread that spawned it: RunAs spawns from one thread
  // that lives as long as heapd (a gRPC thread may be retired meanwhile),
  // so this means heapd died. It also kills a helper the user stopped.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != request.parent) return kHeapdGone;
  std::vector<UniqueFd> fds;
  std::string packet;
  if (ReceivePacket(kChannelFd, &packet, &fds, 0) <= 0 || packet.size() != 1 || packet[0] != kFds) {
    return kBadRequest;
  }
  // A file-size limit (RLIMIT_FSIZE) fails a write with EFBIG, an error
  // the job reports, instead of killing it; a closed channel is EPIPE.
  signal(SIGXFSZ, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  // heapd's end of the channel closes only when the RunAs call is gone
  // (heapd kills a helper it gives up on, so: a process that forked and
  // died, as tests do, or heapd itself): the work is then for no one.
  std::thread([] {
    pollfd channel{kChannelFd, POLLRDHUP, 0};
    while (poll(&channel, 1, -1) < 0 && errno == EINTR) {
    }
    _exit(kHeapdGone);
  }).detach();

  absl::Status status;
  const auto job = Jobs().find(request.job);
  UniqueFd dir;
  if (job == Jobs().end()) {
    status = absl::InternalError(absl::StrCat("no job ", request.job, " in this executable"));
  } else if (!request.dir.empty()) {
    absl::StatusOr<UniqueFd> opened = OpenJobDirectory(request);
    if (opened.ok()) {
      dir = *std::move(opened);
    } else {
      status = opened.status();
    }
  }
  if (status.ok()) {
    JobInput input;
    input.dir = dir.get();
    for (const UniqueFd& fd : fds) input.fds.push_back(fd.get());
    input.args = ArgsReader(request.args);
    HelperChannel channel;
    status = job->second.run(input, channel);
  }
  if (!status.ok()) {
    std::string error(1, static_cast<char>(status.code()));
    const absl::string_view message = status.message().substr(0, kPartBytes - 2);
    error.append(message.data(), message.size());
    SendPacket(kChannelFd, kError, error, {}, 0);
  }
  return status.ok() ? 0 : 1;
}

}  // namespace

int RunAsHelperMain() {
  // No static destructors with the watchdog thread still running.
  const int status = RunHelper();
  std::fflush(nullptr);
  _exit(status);
}

}  // namespace heapd
