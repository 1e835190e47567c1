#include "client/free_batch.h"

#include <utility>

namespace heapd {

std::vector<v1::ObjectRef> FreeBatch::Add(v1::ObjectRef object) {
  std::vector<v1::ObjectRef> full;
  absl::MutexLock lock(&mu_);
  queued_.push_back(std::move(object));
  if (queued_.size() >= size_) full.swap(queued_);
  return full;
}

std::vector<v1::ObjectRef> FreeBatch::TakeAll() {
  std::vector<v1::ObjectRef> all;
  absl::MutexLock lock(&mu_);
  all.swap(queued_);
  return all;
}

bool FreeBatch::empty() const {
  absl::MutexLock lock(&mu_);
  return queued_.empty();
}

}  // namespace heapd
