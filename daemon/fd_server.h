// FdServer: the heapd.fd.sock endpoint. A client that attached sends its
// one-time token (kTokenLength bytes); the server answers with one status
// byte — 'K' with the heap's data fd attached (SCM_RIGHTS), or 'E' followed
// by the error text, after which it closes the connection. A connection that
// got its fd stays open for the session: when the client closes it (or
// dies), the server reports the session closed.
//
// On that connection the client may then send requests, each answered in
// order (protocol/fd_protocol.h: the framing and the requests). This is the
// session's fast path for name lookups (no gRPC). A frame longer than the
// protocol allows ends the connection.
//
// One thread polls the listening socket and every connection; connections
// that send no token within kTokenWait are dropped. Callbacks run on that
// thread. Each user may hold at most `max_per_user` connections (root:
// any); when the process runs out of descriptors, accepting pauses briefly
// instead of spinning.
#ifndef HEAPD_DAEMON_FD_SERVER_H_
#define HEAPD_DAEMON_FD_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/lease_types.h"
#include "daemon/caller.h"
#include "protocol/fd_protocol.h"

namespace heapd {

inline constexpr size_t kTokenLength = 32;

class FdServer {
 public:
  struct Grant {
    ClientId session = 0;
    int fd = -1;          // sent, then closed by the server
    int journal_fd = -1;  // sent after it when valid, then closed
  };
  struct Callbacks {
    std::function<absl::StatusOr<Grant>(const std::string& token, const Caller& caller)> redeem;
    std::function<void(ClientId session)> closed;
    std::function<void()> tick;  // about once a second
    // Answers one request of a session's connection.
    std::function<std::string(ClientId session, absl::string_view request)> request;
    // A connection refused by the per-user limit.
    std::function<void()> refused;
  };

  // Takes ownership of `listen_fd`.
  FdServer(int listen_fd, uint32_t max_per_user, Callbacks callbacks);
  ~FdServer();  // stops the thread and closes every connection

  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

 private:
  struct Connection {
    Caller caller;
    absl::Time accepted;
    std::string token;                           // bytes received so far
    FrameSplitter requests{kMaxFdRequestBytes};  // bytes not yet answered
    ClientId session = 0;                        // set once the fd was sent
  };

  void Run();
  // Accepts what is pending; false when out of descriptors.
  bool AcceptAll();
  // Handles readable `fd`; returns false when the connection is to be closed.
  bool OnReadable(int fd, Connection& connection);
  bool OnRequests(int fd, Connection& connection);

  const int listen_fd_;
  const int wake_fd_;
  const uint32_t max_per_user_;
  Callbacks callbacks_;
  std::map<int, Connection> connections_;  // owned by the thread
  std::map<uint32_t, uint32_t> per_user_;  // connections by uid; owned by the thread
  std::thread thread_;
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_FD_SERVER_H_
