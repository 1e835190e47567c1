#include "client/remote_frees.h"

#include <utility>

#include "allocator/size_class.h"

namespace heapd {

absl::Status RemoteFrees::Free(uint64_t offset, uint64_t size_hint) {
  v1::ObjectRef object;
  object.set_offset(offset);
  object.set_size(size_hint);
  if (size_hint > kMaxSmallSize) return FreeNow({object});
  return FreeNow(batch_.Add(std::move(object)));
}

absl::Status RemoteFrees::FreeNow(std::vector<v1::ObjectRef> objects) {
  if (objects.empty()) return absl::OkStatus();
  auto send = [this](auto begin, auto end) {
    v1::FreeRequest request;
    request.set_session(session_);
    request.mutable_objects()->Add(begin, end);
    return calls_->Free(request);
  };
  absl::Status status = send(objects.begin(), objects.end());
  if (status.ok() || objects.size() == 1 ||
      (status.code() != absl::StatusCode::kInvalidArgument &&
       status.code() != absl::StatusCode::kFailedPrecondition)) {
    return status;
  }
  // A batch is all or nothing: free the others one by one and report the
  // first bad one.
  absl::Status first;
  for (auto it = objects.begin(); it != objects.end(); ++it) first.Update(send(it, it + 1));
  return first;
}

}  // namespace heapd
