// OwnerGate: mutual exclusion between one owner thread, which enters very
// often, and visitor threads, which enter rarely — the client's per-thread
// cache (owner: the thread allocating from it; visitors: sync and detach).
//
// The owner's enter is two plain stores and a load, no atomic
// read-modify-write and no fence: a visitor announces itself, then runs
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which executes a full
// memory barrier on every thread of the process, and only then looks at
// the owner's `busy` flag (the asymmetric Dekker protocol). Where the kernel
// lacks that membarrier command, the owner pays a full fence instead.
//
// The owner must not enter recursively; visitors serialize on a mutex.
//
// The gate is a capability for clang's -Wthread-safety: what it protects is
// ABSL_GUARDED_BY it, and OwnerScope and VisitorScope hold it exclusively.
// The analysis cannot follow the protocol itself (owner_gate.cc says why it
// excludes); ThreadSanitizer is told the same thing (owner_gate.cc,
// "ThreadSanitizer").
#ifndef HEAPD_CLIENT_OWNER_GATE_H_
#define HEAPD_CLIENT_OWNER_GATE_H_

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#define HEAPD_OWNER_GATE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HEAPD_OWNER_GATE_TSAN 1
#endif
#endif

#if defined(HEAPD_OWNER_GATE_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace heapd {

class ABSL_LOCKABLE OwnerGate {
 public:
  // The protocol is invisible to the analysis (atomics and a system call,
  // no lock it knows): these say only what holds once they return.
  void OwnerEnter() ABSL_EXCLUSIVE_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    busy_.store(true, std::memory_order_relaxed);
    if (heavy_barrier_) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    if (visitor_.load(std::memory_order_acquire)) WaitForVisitor();
    TsanEntered();
  }
  void OwnerLeave() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    TsanLeaving();
    busy_.store(false, std::memory_order_release);
  }

  void VisitorEnter() ABSL_EXCLUSIVE_LOCK_FUNCTION();
  void VisitorLeave() ABSL_UNLOCK_FUNCTION();

 private:
  static bool HeavyBarrierAvailable();
  void WaitForVisitor();

  // ThreadSanitizer sees the gate as a mutex that the owner or one visitor
  // holds from the end of its enter to the start of its leave: the
  // happens-before edges and the exclusion that membarrier gives, which
  // it cannot see (owner_gate.cc). Nothing in other builds.
  void TsanEntered() {
#if defined(HEAPD_OWNER_GATE_TSAN)
    __tsan_mutex_pre_lock(this, 0);
    __tsan_mutex_post_lock(this, 0, 0);
#endif
  }
  void TsanLeaving() {
#if defined(HEAPD_OWNER_GATE_TSAN)
    __tsan_mutex_pre_unlock(this, 0);
    __tsan_mutex_post_unlock(this, 0);
#endif
  }

  const bool heavy_barrier_ = HeavyBarrierAvailable();
  std::atomic<bool> busy_{false};     // the owner is inside
  std::atomic<bool> visitor_{false};  // a visitor is inside or coming
  absl::Mutex visitors_;              // held by a visitor for its visit
};

// RAII helpers.
class ABSL_SCOPED_LOCKABLE OwnerScope {
 public:
  explicit OwnerScope(OwnerGate& gate) ABSL_EXCLUSIVE_LOCK_FUNCTION(gate) : gate_(gate) {
    gate_.OwnerEnter();
  }
  ~OwnerScope() ABSL_UNLOCK_FUNCTION() { gate_.OwnerLeave(); }
  OwnerScope(const OwnerScope&) = delete;
  OwnerScope& operator=(const OwnerScope&) = delete;

 private:
  OwnerGate& gate_;
};

class ABSL_SCOPED_LOCKABLE VisitorScope {
 public:
  explicit VisitorScope(OwnerGate& gate) ABSL_EXCLUSIVE_LOCK_FUNCTION(gate) : gate_(gate) {
    gate_.VisitorEnter();
  }
  ~VisitorScope() ABSL_UNLOCK_FUNCTION() { gate_.VisitorLeave(); }
  VisitorScope(const VisitorScope&) = delete;
  VisitorScope& operator=(const VisitorScope&) = delete;

 private:
  OwnerGate& gate_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_OWNER_GATE_H_
