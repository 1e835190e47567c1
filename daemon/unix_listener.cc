#include "daemon/unix_listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "heap/data_file.h"

namespace heapd {

absl::StatusOr<int> ListenUnix(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is ", path.size(),
                                                   " bytes; a Unix socket path holds 1 to ",
                                                   sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "create a Unix socket");
  unlink(path.c_str());  // a stale socket of an earlier run
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      chmod(path.c_str(), 0666) != 0 || listen(fd, 128) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error, absl::StrCat("listen on ", path));
  }
  return fd;
}

int AcceptUnix(int listen_fd) {
  return accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

}  // namespace heapd
