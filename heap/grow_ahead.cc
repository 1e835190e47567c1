#include "heap/grow_ahead.h"

#include <system_error>
#include <utility>

#include "util/running_thread.h"

namespace heapd {

GrowAhead::~GrowAhead() { Stop(); }

void GrowAhead::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wanted_ = true;  // wakes the thread to stop
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

void GrowAhead::Request() {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  wanted_ = true;
  if (thread_.joinable()) return;
  try {
    thread_ = StartRunningThread([this] { Loop(); });
  } catch (const std::system_error&) {
    // No thread to spare: see the class comment.
  }
}

void GrowAhead::Loop() {
  std::optional<uint32_t> failed_at;
  absl::Time retry_after = absl::InfinitePast();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&wanted_));
      if (stop_) return;
      wanted_ = false;
    }
    const std::optional<uint32_t> capacity = due_();
    if (!capacity.has_value()) continue;
    if (capacity == failed_at && absl::Now() < retry_after) continue;
    {
      absl::MutexLock lock(&mu_);  // stopping: no growth now
      if (stop_) return;
    }
    if (!grow_(*capacity).ok()) {
      failed_at = capacity;
      retry_after = absl::Now() + back_off_;
    }
  }
}

}  // namespace heapd
