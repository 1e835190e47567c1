// SpinLock: a test-and-set lock for the client's per-thread caches. The
// owning thread takes its own cache's lock on every allocate and free, which
// is almost never contended (other threads take it only to free an object
// of that cache or to sync), so one atomic exchange is the whole cost.
// Contended waiters spin briefly, then yield.
#ifndef HEAPD_CLIENT_SPIN_LOCK_H_
#define HEAPD_CLIENT_SPIN_LOCK_H_

#include <sched.h>

#include <atomic>

namespace heapd {

class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins > 64) sched_yield();
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_SPIN_LOCK_H_
