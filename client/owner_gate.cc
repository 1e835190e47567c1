#include "client/owner_gate.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace heapd {
namespace {

int Membarrier(int command) { return static_cast<int>(syscall(__NR_membarrier, command, 0, 0)); }

bool RegisterHeavyBarrier() {
  return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

}  // namespace

bool OwnerGate::HeavyBarrierAvailable() {
  static const bool available = RegisterHeavyBarrier();
  return available;
}

void OwnerGate::WaitForVisitor() {
  // Step out, let the visitor finish (it holds visitors_), step back in.
  busy_.store(false, std::memory_order_release);
  for (;;) {
    visitors_.Lock();
    busy_.store(true, std::memory_order_relaxed);
    visitors_.Unlock();
    // A visitor that takes the mutex after this point sees busy_ (it runs
    // the barrier first) and waits for OwnerLeave.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!visitor_.load(std::memory_order_acquire)) return;
    busy_.store(false, std::memory_order_release);
  }
}

void OwnerGate::VisitorEnter() {
  visitors_.Lock();
  visitor_.store(true, std::memory_order_relaxed);
  if (heavy_barrier_) {
    Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  for (int spins = 0; busy_.load(std::memory_order_acquire); ++spins) {
    if (spins > 100) sched_yield();
  }
}

void OwnerGate::VisitorLeave() {
  visitor_.store(false, std::memory_order_release);
  visitors_.Unlock();
}

}  // namespace heapd
