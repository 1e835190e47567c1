#include "client/growth_fault_handler.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/write_tracker.h"
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
  std::atomic<char*> base{nullptr};  // null: free slot
  uint64_t max_size ABSL_GUARDED_BY(registering) = 0;
  int fd ABSL_GUARDED_BY(registering) = -1;
  bool writable ABSL_GUARDED_BY(registering) = false;
  bool map_sync ABSL_GUARDED_BY(registering) = false;
  std::atomic<uint64_t>* mapped ABSL_GUARDED_BY(registering) = nullptr;
  int uffd ABSL_GUARDED_BY(registering) = -1;  // write tracking; -1: none
  const std::atomic<bool>* fenced ABSL_GUARDED_BY(registering) = nullptr;
  // The thread mapping the heap's growth (GrowthMappingLock); 0: none.
  std::atomic<pid_t> mapping_by{0};
};

Registered slots[kSlots];
struct sigaction previous;
std::once_flag installed;

// Takes `heap`'s mapping lock; false (not taken) if this thread holds it
// already (a signal handler on the thread mapping). Async-signal-safe.
bool LockMapping(Registered& heap) {
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  for (pid_t holder = 0;
       !heap.mapping_by.compare_exchange_weak(holder, self, std::memory_order_acquire);
       holder = 0) {
    if (holder == self) return false;
    sched_yield();
  }
  return true;
}
void UnlockMapping(Registered& heap) { heap.mapping_by.store(0, std::memory_order_release); }

// Maps the file of `heap` up to its size; false if the fault at `offset`
// lies beyond it too (a real fault). Exempt from the analysis: called by
// the signal handler, which reads the slot without `registering` (above).
bool MapGrowth(Registered& heap, uint64_t offset) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  struct stat st;
  if (fstat(heap.fd, &st) != 0) return false;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset >= size || size > heap.max_size) return false;
  const bool locked = LockMapping(heap);
  // Read under the lock: what another mapper mapped is not mapped again.
  const uint64_t mapped = heap.mapped->load(std::memory_order_acquire);
  if (size > mapped) {
    char* at = heap.base.load(std::memory_order_acquire) + mapped;
    const std::atomic<bool>* fenced = heap.fenced;
    auto fencing = [fenced] {
      return fenced != nullptr && fenced->load(std::memory_order_seq_cst);
    };
    const bool fenced_before = fencing();
    if (fenced_before) {
      MapPrivately(at, size - mapped, heap.fd, mapped);  // as the rest after a fence
    } else {
      if (MapFileAt(at, size - mapped, heap.writable, heap.map_sync, heap.fd, mapped) != 0) {
        if (locked) UnlockMapping(heap);
        return false;
      }
      if (heap.uffd >= 0) RegisterForWriteProtection(heap.uffd, at, size - mapped);
    }
    uint64_t seen = mapped;
    while (seen < size &&
           !heap.mapped->compare_exchange_weak(seen, size, std::memory_order_seq_cst)) {
    }
    // A fence maps privately what `mapped` says after it set its flag; it
    // may have read `mapped` before the exchange above: then this sees
    // the flag (both sequentially consistent) and maps privately itself.
    if (!fenced_before && fencing()) MapPrivately(at, size - mapped, heap.fd, mapped);
  }
  if (locked) UnlockMapping(heap);
  return true;  // mapped now (by us or by another thread)
}

// Exempt from the analysis: it cannot take `registering` (above).
void OnSegv(int signal, siginfo_t* info, void* context) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  char* address = static_cast<char*>(info->si_addr);
  const int saved_errno = errno;  // the interrupted code's
  for (Registered& heap : slots) {
    char* base = heap.base.load(std::memory_order_acquire);
    if (base == nullptr || address < base || address >= base + heap.max_size) continue;
    const uint64_t offset = static_cast<uint64_t>(address - base);
    const bool mapped =
        offset >= heap.mapped->load(std::memory_order_acquire) && MapGrowth(heap, offset);
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

int RegisterHeapForGrowthFaults(char* base, uint64_t max_size, int fd, bool writable, bool map_sync,
                                std::atomic<uint64_t>* mapped, int uffd,
                                const std::atomic<bool>* fenced) {
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
      for (Registered& heap : slots) {
        heap.base.store(nullptr, std::memory_order_relaxed);
        heap.mapping_by.store(0, std::memory_order_relaxed);
      }
    });
  });
  absl::MutexLock lock(&registering);
  for (int i = 0; i < kSlots; ++i) {
    if (slots[i].base.load() != nullptr) continue;
    slots[i].max_size = max_size;
    slots[i].fd = fd;
    slots[i].writable = writable;
    slots[i].map_sync = map_sync;
    slots[i].mapped = mapped;
    slots[i].uffd = uffd;
    slots[i].fenced = fenced;
    slots[i].base.store(base, std::memory_order_release);
    return i;
  }
  return -1;
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
}

}  // namespace heapd
