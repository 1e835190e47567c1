// Listening Unix stream sockets for the daemon's two endpoints.
#ifndef HEAPD_DAEMON_UNIX_LISTENER_H_
#define HEAPD_DAEMON_UNIX_LISTENER_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "util/unique_fd.h"

namespace heapd {

// A socket ListenUnix bound. `fd` is handed to whoever accepts on it (it
// closes it). `inode_ref` (O_PATH) holds the socket's inode, so that its
// number names no other file while this lives: a path that still names
// (device, inode) names this socket.
struct ListeningSocket {
  int fd = -1;
  std::string path;
  dev_t device = 0;
  ino_t inode = 0;
  UniqueFd inode_ref;

  // Unlinks `path` if it still names this socket, and only then: a socket
  // another process bound there since is left alone.
  void Remove() const;
};

// Binds and listens on `path` with mode 0666: any local user may connect;
// each call checks the caller itself. A socket left at `path` by a process
// that is gone (nothing answers a connect) is replaced; FAILED_PRECONDITION
// if a process answers there or the path is not a socket, which are left
// untouched. The fd is non-blocking and close-on-exec. INVALID_ARGUMENT if
// the path is longer than a socket address holds (107 bytes).
absl::StatusOr<ListeningSocket> ListenUnix(const std::string& path);

// Accepts one connection (non-blocking, close-on-exec); -1 with errno set
// if none is pending.
int AcceptUnix(int listen_fd);

}  // namespace heapd

#endif  // HEAPD_DAEMON_UNIX_LISTENER_H_
