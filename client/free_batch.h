// FreeBatch: frees of objects in chunks this process does not lease (other
// processes allocated them), gathered to be sent to heapd, which judges
// them, a batch per call. Thread-safe; a leaf lock: the caller sends what
// it is given outside it, so other threads queue on meanwhile.
#ifndef HEAPD_CLIENT_FREE_BATCH_H_
#define HEAPD_CLIENT_FREE_BATCH_H_

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/heapd.pb.h"

namespace heapd {

class FreeBatch {
 public:
  // Batches of `size` frees (at least 1).
  explicit FreeBatch(size_t size) : size_(size == 0 ? 1 : size) {}

  // Queues `object`; returns the batch to send now once it is full (empty
  // while it is not).
  std::vector<v1::ObjectRef> Add(v1::ObjectRef object) ABSL_LOCKS_EXCLUDED(mu_);
  // Everything queued, to send now (a sync, a detach, a full heap).
  std::vector<v1::ObjectRef> TakeAll() ABSL_LOCKS_EXCLUDED(mu_);
  bool empty() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t size_;
  mutable absl::Mutex mu_;
  std::vector<v1::ObjectRef> queued_ ABSL_GUARDED_BY(mu_);
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_FREE_BATCH_H_
