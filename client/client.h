// heapd::Client: a connection to the node's heapd over its Unix socket.
//
//   auto client = heapd::Client::Connect();            // $HEAPD_SOCKET or the default
//   auto heap = (*client)->Attach("graph", {.create_if_missing = true});
//
// Thread-safe. Heaps attached through a Client must be detached (or
// destroyed) before it.
#ifndef HEAPD_CLIENT_CLIENT_H_
#define HEAPD_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "proto/heapd.grpc.pb.h"

namespace heapd {

class Heap;

struct AttachOptions {
  bool read_only = false;
  bool create_if_missing = false;
  uint64_t max_size = 0;  // when creating; 0: the daemon's default
  uint32_t mode = 0;      // when creating; 0: 0600
  // Chunks a thread leases at a time, per size class.
  uint32_t lease_batch = 4;
  // Names looked up in the attach call itself: find<T>() of these makes no
  // further call.
  std::vector<std::string> prefetch_names;
  // Attach the snapshot of this name in `snapshot_dir` (empty: heapd's
  // snapshot directory) in place, instead of a heap; read_only must be set.
  std::string snapshot;
  std::string snapshot_dir;
};

// gRPC's status as an absl::Status (the codes are the same).
absl::Status FromGrpc(const grpc::Status& status);

class Client {
 public:
  // Connects to heapd at `socket_path` (empty: $HEAPD_SOCKET, else the
  // default path, see daemon/default_paths.h). UNAVAILABLE if no daemon
  // answers within `timeout_ms`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path = "",
                                                         int timeout_ms = 5000);

  // Attaches heap `name` (or options.snapshot) and maps it.
  absl::StatusOr<std::unique_ptr<Heap>> Attach(const std::string& name,
                                               const AttachOptions& options = {});

  // StatHeap: usage, chunks, size classes and clients of heap `name`.
  absl::StatusOr<v1::HeapStats> Stat(const std::string& name);

  // The generated stub, for calls the typed API does not wrap (admin calls).
  v1::Heapd::Stub& stub() { return *stub_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  Client(std::string socket_path, std::shared_ptr<grpc::Channel> channel);

  const std::string socket_path_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Heapd::Stub> stub_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_CLIENT_H_
