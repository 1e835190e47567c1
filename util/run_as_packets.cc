#include "util/run_as_packets.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace heapd {

bool SendPacket(int socket, char kind, absl::string_view bytes, const std::vector<int>& fds,
                int flags) {
  if (bytes.size() > kPacketBodyBytes || fds.size() > kMaxFdsPerPacket) {
    errno = EMSGSIZE;
    return false;
  }
  std::string packet(1, kind);
  packet.append(bytes.data(), bytes.size());
  iovec iov{packet.data(), packet.size()};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket)] = {};
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

ssize_t ReceivePacket(int socket, std::string* packet, std::vector<UniqueFd>* fds, int flags) {
  packet->resize(kPacketBodyBytes + 1);
  iovec iov{packet->data(), packet->size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket)] = {};
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

}  // namespace heapd
