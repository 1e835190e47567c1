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
#include "absl/time/time.h"
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
  // Frees of objects this process does not lease sent to heapd in one call
  // (at the latest at the next sync); 1: each at once, and deallocate
  // returns its error.
  uint32_t free_batch = 256;
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

struct ClientOptions {
  // Deadline of each call to heapd: generous, since a sync of a big heap on
  // a busy node, or an attach behind many others, may take a while.
  absl::Duration call_timeout = absl::Minutes(5);
  // Attaches tried when heapd refuses the fd token of the one before (it
  // expired, or its session ended while the client was descheduled).
  int attach_attempts = 3;
};

class Client {
 public:
  // Connects to heapd at `socket_path` (empty: $HEAPD_SOCKET, else the
  // default path, see daemon/default_paths.h), after checking it is served
  // by root or this user. UNAVAILABLE if nothing listens there.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path = "",
                                                         const ClientOptions& options = {});
  // As above, with calls bounded by `call_timeout_ms`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path,
                                                         int call_timeout_ms);

  // Attaches heap `name` (or options.snapshot) and maps it.
  absl::StatusOr<std::unique_ptr<Heap>> Attach(const std::string& name,
                                               const AttachOptions& options = {});

  // StatHeap: usage, chunks, size classes and clients of heap `name`.
  absl::StatusOr<v1::HeapStats> Stat(const std::string& name);

  // The generated stub, for calls the typed API does not wrap (admin calls).
  v1::Heapd::Stub& stub() { return *stub_; }
  const std::string& socket_path() const { return socket_path_; }
  // Sets the call deadline of `context` (options.call_timeout from now).
  void Prepare(grpc::ClientContext* context) const;

 private:
  Client(std::string socket_path, std::shared_ptr<grpc::Channel> channel,
         const ClientOptions& options);
  // One attach: the call, the fd, the mapping.
  absl::StatusOr<std::unique_ptr<Heap>> AttachOnce(const v1::AttachRequest& request,
                                                   const std::string& name,
                                                   const AttachOptions& options);

  const std::string socket_path_;
  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Heapd::Stub> stub_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_CLIENT_H_
