#include "client/owner_gate.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

// Why the gate excludes. Owner: store busy_ (relaxed), compiler barrier,
// load visitor_. Visitor: store visitor_, membarrier, load busy_. Both
// loads could be satisfied before the other thread's store is visible
// (store buffering), which would let both in; membarrier forbids it. It
// returns only after every running thread of the process has executed a
// full memory barrier (threads not running pass one at their next context
// switch), so the owner has one at some point P of its execution. If P
// comes after the owner's store, the store is visible before membarrier
// returns and the visitor's load sees busy_ set (or cleared later by
// OwnerLeave); if P comes before it, the visitor's store, made before the
// system call, is visible at P and the owner's load, after P, sees it. So
// at least one of them sees the other and waits. Without that membarrier
// command both sides run a seq_cst fence, the textbook Dekker.
//
// Happens-before comes from the release stores on leaving (OwnerLeave's
// busy_, VisitorLeave's visitor_) read by the acquire loads on entering.
//
// ThreadSanitizer sees those atomics but models neither fences nor
// membarrier: it cannot know that two threads are never inside at once,
// and so cannot check it. The gate therefore tells it, with its mutex
// annotations, that entering locks the gate and leaving unlocks it (see
// TsanEntered in the header): the edges above become explicit, and a
// failure of the protocol (owner and visitor inside together) would be
// reported as a double lock instead of passing unseen.
//
// -Wthread-safety cannot see the protocol either: the enter and leave
// functions are exempt from the analysis and declared to acquire and
// release the gate, so what callers do inside is checked.

namespace heapd {
namespace {

int Membarrier(int command) { return static_cast<int>(syscall(__NR_membarrier, command, 0, 0)); }

bool RegisterHeavyBarrier() { return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0; }

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

// Exempt from the analysis: it returns holding visitors_ (released by
// VisitorLeave) and the gate, which the analysis cannot see it take.
void OwnerGate::VisitorEnter() ABSL_NO_THREAD_SAFETY_ANALYSIS {
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
  TsanEntered();
}

// Exempt from the analysis: it releases what VisitorEnter took.
void OwnerGate::VisitorLeave() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  TsanLeaving();
  visitor_.store(false, std::memory_order_release);
  visitors_.Unlock();
}

}  // namespace heapd
