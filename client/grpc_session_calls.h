// GrpcSessionCalls: a session's calls to heapd — gRPC on heapd.sock, name
// lookups on the session's heapd.fd.sock connection (one small request and
// answer; gRPC once that stream is out of step), whose hang-up is the
// session's lifeline.
#ifndef HEAPD_CLIENT_GRPC_SESSION_CALLS_H_
#define HEAPD_CLIENT_GRPC_SESSION_CALLS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/client_channel.h"
#include "client/session_calls.h"

namespace heapd {

class GrpcSessionCalls : public SessionCalls {
 public:
  // `client` outlives this; `fd_connection`: the session's heapd.fd.sock
  // connection, owned from now on.
  GrpcSessionCalls(const ClientChannel* client, std::string heap, int fd_connection)
      : client_(client), heap_(std::move(heap)), fd_connection_(fd_connection) {}
  ~GrpcSessionCalls() override { Close(); }

  absl::Status LeaseChunks(const v1::LeaseChunksRequest& request,
                           v1::LeaseChunksResponse* response) override;
  absl::Status AllocateLarge(const v1::AllocateLargeRequest& request,
                             v1::AllocateLargeResponse* response) override;
  absl::Status Free(const v1::FreeRequest& request) override;
  absl::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response) override;
  absl::Status Detach(const v1::DetachRequest& request) override;
  absl::Status Bind(const v1::BindRequest& request) override;
  absl::StatusOr<NameEntry> Unbind(const v1::UnbindRequest& request) override;
  absl::StatusOr<NameEntry> Lookup(const std::string& name) override;
  int lifeline() override;
  void Close() override;

 private:
  absl::StatusOr<NameEntry> LookupWithGrpc(const std::string& name);

  const ClientChannel* const client_;
  const std::string heap_;
  absl::Mutex fd_mu_;  // one request at a time on fd_connection_
  int fd_connection_ ABSL_GUARDED_BY(fd_mu_) = -1;
  // Set when an exchange on fd_connection_ failed midway: the stream is out
  // of step, so lookups go through gRPC from then on.
  bool fd_broken_ ABSL_GUARDED_BY(fd_mu_) = false;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_GRPC_SESSION_CALLS_H_
