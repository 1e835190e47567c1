// heapd::Client: a connection to the node's heapd over its Unix socket.
//
//   auto client = heapd::Client::Connect();            // $HEAPD_SOCKET or the default
//   auto heap = (*client)->Attach("graph", {.create_if_missing = true});
//
// Thread-safe. Heaps attached through a Client must be detached (or
// destroyed) before it.
#ifndef HEAPD_HEAPD_CLIENT_H_
#define HEAPD_HEAPD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "heapd/heap.h"

namespace heapd {

// What a heap's clients map, chosen when it is created
// (docs/consistency.md, "Durable images").
enum class HeapImage {
  kDefault,  // heapd's: a working image on a file system (unless it runs
             // with --working_images=false), the data file on tmpfs
  kDirect,   // the data file (on a file system, contents do not roll back)
  kWorking,  // a working image in memory; the data file changes only at syncs
};

struct AttachOptions {
  bool read_only = false;
  bool create_if_missing = false;
  uint64_t max_size = 0;                  // when creating; 0: the daemon's default
  uint32_t mode = 0;                      // when creating; 0: 0600
  HeapImage image = HeapImage::kDefault;  // when creating
  // When creating: the storage tier heapd makes it on (as its --storage
  // names them); empty: heapd's default.
  std::string storage;
  // The most chunks (2 MiB each) a thread leases at a time, per size class:
  // a class's first lease takes one chunk, each next one twice as many up
  // to this (at most 64), so a class used lightly holds one chunk.
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
  // (Last: fields are added at the end, docs/api.md "ABI and versions".)
  // A fixed-address heap: every process maps it at one address heapd
  // assigns, so objects may hold plain pointers (heapd::raw_allocator;
  // docs/api.md, "Fixed-address heaps"). Made as one when creating; a heap
  // that is not one is FAILED_PRECONDITION.
  bool fixed_address = false;
};

struct ClientOptions {
  // Deadline of each call to heapd: generous, since a sync of a big heap on
  // a busy node, or an attach behind many others, may take a while.
  absl::Duration call_timeout = absl::Minutes(5);
  // Attaches tried when heapd refuses the fd token of the one before (it
  // expired, or its session ended while the client was descheduled).
  int attach_attempts = 3;
};

struct ClientChannel;  // heapd's side of the connection, inside the library

class Client {
 public:
  // Connects to heapd at `socket_path` (empty: $HEAPD_SOCKET, else the
  // user's own heapd's socket if it exists, else the system heapd's,
  // /run/heapd/heapd.sock), after checking it is served by root or this
  // user. UNAVAILABLE if nothing listens there.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path = "",
                                                         const ClientOptions& options = {});
  // As above, with calls bounded by `call_timeout_ms`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path,
                                                         int call_timeout_ms);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Attaches heap `name` (or options.snapshot) and maps it.
  absl::StatusOr<std::unique_ptr<Heap>> Attach(const std::string& name,
                                               const AttachOptions& options = {});

  const std::string& socket_path() const;

 private:
  friend ClientChannel& ChannelOf(Client& client);
  explicit Client(std::unique_ptr<ClientChannel> channel);

  std::unique_ptr<ClientChannel> channel_;
};

}  // namespace heapd

#endif  // HEAPD_HEAPD_CLIENT_H_
