// SpinLock: a test-and-set lock for short critical sections that are rarely
// contended — the queue of frees other threads leave for a cache's owner.
// Contended waiters spin briefly, then yield. A capability for clang's
// -Wthread-safety: members it protects are ABSL_GUARDED_BY it.
#ifndef HEAPD_CLIENT_SPIN_LOCK_H_
#define HEAPD_CLIENT_SPIN_LOCK_H_

#include <sched.h>

#include <atomic>

#include "absl/base/thread_annotations.h"

namespace heapd {

class ABSL_LOCKABLE SpinLock {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins > 64) sched_yield();
      }
    }
  }
  void unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// Holds a SpinLock for its scope.
class ABSL_SCOPED_LOCKABLE SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock& lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_.lock();
  }
  ~SpinLockHolder() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock& lock_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_SPIN_LOCK_H_
