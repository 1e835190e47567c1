// GrpcListener: serves gRPC on heapd.sock with caller credentials. It
// accepts connections itself, records each one's SO_PEERCRED under its fd
// number, and hands the fd to the gRPC server (AddInsecureChannelFromFd).
// In a handler, ServerContext::peer() is "fd:N"; CallerOf maps it back.
//
// fd numbers are reused after gRPC closes a connection: the entry is
// overwritten at the next accept of that number, before gRPC sees the fd,
// so a lookup always finds the connection's own peer.
//
// Each user may hold at most `max_per_user` connections (root: any). gRPC
// closes connections without telling: an entry is live while its fd number
// still refers to the socket accepted (same inode), which is checked when
// a user's connections are counted. When the process runs out of
// descriptors (EMFILE), accepting pauses briefly instead of spinning.
#ifndef HEAPD_DAEMON_GRPC_LISTENER_H_
#define HEAPD_DAEMON_GRPC_LISTENER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/caller.h"
#include "grpcpp/server.h"

namespace heapd {

class GrpcListener {
 public:
  // Takes ownership of `listen_fd`; `server` is started and outlives this.
  // `refused` is called for each connection refused by the limit.
  GrpcListener(int listen_fd, grpc::Server* server, uint32_t max_per_user,
               std::function<void()> refused);
  ~GrpcListener();

  // Starts accepting. Separate from construction so that handlers, which
  // call CallerOf, can reach this object before its first connection.
  void Start();

  // Stops accepting connections; CallerOf keeps working for the accepted
  // ones (in-flight calls finish after this).
  void StopAccepting();

  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  // The credentials of the connection `peer` (ServerContext::peer()).
  // UNAUTHENTICATED if it is not one this listener accepted.
  absl::StatusOr<Caller> CallerOf(const std::string& peer) const;

 private:
  struct Peer {
    Caller caller;
    ino_t socket_inode;  // tells the accepted socket from a later file on its fd number
  };
  void Run();
  // Accepts what is pending; false when out of descriptors.
  bool AcceptAll();
  // Live connections of `uid`; forgets entries whose connection is gone.
  uint32_t LiveConnectionsLocked(uint32_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int listen_fd_;
  const int wake_fd_;
  bool stopped_ = false;
  grpc::Server* const server_;
  const uint32_t max_per_user_;
  const std::function<void()> refused_;
  mutable absl::Mutex mu_;
  std::map<int, Peer> callers_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_GRPC_LISTENER_H_
