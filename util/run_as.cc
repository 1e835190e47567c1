#include "util/run_as.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <malloc.h>
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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "util/dir_files.h"
#include "util/errno_status.h"
#include "util/run_as_packets.h"
#include "util/run_as_spawner.h"

namespace heapd {
namespace {

// A helper's malloc: blocks below this come from its arenas, and freed
// memory above it is kept (see RunHelper).
constexpr int kHelperMmapThreshold = 32 << 20;
constexpr int kHelperTrimThreshold = 256 << 20;

// Exit statuses of a helper that did not get as far as its job.
constexpr int kHeapdGone = 123;
constexpr int kBadRequest = 124;
constexpr int kNoCredentials = 125;

// Filled at static initialization, read only afterwards.
std::map<std::string, RunAsJob>& Jobs() {
  static auto* jobs = new std::map<std::string, RunAsJob>();
  return *jobs;
}

// A message as the packet that carries it: its bytes inline if they fit,
// else in a sealed memfd lent first, then the message's own fd, if any.
struct MessagePacket {
  char kind = kInlineMessage;
  std::string bytes;
  UniqueFd sealed;
  std::vector<int> fds;
};

absl::StatusOr<MessagePacket> PackMessage(const std::vector<absl::string_view>& pieces, int fd) {
  MessagePacket packet;
  size_t size = 0;
  for (absl::string_view piece : pieces) size += piece.size();
  if (size <= kPacketBodyBytes) {
    for (absl::string_view piece : pieces) packet.bytes.append(piece.data(), piece.size());
  } else {
    packet.kind = kSealedMessage;
    packet.sealed = SealedBytes(pieces);
    if (!packet.sealed.valid()) {
      return ErrnoStatus(errno,
                         absl::StrCat("put a message of ", size, " bytes in a sealed memfd"));
    }
    packet.fds.push_back(packet.sealed.get());
  }
  if (fd >= 0) packet.fds.push_back(fd);
  return packet;
}

// The helper's end: sends each message as one packet, blocking.
class HelperChannel final : public MessageSink {
 public:
  absl::Status Send(absl::string_view bytes, int fd = -1) override {
    absl::StatusOr<MessagePacket> packet = PackMessage({bytes}, fd);
    if (!packet.ok()) return packet.status();
    if (!SendPacket(kHelperChannelFd, packet->kind, packet->bytes, packet->fds, 0)) {
      return ErrnoStatus(errno, "send to heapd");
    }
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
// job's own arguments (as ArgsWriter::Add writes a string: their size, here,
// then request.args itself, not copied). The lent descriptors follow in a
// packet of their own.
std::string RequestHeader(const Credentials& who, const RunAsRequest& request) {
  ArgsWriter writer;
  writer.Add(who.uid).Add(who.gid).Add(who.groups.size());
  for (uint32_t group : who.groups) writer.Add(group);
  writer.Add(request.job->name).Add(request.dir);
  writer.Add(static_cast<uint64_t>(request.forbidden.size()));
  for (const auto& [device, inode] : request.forbidden) {
    writer.Add(static_cast<uint64_t>(device)).Add(static_cast<uint64_t>(inode));
  }
  writer.Add(static_cast<uint64_t>(request.args.size()));
  return writer.Take();
}

struct DecodedRequest {
  Credentials who;
  std::string job;
  std::string dir;
  std::vector<std::pair<uint64_t, uint64_t>> forbidden;  // (device, inode)
  absl::string_view args;                                // into the request's bytes
};

bool DecodeRequest(absl::string_view bytes, DecodedRequest* request) {
  ArgsReader reader(bytes);
  uint64_t uid = 0, gid = 0, groups = 0;
  if (!reader.Next(&uid) || !reader.Next(&gid) || !reader.Next(&groups) || groups > 65536) {
    return false;
  }
  request->who.uid = static_cast<uint32_t>(uid);
  request->who.gid = static_cast<uint32_t>(gid);
  for (uint64_t i = 0; i < groups; ++i) {
    uint64_t group = 0;
    if (!reader.Next(&group)) return false;
    request->who.groups.push_back(static_cast<uint32_t>(group));
  }
  uint64_t forbidden = 0;
  if (!reader.Next(&request->job) || !reader.Next(&request->dir) || !reader.Next(&forbidden) ||
      forbidden > 1024) {
    return false;
  }
  for (uint64_t i = 0; i < forbidden; ++i) {
    uint64_t device = 0, inode = 0;
    if (!reader.Next(&device) || !reader.Next(&inode)) return false;
    request->forbidden.emplace_back(device, inode);
  }
  return reader.Next(&request->args) && reader.Done();
}

// Opens the job's directory as the user, refusing heapd's own.
absl::StatusOr<UniqueFd> OpenJobDirectory(const DecodedRequest& request) {
  open_how how{};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  UniqueFd dir(
      static_cast<int>(syscall(SYS_openat2, AT_FDCWD, request.dir.c_str(), &how, sizeof(how))));
  if (!dir.valid()) return ErrnoStatus(errno, absl::StrCat("open directory ", request.dir));
  for (const auto& [device, inode] : request.forbidden) {
    if (IsWithinDirectory(dir.get(), static_cast<dev_t>(device), static_cast<ino_t>(inode))) {
      return absl::InvalidArgumentError(
          absl::StrCat("directory ", request.dir, " is inside heapd's own directories"));
    }
  }
  return dir;
}

// heapd's side of one helper: its channel, its pidfd and status socket from
// the spawner, and what ends the wait for it.
class Helper {
 public:
  Helper(UniqueFd socket, run_as_internal::SpawnedHelper spawned, const RunAsOptions& options)
      : socket_(std::move(socket)),
        spawned_(std::move(spawned)),
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
  absl::Status SendRequest(const std::vector<absl::string_view>& pieces,
                           const std::vector<int>& fds) {
    absl::StatusOr<MessagePacket> request = PackMessage(pieces, -1);
    if (!request.ok()) return request.status();
    if (absl::Status s = SendPacket(request->kind, request->bytes, request->fds); !s.ok()) {
      return s;
    }
    return SendPacket(kLentFds, "", fds);
  }

  // Receives messages until the helper closes its end. `failure` gets the
  // job's error, if it sent one.
  absl::Status Receive(std::vector<ChildMessage>* messages, absl::Status* failure) {
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
      // A sealed message counts with its bytes, checked before they are read.
      const bool sealed = packet[0] == kSealedMessage;
      uint64_t sealed_size = 0;
      if (sealed) {
        absl::StatusOr<uint64_t> size =
            fds.empty() ? absl::FailedPreconditionError(
                              absl::StrCat(options_.what, ": a sealed message without its memfd"))
                        : SealedSize(fds[0].get(), options_.what);
        if (interruption = size.status(); !interruption.ok()) break;
        sealed_size = *size;
      }
      if (interruption = Count(static_cast<uint64_t>(n) + sealed_size, &received, &budgeted);
          !interruption.ok()) {
        break;
      }
      const absl::string_view body = absl::string_view(packet).substr(1);
      if (packet[0] == kJobError && !body.empty()) {
        const int code = static_cast<unsigned char>(body[0]);
        *failure = absl::Status(code >= 1 && code <= 16 ? static_cast<absl::StatusCode>(code)
                                                        : absl::StatusCode::kInternal,
                                body.substr(1));
      } else if (packet[0] == kInlineMessage || sealed) {
        ChildMessage message;
        if (sealed) {
          interruption = ReadSealedBytes(fds[0].get(), sealed_size, options_.what, &message.bytes);
          if (!interruption.ok()) break;
        } else {
          message.bytes.assign(body.data(), body.size());
        }
        const size_t own_fd = sealed ? 1 : 0;  // the message's fd follows its memfd
        if (fds.size() > own_fd) message.fd = std::move(fds[own_fd]);
        messages->push_back(std::move(message));
      }
    }
    if (options_.budget != nullptr) options_.budget->used.fetch_sub(budgeted);
    return interruption;
  }

  void Kill() { run_as_internal::KillHelper(spawned_); }

  // Reaps the helper once it exits: by the deadline, or, once `killed` (or
  // killed here at the deadline), within kKilledExitGrace (a process in
  // uninterruptible I/O, a hung NFS server, dies only when that ends).
  // Past that it is left behind: DEADLINE_EXCEEDED. Returns its wait
  // status (the spawner reaps it).
  absl::StatusOr<int> Reap(bool killed) {
    using run_as_internal::HelperExited;
    if (!killed && !HelperExited(spawned_, deadline_)) {
      Kill();
      killed = true;
    }
    if (killed && !HelperExited(spawned_, absl::Now() + kKilledExitGrace)) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.what, ": the helper did not exit when killed; it is left behind"));
    }
    return run_as_internal::ReapedStatus(spawned_, options_.what);
  }

 private:
  static constexpr absl::Duration kKilledExitGrace = absl::Seconds(10);

  // Counts `bytes` more received against the call's cap and the heapd-wide
  // budget (`budgeted`: this call's share, given back when it ends).
  absl::Status Count(uint64_t bytes, uint64_t* received, uint64_t* budgeted) {
    *received += bytes;
    if (*received > options_.max_reply_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options_.what, ": more than ", options_.max_reply_bytes, " bytes to read"));
    }
    if (options_.budget != nullptr &&
        options_.budget->used.fetch_add(bytes) + bytes > options_.budget->limit) {
      options_.budget->used.fetch_sub(bytes);
      return absl::ResourceExhaustedError(absl::StrCat(
          options_.what, ": heapd is reading too much for other calls at once; try again"));
    }
    *budgeted += bytes;
    return absl::OkStatus();
  }

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

  UniqueFd socket_;
  run_as_internal::SpawnedHelper spawned_;
  const RunAsOptions& options_;
  const absl::Time deadline_;
};

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
  if (!run_as_internal::ExecutableOpened()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.what,
                     ": this program cannot spawn helpers (its main() does not start with "
                     "StartedAsRunAsHelper)"));
  }
  if (request.job == nullptr || Jobs().count(request.job->name) == 0 ||
      request.fds.size() > kMaxFdsPerPacket) {
    return absl::InternalError(absl::StrCat(options.what, ": no such job, or too many fds"));
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return ErrnoStatus(errno, absl::StrCat(options.what, ": socketpair"));
  }
  UniqueFd ours(pair[0]);
  UniqueFd theirs(pair[1]);
  absl::StatusOr<run_as_internal::SpawnedHelper> spawned =
      run_as_internal::SpawnHelper(theirs.get(), options.what);
  if (!spawned.ok()) return spawned.status();
  theirs.reset();

  Helper helper(std::move(ours), *std::move(spawned), options);
  std::vector<ChildMessage> messages;
  absl::Status failure;  // set when the job reported an error
  const std::string header = RequestHeader(who, request);
  absl::Status interruption = helper.SendRequest({header, request.args}, request.fds);
  if (interruption.ok()) interruption = helper.Receive(&messages, &failure);
  if (!interruption.ok()) helper.Kill();
  const absl::StatusOr<int> reaped = helper.Reap(/*killed=*/!interruption.ok());
  if (!interruption.ok()) return interruption;
  if (!reaped.ok()) return reaped.status();
  const int exit = *reaped;
  if (!failure.ok()) return failure;
  if (WIFEXITED(exit) && WEXITSTATUS(exit) == 0) return messages;
  if (WIFEXITED(exit) && WEXITSTATUS(exit) == kNoCredentials) {
    return absl::InternalError(
        absl::StrCat(options.what, ": could not switch to uid ", who.uid, " gid ", who.gid));
  }
  return absl::AbortedError(
      absl::StrCat(options.what, ": the process working as uid ", who.uid, " ",
                   WIFEXITED(exit) ? absl::StrCat("exited with status ", WEXITSTATUS(exit))
                                   : absl::StrCat("was killed by signal ", WTERMSIG(exit))));
}

absl::Status StartRunAsSpawner() {
  if (!run_as_internal::ExecutableOpened()) {
    return absl::FailedPreconditionError(
        "this program cannot spawn helpers (its main() does not start with StartedAsRunAsHelper)");
  }
  return run_as_internal::StartSpawner("start the helpers' spawner");
}

bool StartedAsRunAsHelper(int argc, char** argv) {
  if (run_as_internal::IsSpawnerInvocation(argc, argv)) return true;
  run_as_internal::OpenExecutable();
  return false;
}

namespace {

// Whether a tracer is attached to this process (or that cannot be read).
bool Traced() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return true;
  char line[256];
  long tracer = -1;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "TracerPid: %ld", &tracer) == 1) break;
  }
  std::fclose(status);
  return tracer != 0;
}

// A helper's whole life, forked by the spawner `spawner`.
int RunHelper(pid_t spawner) {
  prctl(PR_SET_NAME, "heapd-run-as");
  // The helper works for the user: it must not keep heapd's shelter from
  // the OOM killer (--oom_score_adj), so memory it takes is the user's.
  if (const int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); adj >= 0) {
    (void)!write(adj, "0", 1);
    close(adj);
  }
  // The request, read in place: the job's arguments are views into it.
  std::string packet;  // an inline request
  SealedMapping sealed_request;
  absl::string_view request_bytes;
  {
    std::vector<UniqueFd> sealed;
    if (ReceivePacket(kHelperChannelFd, &packet, &sealed, 0) <= 0) return kBadRequest;
    if (packet[0] == kInlineMessage && sealed.empty()) {
      request_bytes = absl::string_view(packet).substr(1);
    } else if (packet[0] == kSealedMessage && sealed.size() == 1) {
      const absl::StatusOr<uint64_t> size = SealedSize(sealed[0].get(), "request");
      if (!size.ok()) return kBadRequest;
      absl::StatusOr<SealedMapping> mapped = SealedMapping::Map(sealed[0].get(), *size, "request");
      if (!mapped.ok()) return kBadRequest;
      sealed_request = *std::move(mapped);
      request_bytes = sealed_request.bytes();
    } else {
      return kBadRequest;
    }
  }
  DecodedRequest request;
  if (!DecodeRequest(request_bytes, &request)) return kBadRequest;
  umask(077);
  // heapd's working directory may be one the user cannot reach; the helper
  // must not start there (a target of /proc/self/cwd would lead into it).
  if (chdir("/") != 0) return kNoCredentials;
  if (!SwitchCredentials(request.who)) return kNoCredentials;
  // The credential change set "dumpable" to fs.suid_dumpable: cleared
  // before the lent descriptors are taken, so the user can neither trace
  // the helper nor reach them through /proc.
  if (prctl(PR_SET_DUMPABLE, 0) != 0) return kNoCredentials;
  // With fs.suid_dumpable=1 the user could attach between the switch and
  // the line above; a tracer stays attached: refuse then.
  if (Traced()) return kNoCredentials;
  // Killed with the spawner, which dies with heapd: then the work is for
  // no one. It also kills a helper the user stopped.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != spawner) return kHeapdGone;
  std::vector<UniqueFd> fds;
  std::string fds_packet;
  if (ReceivePacket(kHelperChannelFd, &fds_packet, &fds, 0) <= 0 || fds_packet.size() != 1 ||
      fds_packet[0] != kLentFds) {
    return kBadRequest;
  }
  // A file-size limit (RLIMIT_FSIZE) fails a write with EFBIG, an error
  // the job reports, instead of killing it; a closed channel is EPIPE.
  signal(SIGXFSZ, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  // A helper lives for one job: memory it frees is kept for its next
  // allocation instead of going back to the kernel and being faulted in
  // again page by page (~6 us a fault in a VM; a store job allocates a
  // block's buffers for every block).
  mallopt(M_MMAP_THRESHOLD, kHelperMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kHelperTrimThreshold);
  // heapd's end of the channel closes only when the RunAs call is gone
  // (heapd kills a helper it gives up on, so: a process that forked and
  // died, as tests do, or heapd itself): the work is then for no one.
  std::thread([] {
    pollfd channel{kHelperChannelFd, POLLRDHUP, 0};
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
    const absl::string_view message = status.message().substr(0, kPacketBodyBytes - 2);
    error.append(message.data(), message.size());
    SendPacket(kHelperChannelFd, kJobError, error, {}, 0);
  }
  return status.ok() ? 0 : 1;
}

}  // namespace

int RunAsHelperMain() { run_as_internal::RunSpawner(RunHelper); }

}  // namespace heapd
