// Listening Unix stream sockets for the daemon's two endpoints.
#ifndef HEAPD_DAEMON_UNIX_LISTENER_H_
#define HEAPD_DAEMON_UNIX_LISTENER_H_

#include <string>

#include "absl/status/statusor.h"

namespace heapd {

// Binds and listens on `path` (replacing a stale socket there), with mode
// 0666: any local user may connect; each call checks the caller itself.
// Returns the listening fd (non-blocking, close-on-exec). INVALID_ARGUMENT
// if the path is longer than a socket address holds (107 bytes).
absl::StatusOr<int> ListenUnix(const std::string& path);

// Accepts one connection (non-blocking, close-on-exec); -1 with errno set
// if none is pending.
int AcceptUnix(int listen_fd);

}  // namespace heapd

#endif  // HEAPD_DAEMON_UNIX_LISTENER_H_
