// ClientChannel: what a heapd::Client holds, inside the library — its
// gRPC channel to heapd.sock (a connection whose server was checked) and
// the deadline of each call; and the calls heapd/client.h does not show:
// admin calls through the generated stub, for heapctl and tests.
#ifndef HEAPD_CLIENT_CLIENT_CHANNEL_H_
#define HEAPD_CLIENT_CLIENT_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "heapd/client.h"
#include "proto/heapd.grpc.pb.h"

namespace heapd {

struct ClientChannel {
  std::string socket_path;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Heapd::Stub> stub;

  // Sets the call deadline of `context` (options.call_timeout from now).
  void Prepare(grpc::ClientContext* context) const;
};

ClientChannel& ChannelOf(Client& client);
// The generated stub, for calls the typed API does not wrap (admin calls).
inline v1::Heapd::Stub& StubOf(Client& client) { return *ChannelOf(client).stub; }
// StatHeap: usage, chunks, size classes and clients of heap `name`.
absl::StatusOr<v1::HeapStats> StatHeap(Client& client, const std::string& name);

// gRPC's status as an absl::Status (the codes are the same).
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace heapd

#endif  // HEAPD_CLIENT_CLIENT_CHANNEL_H_
