// RemoteFrees: frees this process sends heapd, which judges them: objects
// in chunks this process does not lease (other processes allocated them).
// Small ones wait in a batch (FreeBatch) sent when full, at a sync, at the
// detach or when the heap is full; large ones go at once. Thread-safe.
#ifndef HEAPD_CLIENT_REMOTE_FREES_H_
#define HEAPD_CLIENT_REMOTE_FREES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "client/free_batch.h"
#include "client/session_calls.h"
#include "proto/heapd.pb.h"

namespace heapd {

class RemoteFrees {
 public:
  // `calls` outlives this object; batches of `batch` frees.
  RemoteFrees(SessionCalls* calls, uint64_t session, size_t batch)
      : calls_(calls), session_(session), batch_(batch) {}

  // Frees the object at `offset` (`size_hint`: its size, 0 if unknown):
  // batched when small, at once when large.
  absl::Status Free(uint64_t offset, uint64_t size_hint);
  // Frees `objects` now. A batch heapd refuses is retried one by one, so
  // that the good ones are freed; returns the first refusal.
  absl::Status FreeNow(std::vector<v1::ObjectRef> objects);
  // Sends what waits in the batch.
  absl::Status Flush() { return FreeNow(batch_.TakeAll()); }
  bool pending() const { return !batch_.empty(); }

 private:
  SessionCalls* const calls_;
  const uint64_t session_;
  FreeBatch batch_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_REMOTE_FREES_H_
