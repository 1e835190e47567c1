// SpinLock: a test-and-set lock for short critical sections that are rarely
// contended — the queue of frees other threads leave for a cache's owner.
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
