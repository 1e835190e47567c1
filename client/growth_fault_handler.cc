#include "client/growth_fault_handler.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <mutex>

#include "heap/heap_mapping.h"


namespace heapd {
namespace {

constexpr int kSlots = 64;

struct Registered {
  std::atomic<char*> base{nullptr};  // null: free slot
  uint64_t max_size = 0;
  int fd = -1;
  bool writable = false;
  std::atomic<uint64_t>* mapped = nullptr;
};

Registered slots[kSlots];
struct sigaction previous;
std::once_flag installed;

// Maps the file of `heap` up to its size; false if the fault at `offset`
// lies beyond it too (a real fault).
bool MapGrowth(Registered& heap, uint64_t offset) {
  struct stat st;
  if (fstat(heap.fd, &st) != 0) return false;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t mapped = heap.mapped->load(std::memory_order_acquire);
  if (offset >= size || size > heap.max_size) return false;
  if (size > mapped) {
    bool map_sync = false;
    if (MapFileAt(heap.base.load(std::memory_order_acquire) + mapped, size - mapped,
                  heap.writable, heap.fd, mapped, &map_sync) != 0) {
      return false;
    }
    uint64_t seen = mapped;
    while (seen < size && !heap.mapped->compare_exchange_weak(seen, size)) {
    }
  }
  return true;  // mapped now (by us or by another thread)
}

void OnSegv(int signal, siginfo_t* info, void* context) {
  char* address = static_cast<char*>(info->si_addr);
  const int saved_errno = errno;  // the interrupted code's
  for (Registered& heap : slots) {
    char* base = heap.base.load(std::memory_order_acquire);
    if (base == nullptr || address < base || address >= base + heap.max_size) continue;
    const uint64_t offset = static_cast<uint64_t>(address - base);
    const bool mapped = offset >= heap.mapped->load(std::memory_order_acquire) &&
                        MapGrowth(heap, offset);
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

int RegisterHeapForGrowthFaults(char* base, uint64_t max_size, int fd, bool writable,
                                std::atomic<uint64_t>* mapped) {
  std::call_once(installed, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSegv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous);
  });
  static std::mutex registering;
  std::lock_guard<std::mutex> lock(registering);
  for (int i = 0; i < kSlots; ++i) {
    if (slots[i].base.load() != nullptr) continue;
    slots[i].max_size = max_size;
    slots[i].fd = fd;
    slots[i].writable = writable;
    slots[i].mapped = mapped;
    slots[i].base.store(base, std::memory_order_release);
    return i;
  }
  return -1;
}

void UnregisterHeapForGrowthFaults(int slot) {
  if (slot >= 0 && slot < kSlots) slots[slot].base.store(nullptr, std::memory_order_release);
}

}  // namespace heapd
