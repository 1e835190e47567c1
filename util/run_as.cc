#include "util/run_as.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace heapd {
namespace {

// Wire format on the SOCK_SEQPACKET pair: one packet per part, its first
// byte the part's kind.
constexpr char kPart = 'C';   // a part of a message; more follow
constexpr char kLast = 'M';   // the last part of a message (may carry an fd)
constexpr char kError = 'E';  // the work failed: status code byte, message
constexpr size_t kPartBytes = 32 << 10;
// Exit status of a child whose credentials could not be switched.
constexpr int kNoCredentials = 125;

absl::Status SysError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool SendPacket(int socket, char kind, absl::string_view bytes, int fd) {
  std::string packet(1, kind);
  packet.append(bytes.data(), bytes.size());
  iovec iov{packet.data(), packet.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  for (;;) {
    if (sendmsg(socket, &message, MSG_NOSIGNAL) == static_cast<ssize_t>(packet.size())) return true;
    if (errno != EINTR) return false;
  }
}

// Closes every descriptor above 2 except those in `keep`.
void CloseAllBut(std::vector<int> keep) {
  std::sort(keep.begin(), keep.end());
  unsigned first = 3;
  for (int fd : keep) {
    if (fd < 3) continue;
    if (static_cast<unsigned>(fd) > first) close_range(first, static_cast<unsigned>(fd) - 1, 0);
    first = static_cast<unsigned>(fd) + 1;
  }
  close_range(first, ~0U, 0);
}

// Becomes `who` for good: groups first (it needs privilege), the uid last.
// Raw system calls: they change this thread's credentials only, which is
// the whole process in a fork's child.
bool SwitchCredentials(const Credentials& who) {
  const std::vector<gid_t> groups(who.groups.begin(), who.groups.end());
  if (syscall(SYS_setgroups, groups.size(), groups.data()) != 0) return false;
  if (syscall(SYS_setresgid, who.gid, who.gid, who.gid) != 0) return false;
  if (syscall(SYS_setresuid, who.uid, who.uid, who.uid) != 0) return false;
  uid_t r, e, s;
  return getresuid(&r, &e, &s) == 0 && r == who.uid && e == who.uid && s == who.uid;
}

[[noreturn]] void RunChild(const Credentials& who, const std::vector<int>& keep_fds, int socket,
                           pid_t parent,
                           const std::function<absl::Status(MessageSink& channel)>& work) {
  std::vector<int> keep = keep_fds;
  keep.push_back(socket);
  CloseAllBut(keep);
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);  // the daemon blocks SIGTERM for sigwait
  umask(077);
  // heapd's working directory may be one the user cannot reach; the child
  // must not start there (a target of /proc/self/cwd would lead into it).
  if (chdir("/") != 0) _exit(kNoCredentials);
  // The child works for the user: it must not keep heapd's shelter from
  // the OOM killer (--oom_score_adj), so memory it takes is the user's.
  if (const int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); adj >= 0) {
    (void)!write(adj, "0", 1);
    close(adj);
  }
  if (!SwitchCredentials(who)) _exit(kNoCredentials);
  // Cleared by the credential change, so set after it; a parent that died
  // already is caught by the getppid check.
  prctl(PR_SET_DUMPABLE, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(kNoCredentials);
  ChildChannel channel(socket);
  const absl::Status status = work(channel);
  if (!status.ok()) {
    std::string error(1, static_cast<char>(status.code()));
    const absl::string_view message = status.message().substr(0, kPartBytes - 2);
    error.append(message.data(), message.size());
    SendPacket(socket, kError, error, -1);
  }
  _exit(status.ok() ? 0 : 1);
}

// Reads one packet into `packet`; its fd (if any) into `fd`. Returns the
// number of bytes, 0 at the end, -1 on error.
ssize_t ReceivePacket(int socket, std::string* packet, UniqueFd* fd) {
  packet->resize(kPartBytes + 1);
  iovec iov{packet->data(), packet->size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return -1;
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
       header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
      if (!fd->valid()) {
        fd->reset(received);
      } else {
        close(received);
      }
    }
  }
  if ((message.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) return -1;
  packet->resize(static_cast<size_t>(n));
  return n;
}

}  // namespace

absl::Status ChildChannel::Send(absl::string_view bytes, int fd) {
  do {
    const absl::string_view part = bytes.substr(0, kPartBytes);
    bytes.remove_prefix(part.size());
    const bool last = bytes.empty();
    if (!SendPacket(socket_, last ? kLast : kPart, part, last ? fd : -1)) {
      return SysError("send to heapd");
    }
  } while (!bytes.empty());
  return absl::OkStatus();
}

absl::Status MessageList::Send(absl::string_view bytes, int fd) {
  ChildMessage message{std::string(bytes), UniqueFd()};
  if (fd >= 0) {
    message.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 3));
    if (!message.fd.valid()) return SysError("duplicate a descriptor");
  }
  messages_.push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChildMessage>> RunAs(
    const Credentials& who, const std::vector<int>& keep_fds, const RunAsOptions& options,
    const std::function<absl::Status(MessageSink& channel)>& work) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return SysError(absl::StrCat(options.what, ": socketpair"));
  }
  UniqueFd ours(pair[0]);
  UniqueFd theirs(pair[1]);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return SysError(absl::StrCat(options.what, ": fork"));
  if (pid == 0) RunChild(who, keep_fds, theirs.get(), parent, work);
  theirs.reset();

  std::vector<ChildMessage> messages;
  ChildMessage current;
  absl::Status failure;       // set when the child reported an error
  absl::Status interruption;  // set when the parent gave up on the child
  uint64_t received = 0;
  uint64_t budgeted = 0;  // of options.budget, given back when the call ends
  const absl::Time deadline = absl::Now() + options.timeout;
  for (;;) {
    pollfd polled[2] = {{ours.get(), POLLIN, 0}, {options.cancel_fd, POLLIN, 0}};
    const absl::Duration left = deadline - absl::Now();
    const int wait_ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 0, 100));
    const int ready = poll(polled, options.cancel_fd >= 0 ? 2 : 1, wait_ms);
    if (ready < 0 && errno != EINTR) {
      interruption = SysError(absl::StrCat(options.what, ": poll"));
      break;
    }
    if (options.cancel_fd >= 0 && polled[1].revents != 0) {
      interruption = absl::UnavailableError(absl::StrCat(options.what, ": heapd is stopping"));
      break;
    }
    if (options.cancelled && options.cancelled()) {
      interruption = absl::CancelledError(absl::StrCat(options.what, ": the call was cancelled"));
      break;
    }
    if (absl::Now() >= deadline && polled[0].revents == 0) {
      interruption = absl::DeadlineExceededError(absl::StrCat(
          options.what, ": did not finish within ", absl::FormatDuration(options.timeout)));
      break;
    }
    if (polled[0].revents == 0) continue;
    std::string packet;
    UniqueFd fd;
    const ssize_t n = ReceivePacket(ours.get(), &packet, &fd);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;  // the child is gone (or sent garbage): judged by its exit below
    received += static_cast<uint64_t>(n);
    if (received > options.max_reply_bytes) {
      interruption = absl::ResourceExhaustedError(
          absl::StrCat(options.what, ": more than ", options.max_reply_bytes, " bytes to read"));
      break;
    }
    if (options.budget != nullptr &&
        options.budget->used.fetch_add(static_cast<uint64_t>(n)) + static_cast<uint64_t>(n) >
            options.budget->limit) {
      options.budget->used.fetch_sub(static_cast<uint64_t>(n));
      interruption = absl::ResourceExhaustedError(absl::StrCat(
          options.what, ": heapd is reading too much for other calls at once; try again"));
      break;
    }
    budgeted += static_cast<uint64_t>(n);
    const absl::string_view body = absl::string_view(packet).substr(1);
    if (packet[0] == kError && !body.empty()) {
      const int code = static_cast<unsigned char>(body[0]);
      failure = absl::Status(code >= 1 && code <= 16 ? static_cast<absl::StatusCode>(code)
                                                     : absl::StatusCode::kInternal,
                             body.substr(1));
    } else if (packet[0] == kPart || packet[0] == kLast) {
      current.bytes.append(body.data(), body.size());
      if (fd.valid()) current.fd = std::move(fd);
      if (packet[0] == kLast) messages.push_back(std::exchange(current, ChildMessage{}));
    }
  }
  if (options.budget != nullptr) options.budget->used.fetch_sub(budgeted);
  if (!interruption.ok()) kill(pid, SIGKILL);
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (!interruption.ok()) return interruption;
  if (!failure.ok()) return failure;
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return messages;
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kNoCredentials) {
    return absl::InternalError(
        absl::StrCat(options.what, ": could not switch to uid ", who.uid, " gid ", who.gid));
  }
  return absl::AbortedError(absl::StrCat(
      options.what, ": the process working as uid ", who.uid, " ",
      WIFSIGNALED(wait_status) ? absl::StrCat("was killed by signal ", WTERMSIG(wait_status))
                               : absl::StrCat("exited with status ", WEXITSTATUS(wait_status))));
}

}  // namespace heapd
