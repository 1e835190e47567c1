#include "util/run_as_packets.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"

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

namespace {
constexpr int kSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
// MFD_NOEXEC_SEAL (Linux 6.3), which Debian 12's headers lack.
constexpr unsigned kMemfdNoExecSeal = 0x0008U;
}  // namespace

UniqueFd SealedBytes(const std::vector<absl::string_view>& pieces) {
  // Not executable (vm.memfd_noexec=2 requires saying so); kernels before
  // 6.3 do not know the flag.
  UniqueFd fd(
      memfd_create("heapd-run-as-message", MFD_CLOEXEC | MFD_ALLOW_SEALING | kMemfdNoExecSeal));
  if (!fd.valid() && errno == EINVAL) {
    fd.reset(memfd_create("heapd-run-as-message", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  }
  if (!fd.valid()) return fd;
  std::vector<iovec> left;
  for (absl::string_view piece : pieces) {
    if (!piece.empty()) left.push_back({const_cast<char*>(piece.data()), piece.size()});
  }
  size_t first = 0;
  while (first < left.size()) {
    const ssize_t n = writev(fd.get(), left.data() + first, static_cast<int>(left.size() - first));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return UniqueFd();
    }
    for (size_t done = static_cast<size_t>(n); done > 0;) {
      const size_t step = std::min(done, left[first].iov_len);
      left[first].iov_base = static_cast<char*>(left[first].iov_base) + step;
      left[first].iov_len -= step;
      done -= step;
      if (left[first].iov_len == 0) ++first;
    }
  }
  if (fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) return UniqueFd();
  return fd;
}

absl::StatusOr<uint64_t> SealedSize(int fd, absl::string_view what) {
  struct stat file;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals || fstat(fd, &file) != 0 || !S_ISREG(file.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": a message's descriptor is not a sealed memfd"));
  }
  return static_cast<uint64_t>(file.st_size);
}

absl::Status ReadSealedBytes(int fd, uint64_t size, absl::string_view what, std::string* bytes) {
  // Mapped and copied once (a resize would write every byte first).
  absl::StatusOr<SealedMapping> mapped = SealedMapping::Map(fd, size, what);
  if (!mapped.ok()) return mapped.status();
  bytes->assign(mapped->bytes().data(), mapped->bytes().size());
  return absl::OkStatus();
}

absl::StatusOr<SealedMapping> SealedMapping::Map(int fd, uint64_t size, absl::string_view what) {
  SealedMapping mapping;
  if (size == 0) return mapping;
  // Private: before Linux 6.7 a shared mapping of a write-sealed memfd is
  // refused even read-only. Never written, so its pages stay the memfd's.
  void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (data == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat(what, ": map a message"));
  mapping.data_ = static_cast<const char*>(data);
  mapping.size_ = size;
  return mapping;
}

SealedMapping::SealedMapping(SealedMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SealedMapping& SealedMapping::operator=(SealedMapping&& other) noexcept {
  if (this != &other) {
    Unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void SealedMapping::Unmap() {
  if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace heapd
