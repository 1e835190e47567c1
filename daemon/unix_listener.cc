#include "daemon/unix_listener.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/errno_status.h"
#include "util/unique_fd.h"

namespace heapd {
namespace {

// OK once nothing is at `address`'s path: absent, or a socket nobody
// answers on (removed). A live socket or another kind of file is refused.
absl::Status ClearStaleSocket(const sockaddr_un& address, const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; heapd leaves it alone"));
  }
  UniqueFd probe(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return ErrnoStatus(errno, "create a Unix socket");
  if (connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0 ||
      errno == EAGAIN || errno == EINPROGRESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("a process answers on ", path, "; heapd does not replace a socket in use"));
  }
  if (errno != ECONNREFUSED) return ErrnoStatus(errno, absl::StrCat("probe ", path));
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove the stale socket ", path));
  }
  return absl::OkStatus();
}

}  // namespace

void ListeningSocket::Remove() const {
  struct stat st;
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == device &&
      st.st_ino == inode) {
    unlink(path.c_str());
  }
}

absl::StatusOr<ListeningSocket> ListenUnix(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is ", path.size(),
                                                   " bytes; a Unix socket path holds 1 to ",
                                                   sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  if (absl::Status s = ClearStaleSocket(address, path); !s.ok()) return s;
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "create a Unix socket");
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", path));
  }
  ListeningSocket bound;
  bound.path = path;
  bound.inode_ref.reset(open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!bound.inode_ref.valid() || fstat(bound.inode_ref.get(), &st) != 0) {
    const int error = errno;
    unlink(path.c_str());  // just bound: nobody else's yet
    return ErrnoStatus(error, absl::StrCat("open ", path, " O_PATH"));
  }
  bound.device = st.st_dev;
  bound.inode = st.st_ino;
  if (chmod(path.c_str(), 0666) != 0 || listen(fd.get(), 128) != 0) {
    const int error = errno;
    bound.Remove();
    return ErrnoStatus(error, absl::StrCat("listen on ", path));
  }
  bound.fd = fd.release();
  return bound;
}

int AcceptUnix(int listen_fd) {
  return accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

}  // namespace heapd
