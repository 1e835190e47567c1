#include "daemon/fd_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "daemon/unix_listener.h"
#include "spdlog/spdlog.h"
#include "util/running_thread.h"

namespace heapd {
namespace {

constexpr absl::Duration kTokenWait = absl::Seconds(10);

void SendError(int fd, const std::string& message) {
  const std::string reply = "E" + message;
  send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
}

// Sends 'K' with the data fd, and the journal fd after it when valid.
bool SendFds(int socket, int fd, int journal_fd) {
  char status = 'K';
  iovec iov{&status, 1};
  const int fds[2] = {fd, journal_fd};
  const size_t count = journal_fd >= 0 ? 2 : 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = CMSG_SPACE(count * sizeof(int));
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(count * sizeof(int));
  std::memcpy(CMSG_DATA(header), fds, count * sizeof(int));
  return sendmsg(socket, &message, MSG_NOSIGNAL) == 1;
}

}  // namespace

FdServer::FdServer(int listen_fd, uint32_t max_per_user, Callbacks callbacks)
    : listen_fd_(listen_fd),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      max_per_user_(max_per_user),
      callbacks_(std::move(callbacks)),
      thread_(StartRunningThread([this] { Run(); })) {}

FdServer::~FdServer() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  for (const auto& [fd, connection] : connections_) close(fd);
  close(wake_fd_);
  close(listen_fd_);
}

void FdServer::Run() {
  std::vector<pollfd> polled;
  absl::Time last_tick = absl::Now();
  absl::Time paused_until = absl::InfinitePast();  // out of descriptors
  for (;;) {
    polled.clear();
    polled.push_back({wake_fd_, POLLIN, 0});
    // While paused the listening socket is not watched: its pending
    // connection would wake poll at once, again and again.
    polled.push_back({absl::Now() < paused_until ? -1 : listen_fd_, POLLIN, 0});
    for (const auto& [fd, connection] : connections_) polled.push_back({fd, POLLIN, 0});
    const int ready = poll(polled.data(), polled.size(), absl::Now() < paused_until ? 100 : 1000);
    if (ready < 0 && errno != EINTR) {
      spdlog::error("poll on the fd socket failed: {}", std::strerror(errno));
      return;
    }
    if (polled[0].revents != 0) return;  // stopping
    if (polled[1].revents != 0 && !AcceptAll()) {
      paused_until = absl::Now() + absl::Milliseconds(100);
    }
    const absl::Time now = absl::Now();
    for (size_t i = 2; i < polled.size(); ++i) {
      const int fd = polled[i].fd;
      Connection& connection = connections_.at(fd);
      bool keep = true;
      if (polled[i].revents != 0) {
        keep = OnReadable(fd, connection);
      } else if (connection.session == 0 && now - connection.accepted > kTokenWait) {
        SendError(fd, "no token within the time allowed");
        keep = false;
      }
      if (keep) continue;
      const ClientId session = connection.session;
      if (--per_user_[connection.caller.uid] == 0) per_user_.erase(connection.caller.uid);
      close(fd);
      connections_.erase(fd);
      if (session != 0) callbacks_.closed(session);
    }
    if (now - last_tick >= absl::Seconds(1)) {
      last_tick = now;
      callbacks_.tick();
    }
  }
}

bool FdServer::AcceptAll() {
  for (;;) {
    const int fd = AcceptUnix(listen_fd_);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        spdlog::warn("fd socket: cannot accept ({}); pausing", std::strerror(errno));
        return false;
      }
      return true;
    }
    absl::StatusOr<Caller> caller = PeerOf(fd);
    if (!caller.ok()) {
      close(fd);
      continue;
    }
    uint32_t& held = per_user_[caller->uid];
    if (caller->uid != 0 && held >= max_per_user_) {
      SendError(fd, "too many connections (--max_connections_per_user)");
      close(fd);
      callbacks_.refused();
      spdlog::warn(
          "fd socket: refused a connection of {}: it holds {}, its limit "
          "(--max_connections_per_user)",
          caller->ToString(), held);
      continue;
    }
    ++held;
    Connection& connection = connections_[fd];
    connection.caller = *caller;
    connection.accepted = absl::Now();
  }
}

bool FdServer::OnRequests(int fd, Connection& connection) {
  char buffer[kMaxFdRequestBytes];
  const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n <= 0) return false;  // closed: the session ends
  connection.requests.Append(absl::string_view(buffer, static_cast<size_t>(n)));
  for (;;) {
    absl::StatusOr<std::optional<absl::string_view>> request = connection.requests.Next();
    if (!request.ok()) return false;  // not our protocol
    if (!request->has_value()) return true;
    const std::string frame = EncodeFrame(callbacks_.request(connection.session, **request));
    // A client that does not read its answers loses its connection (and
    // session) rather than stall the others.
    if (send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(frame.size())) {
      return false;
    }
  }
}

bool FdServer::OnReadable(int fd, Connection& connection) {
  if (connection.session != 0) return OnRequests(fd, connection);
  char buffer[kTokenLength];
  const ssize_t n = recv(fd, buffer, kTokenLength - connection.token.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n <= 0) return false;  // closed before a token
  connection.token.append(buffer, static_cast<size_t>(n));
  if (connection.token.size() < kTokenLength) return true;
  absl::StatusOr<Grant> grant = callbacks_.redeem(connection.token, connection.caller);
  if (!grant.ok()) {
    spdlog::warn("fd socket: refused a token from {}: {}", connection.caller.ToString(),
                 grant.status().ToString());
    SendError(fd, std::string(grant.status().message()));
    return false;
  }
  const bool sent = SendFds(fd, grant->fd, grant->journal_fd);
  close(grant->fd);
  if (grant->journal_fd >= 0) close(grant->journal_fd);
  connection.session = grant->session;
  return sent;  // if the client is gone already, its session ends now
}

}  // namespace heapd
