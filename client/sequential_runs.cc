#include "client/sequential_runs.h"

#include <algorithm>

namespace heapd {

uint64_t SequentialRuns::Ahead(uint64_t page) {
  ++clock_;
  for (Stream& s : streams_) {
    if (s.next == page) {
      current_ = &s;
      s.used = clock_;
      return std::min(kMaxAhead, std::max<uint64_t>(1, 2 * s.ahead));
    }
  }
  Stream* oldest = &streams_[0];
  for (Stream& s : streams_) {
    if (s.used < oldest->used) oldest = &s;
  }
  *oldest = Stream{page + 1, 0, clock_};
  current_ = oldest;
  return 0;
}

void SequentialRuns::Took(uint64_t page, uint64_t ahead) {
  if (current_ == nullptr) return;
  current_->next = page + 1 + ahead;
  current_->ahead = ahead;
}

}  // namespace heapd
