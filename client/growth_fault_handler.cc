#include "client/growth_fault_handler.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "allocator/size_class.h"
#include "client/write_tracker.h"
#include "heap/fault_point.h"
#include "heap/heap_mapping.h"

namespace heapd {
namespace {

constexpr int kSlots = 64;

// Serializes Register and Unregister. The signal handler cannot take it:
// it reads a slot's fields only after an acquire load of a non-null
// `base`, which Register stores last (release), and they do not change
// until Unregister clears `base`.
ABSL_CONST_INIT absl::Mutex registering(absl::kConstInit);

struct Registered {
  std::atomic<char*> base{nullptr};  // null: free slot; else heap.base
  GrowingHeap heap ABSL_GUARDED_BY(registering);
  // The thread mapping the heap's growth (GrowthMappingLock); 0: none.
  std::atomic<pid_t> mapping_by{0};
};

Registered slots[kSlots];
struct sigaction previous;
std::once_flag installed;

// Takes `slot`'s mapping lock; false (not taken) if this thread holds it
// already (a signal handler on the thread mapping). Async-signal-safe.
bool LockMapping(Registered& slot) {
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  for (pid_t holder = 0;
       !slot.mapping_by.compare_exchange_weak(holder, self, std::memory_order_acquire);
       holder = 0) {
    if (holder == self) return false;
    sched_yield();
  }
  return true;
}
void UnlockMapping(Registered& slot) { slot.mapping_by.store(0, std::memory_order_release); }

// MapHeapGrowth's work, under the slot's lock. Async-signal-safe.
int MapGrowthLocked(const GrowingHeap& heap, uint64_t size) {
  // Read under the lock: what another mapper mapped is not mapped again.
  const uint64_t mapped = heap.mapped->load(std::memory_order_acquire);
  if (size <= mapped) return 0;
  char* at = heap.base + mapped;
  const uint64_t length = size - mapped;
  auto fencing = [&heap] {
    return heap.fenced != nullptr && heap.fenced->load(std::memory_order_seq_cst);
  };
  const bool fenced_before = fencing();
  if (fenced_before) {
    // As the rest after a fence. If that fails, the range stays reserved
    // (it must not read as zeros): every access faults.
    if (!MapPrivately(at, length, heap.fd, mapped)) {
      mmap(at, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      return ENOMEM;
    }
  } else {
    // Tracked growth is mapped read-only until it is write-protected: a
    // store of another thread in between faults here, waits for the lock
    // and, retried, stops at the protection (its pre-image is taken).
    const bool tracked = heap.writable && heap.uffd >= 0;
    if (const int error =
            MapFileAt(at, length, heap.writable && !tracked, heap.map_sync, heap.fd, mapped);
        error != 0) {
      return error;
    }
    if (tracked) {
      FaultPoint("client.growth.mapped_before_protected");
      if (!RegisterForWriteProtection(heap.uffd, at, length) && heap.unprotected != nullptr) {
        heap.unprotected->store(true, std::memory_order_release);
      }
      if (mprotect(at, length, PROT_READ | PROT_WRITE) != 0) return errno;
    }
  }
  uint64_t seen = mapped;
  while (seen < size &&
         !heap.mapped->compare_exchange_weak(seen, size, std::memory_order_seq_cst)) {
  }
  // The fence holds this lock (WriteTracker::Fence), so the flag changes
  // here only for a mapper without it (no slot, or a signal on the thread
  // mapping). A fence maps privately what `mapped` says after it set its
  // flag; it may have read `mapped` before the exchange above: then this
  // sees the flag (both sequentially consistent) and maps privately itself.
  if (!fenced_before && fencing()) MapPrivately(at, length, heap.fd, mapped);
  return 0;
}

// Maps the file of the heap in `slot` up to its size; false if the fault
// at `offset` lies beyond it too (a real fault). Exempt from the
// analysis: called by the signal handler, which reads the slot without
// `registering` (above).
bool MapGrowth(Registered& slot, uint64_t offset) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const GrowingHeap& heap = slot.heap;
  struct stat st;
  if (fstat(heap.fd, &st) != 0) return false;
  // Whole chunks within the reservation only, whatever size another
  // writer of the file gave it.
  const uint64_t size =
      std::min(static_cast<uint64_t>(st.st_size), heap.max_size) & ~(kChunkSize - 1);
  if (offset >= size) return false;
  const bool locked = LockMapping(slot);
  // Unregistered meanwhile (Unregister waits for this lock): not ours.
  const int error =
      slot.base.load(std::memory_order_acquire) == nullptr ? EFAULT : MapGrowthLocked(heap, size);
  if (locked) UnlockMapping(slot);
  return error == 0;  // mapped now (by us or by another thread)
}

// Exempt from the analysis: it cannot take `registering` (above).
void OnSegv(int signal, siginfo_t* info, void* context) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  char* address = static_cast<char*>(info->si_addr);
  const int saved_errno = errno;  // the interrupted code's
  for (Registered& slot : slots) {
    char* base = slot.base.load(std::memory_order_acquire);
    if (base == nullptr || address < base || address >= base + slot.heap.max_size) continue;
    const uint64_t offset = static_cast<uint64_t>(address - base);
    const bool mapped =
        offset >= slot.heap.mapped->load(std::memory_order_acquire) && MapGrowth(slot, offset);
    errno = saved_errno;
    if (mapped) return;  // the access is retried
    break;
  }
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(signal, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
  } else {
    // Retrying the access with the default action kills the process with
    // SIGSEGV, as without this handler.
    struct sigaction fallback = {};
    fallback.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &fallback, nullptr);
  }
}

}  // namespace

int RegisterHeapForGrowthFaults(const GrowingHeap& heap) {
  std::call_once(installed, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSegv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous);
    // A forked child has none of the heaps (their mapped parts are kept
    // from children, MADV_DONTFORK): its faults there stay faults, and a
    // lock a parent's thread held at the fork is not waited on.
    pthread_atfork(nullptr, nullptr, [] {
      for (Registered& slot : slots) {
        slot.base.store(nullptr, std::memory_order_relaxed);
        slot.mapping_by.store(0, std::memory_order_relaxed);
      }
    });
  });
  absl::MutexLock lock(&registering);
  for (int i = 0; i < kSlots; ++i) {
    if (slots[i].base.load() != nullptr) continue;
    slots[i].heap = heap;
    slots[i].base.store(heap.base, std::memory_order_release);
    return i;
  }
  return -1;
}

int MapHeapGrowth(const GrowingHeap& heap, int slot, uint64_t size) {
  GrowthMappingLock lock(slot);
  return MapGrowthLocked(heap, size);
}

GrowthMappingLock::GrowthMappingLock(int slot) : slot_(slot) {
  if (slot_ >= 0 && slot_ < kSlots) held_ = LockMapping(slots[slot_]);
}

GrowthMappingLock::~GrowthMappingLock() {
  if (held_) UnlockMapping(slots[slot_]);
}

void UnregisterHeapForGrowthFaults(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  absl::MutexLock lock(&registering);
  slots[slot].base.store(nullptr, std::memory_order_release);
  // A handler that saw the slot registered and is mapping finishes before
  // the heap's mapping and fields go away (it checks `base` again under
  // the lock).
  if (LockMapping(slots[slot])) UnlockMapping(slots[slot]);
}

}  // namespace heapd
