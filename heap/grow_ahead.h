// GrowAhead: a thread that grows a heap's data file ahead of demand, so
// that allocation seldom waits for fallocate (which on tmpfs allocates and
// zeroes every page). The heap asks for a growth (Request) when a lease
// leaves it short of free chunks; the thread, started at the first request,
// grows once per request while `due` says a growth is due. After a failed
// growth (a full disk, tmpfs memory) it grows from the same capacity again
// only after `back_off`: each attempt fills the file system until fallocate
// fails, which others on it would see. Errors are left to the growth a
// lease needs, which reports them to its caller.
//
// Without a thread to spare (a pid or thread limit) nothing grows ahead:
// leases grow the heap themselves; a later request tries again.
// Thread-safe. `mu_` is a leaf lock: the callbacks run without it.
#ifndef HEAPD_HEAP_GROW_AHEAD_H_
#define HEAPD_HEAP_GROW_AHEAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace heapd {

class GrowAhead {
 public:
  // The capacity (in chunks) a growth would start from if one is due now;
  // nothing if none is.
  using DueFn = std::function<std::optional<uint32_t>()>;
  // Grows the heap from `capacity_seen` (nothing if another growth changed
  // the capacity meanwhile).
  using GrowFn = std::function<absl::Status(uint32_t capacity_seen)>;

  GrowAhead(DueFn due, GrowFn grow, absl::Duration back_off = absl::Seconds(10))
      : due_(std::move(due)), grow_(std::move(grow)), back_off_(back_off) {}
  // Stops.
  ~GrowAhead();
  GrowAhead(const GrowAhead&) = delete;
  GrowAhead& operator=(const GrowAhead&) = delete;

  // Wakes the thread (started now if not yet) to grow if a growth is due.
  void Request() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the thread for good, waiting for a growth under way; later
  // requests do nothing.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const DueFn due_;
  const GrowFn grow_;
  const absl::Duration back_off_;
  absl::Mutex mu_;
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;  // a request, or the stop
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // joined by Stop
};

}  // namespace heapd

#endif  // HEAPD_HEAP_GROW_AHEAD_H_
