// SessionCalls: the calls a Heap makes on its session, whatever carries
// them — GrpcSessionCalls to heapd over its sockets (grpc_session_calls.h),
// or InProcessSessionCalls to a PersistentHeap in the same process
// (in_process.h: tests, benchmarks, tools). The Heap above them is the same
// code either way: thread caches, remote frees, write tracking.
//
// Requests and answers are heapd.v1 messages; every number in an answer is
// checked by the Heap before it is used. Implementations are thread-safe.
#ifndef HEAPD_CLIENT_SESSION_CALLS_H_
#define HEAPD_CLIENT_SESSION_CALLS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "heap/name_table.h"
#include "proto/heapd.pb.h"

namespace heapd {

class SessionCalls {
 public:
  virtual ~SessionCalls() = default;

  virtual absl::Status LeaseChunks(const v1::LeaseChunksRequest& request,
                                   v1::LeaseChunksResponse* response) = 0;
  virtual absl::Status AllocateLarge(const v1::AllocateLargeRequest& request,
                                     v1::AllocateLargeResponse* response) = 0;
  virtual absl::Status Free(const v1::FreeRequest& request) = 0;
  virtual absl::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response) = 0;
  virtual absl::Status Detach(const v1::DetachRequest& request) = 0;
  virtual absl::Status Bind(const v1::BindRequest& request) = 0;
  // Returns what the name bound.
  virtual absl::StatusOr<NameEntry> Unbind(const v1::UnbindRequest& request) = 0;
  // The name's entry in the session's heap.
  virtual absl::StatusOr<NameEntry> Lookup(const std::string& name) = 0;

  // A descriptor whose peer hangs up when the serving side ends the
  // session (heapd died, or ended it): the write tracker fences the
  // mapping then. -1: none.
  virtual int lifeline() = 0;
  // Ends this side of the session (after a detach, or without one: the
  // serving side then ends it as a crash). Later calls fail.
  virtual void Close() = 0;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_SESSION_CALLS_H_
