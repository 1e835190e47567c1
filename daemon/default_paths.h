// Where heapd keeps its heaps and sockets when no flag says otherwise, so a
// single user can run the daemon and its clients with no configuration:
//   root:    /var/lib/heapd and /run/heapd;
//   others:  $XDG_STATE_HOME/heapd (else ~/.local/state/heapd) and
//            $XDG_RUNTIME_DIR/heapd (else /tmp/heapd-UID).
#ifndef HEAPD_DAEMON_DEFAULT_PATHS_H_
#define HEAPD_DAEMON_DEFAULT_PATHS_H_

#include <cstdint>
#include <string>

namespace heapd {

inline constexpr char kGrpcSocketName[] = "heapd.sock";
inline constexpr char kFdSocketName[] = "heapd.fd.sock";
// Largest request frame on a session's heapd.fd.sock connection (fd_server.h).
inline constexpr uint32_t kMaxFdRequestBytes = 4096;

std::string DefaultStateDir();
std::string DefaultRuntimeDir();

// The socket a client uses: $HEAPD_SOCKET, else the default runtime dir's
// heapd.sock, else /run/heapd/heapd.sock (a system daemon) if that exists.
std::string DefaultSocketPath();

// heapd.fd.sock beside the gRPC socket `grpc_socket`.
std::string FdSocketBeside(const std::string& grpc_socket);

}  // namespace heapd

#endif  // HEAPD_DAEMON_DEFAULT_PATHS_H_
