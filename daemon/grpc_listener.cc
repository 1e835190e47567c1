#include "daemon/grpc_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/unix_listener.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace heapd {

GrpcListener::GrpcListener(int listen_fd, grpc::Server* server)
    : listen_fd_(listen_fd),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      server_(server),
      thread_([this] { Run(); }) {}

GrpcListener::~GrpcListener() { StopAccepting(); }

void GrpcListener::StopAccepting() {
  if (stopped_) return;
  stopped_ = true;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(wake_fd_);
  close(listen_fd_);
}

void GrpcListener::Run() {
  for (;;) {
    pollfd polled[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (poll(polled, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on the gRPC socket failed: {}", std::strerror(errno));
      return;
    }
    if (polled[0].revents != 0) return;
    for (;;) {
      const int fd = AcceptUnix(listen_fd_);
      if (fd < 0) break;
      absl::StatusOr<Caller> caller = PeerOf(fd);
      if (!caller.ok()) {
        close(fd);
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        callers_[fd] = *caller;
      }
      grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns the fd now
    }
  }
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
  return it->second;
}

}  // namespace heapd
