#include "daemon/grpc_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/unix_listener.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"
#include "util/running_thread.h"

namespace heapd {
namespace {

// How long accepting pauses when the process is out of descriptors.
constexpr int kOutOfDescriptorsPauseMs = 100;

}  // namespace

GrpcListener::GrpcListener(int listen_fd, grpc::Server* server, uint32_t max_per_user,
                           std::function<void()> refused)
    : listen_fd_(listen_fd),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      server_(server),
      max_per_user_(max_per_user),
      refused_(std::move(refused)) {}

GrpcListener::~GrpcListener() { StopAccepting(); }

void GrpcListener::Start() {
  thread_ = StartRunningThread([this] { Run(); });
}

void GrpcListener::StopAccepting() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(wake_fd_);
  close(listen_fd_);
}

void GrpcListener::Run() {
  int pause_ms = -1;  // set while out of descriptors
  for (;;) {
    pollfd polled[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    // While paused, only the wake fd is watched: the pending connection
    // would make poll return at once, again and again.
    if (poll(polled, pause_ms < 0 ? 2 : 1, pause_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on the gRPC socket failed: {}", std::strerror(errno));
      return;
    }
    if (polled[0].revents != 0) return;
    pause_ms = AcceptAll() ? -1 : kOutOfDescriptorsPauseMs;
  }
}

bool GrpcListener::AcceptAll() {
  for (;;) {
    const int fd = AcceptUnix(listen_fd_);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        spdlog::warn("gRPC socket: cannot accept ({}); pausing", std::strerror(errno));
        return false;
      }
      return true;  // EAGAIN: none pending (or a connection that went away)
    }
    absl::StatusOr<Caller> caller = PeerOf(fd);
    struct stat st;
    if (!caller.ok() || fstat(fd, &st) != 0) {
      close(fd);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      callers_.erase(fd);  // a stale entry of a closed connection
      if (caller->uid != 0 && LiveConnectionsLocked(caller->uid) >= max_per_user_) {
        close(fd);
        refused_();
        spdlog::warn(
            "gRPC socket: refused a connection of {}: it holds {} connections, its "
            "limit (--max_connections_per_user)",
            caller->ToString(), max_per_user_);
        continue;
      }
      callers_[fd] = Peer{*caller, st.st_ino};
    }
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns the fd now
  }
}

uint32_t GrpcListener::LiveConnectionsLocked(uint32_t uid) {
  uint32_t live = 0;
  for (auto it = callers_.begin(); it != callers_.end();) {
    struct stat st;
    if (fstat(it->first, &st) != 0 || st.st_ino != it->second.socket_inode) {
      it = callers_.erase(it);  // gRPC closed it
      continue;
    }
    live += it->second.caller.uid == uid;
    ++it;
  }
  return live;
}

absl::StatusOr<Caller> GrpcListener::CallerOf(const std::string& peer) const {
  absl::string_view rest = peer;
  int fd;
  if (!absl::ConsumePrefix(&rest, "fd:") || !absl::SimpleAtoi(rest, &fd)) {
    return absl::UnauthenticatedError(absl::StrCat("unknown peer '", peer, "'"));
  }
  absl::MutexLock lock(&mu_);
  auto it = callers_.find(fd);
  if (it == callers_.end()) {
    return absl::UnauthenticatedError(absl::StrCat("no credentials for peer '", peer, "'"));
  }
  return it->second.caller;
}

}  // namespace heapd
