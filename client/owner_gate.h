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
#ifndef HEAPD_CLIENT_OWNER_GATE_H_
#define HEAPD_CLIENT_OWNER_GATE_H_

#include <atomic>

#include "absl/synchronization/mutex.h"

namespace heapd {

class OwnerGate {
 public:
  void OwnerEnter() {
    busy_.store(true, std::memory_order_relaxed);
    if (heavy_barrier_) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    if (visitor_.load(std::memory_order_acquire)) WaitForVisitor();
  }
  void OwnerLeave() { busy_.store(false, std::memory_order_release); }

  void VisitorEnter();
  void VisitorLeave();

 private:
  static bool HeavyBarrierAvailable();
  void WaitForVisitor();

  const bool heavy_barrier_ = HeavyBarrierAvailable();
  std::atomic<bool> busy_{false};     // the owner is inside
  std::atomic<bool> visitor_{false};  // a visitor is inside or coming
  absl::Mutex visitors_;              // held by a visitor for its visit
};

// RAII helpers.
class OwnerScope {
 public:
  explicit OwnerScope(OwnerGate& gate) : gate_(gate) { gate_.OwnerEnter(); }
  ~OwnerScope() { gate_.OwnerLeave(); }
  OwnerScope(const OwnerScope&) = delete;
  OwnerScope& operator=(const OwnerScope&) = delete;

 private:
  OwnerGate& gate_;
};

class VisitorScope {
 public:
  explicit VisitorScope(OwnerGate& gate) : gate_(gate) { gate_.VisitorEnter(); }
  ~VisitorScope() { gate_.VisitorLeave(); }
  VisitorScope(const VisitorScope&) = delete;
  VisitorScope& operator=(const VisitorScope&) = delete;

 private:
  OwnerGate& gate_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_OWNER_GATE_H_
