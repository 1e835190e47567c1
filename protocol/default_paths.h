// Where heapd keeps its heaps and sockets when no flag says otherwise, so a
// single user can run the daemon and its clients with no configuration:
//   root:    /var/lib/heapd and /run/heapd;
//   others:  $XDG_STATE_HOME/heapd (else ~/.local/state/heapd) and
//            $XDG_RUNTIME_DIR/heapd.
// Never a world-writable place such as /tmp: another user could create the
// directory first and serve a fake heapd there.
#ifndef HEAPD_PROTOCOL_DEFAULT_PATHS_H_
#define HEAPD_PROTOCOL_DEFAULT_PATHS_H_

#include <string>

namespace heapd {

inline constexpr char kSystemRuntimeDir[] = "/run/heapd";
inline constexpr char kGrpcSocketName[] = "heapd.sock";
inline constexpr char kFdSocketName[] = "heapd.fd.sock";

// Empty when there is no safe default (a user without HOME or
// XDG_RUNTIME_DIR): the daemon then needs the flag.
std::string DefaultStateDir();
std::string DefaultRuntimeDir();

// The socket a client uses: $HEAPD_SOCKET, else the user's own daemon's
// ($XDG_RUNTIME_DIR/heapd/heapd.sock) if it exists, else the system
// daemon's, /run/heapd/heapd.sock. The client checks who serves it
// (client/client.h).
std::string DefaultSocketPath();

// heapd.fd.sock beside the gRPC socket `grpc_socket`.
std::string FdSocketBeside(const std::string& grpc_socket);

}  // namespace heapd

#endif  // HEAPD_PROTOCOL_DEFAULT_PATHS_H_
