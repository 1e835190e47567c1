// GrowthFaultHandler: lets a process follow pointers into parts of a heap
// that other processes grew after this one last mapped it. A heap is mapped
// up to the size this process knows; an object another client allocated in
// newer chunks lies beyond that, inside the PROT_NONE reservation. The
// SIGSEGV handler installed here maps the data file up to its current size
// (fstat) when a fault lands in a registered reservation beyond the mapped
// part, and the faulting access is retried. Any other fault goes to the
// previous handler, or kills the process as it would have.
#ifndef HEAPD_CLIENT_GROWTH_FAULT_HANDLER_H_
#define HEAPD_CLIENT_GROWTH_FAULT_HANDLER_H_

#include <atomic>
#include <cstdint>

namespace heapd {

// A heap's reservation [base, base + max_size), whose first `*mapped`
// bytes map `fd` (with PROT_READ, plus PROT_WRITE if `writable`; with
// MAP_SYNC if `map_sync`, see FileTakesMapSync). Whoever maps more raises
// `*mapped` (never lowers it).
struct GrowingHeap {
  char* base = nullptr;
  uint64_t max_size = 0;
  int fd = -1;
  bool writable = false;
  bool map_sync = false;
  std::atomic<uint64_t>* mapped = nullptr;
  // The heap's WriteTracker's userfaultfd (-1: none): growth is registered
  // with it and write-protected before any store can reach it.
  int uffd = -1;
  // Null: none. Once true, growth is mapped privately (the session is
  // over: stores must not reach the heap; see WriteTracker).
  const std::atomic<bool>* fenced = nullptr;
  // Null: none. Set when growth could not be write-protected (its stores
  // take no pre-images; WriteTracker::error reports it).
  std::atomic<bool>* unprotected = nullptr;
};

// Registers `heap` with the SIGSEGV handler. Returns a slot for
// Unregister, or -1 if every slot is taken (then faults stay faults).
int RegisterHeapForGrowthFaults(const GrowingHeap& heap);
void UnregisterHeapForGrowthFaults(int slot);

// Maps `heap`'s file up to `size` bytes (no further than `*heap.mapped`
// says is mapped already), as the handler does, holding the slot's
// GrowthMappingLock (slot -1: not registered, no lock). Callers serialize
// their calls for one heap. Returns 0, or the errno of the failed mmap.
int MapHeapGrowth(const GrowingHeap& heap, int slot, uint64_t size);

// Held while a heap's mapping grows (the handler, MapHeapGrowth): two
// mappers of the same range would each map it anew, and the later map
// drops the earlier one's registration for write protection until it
// registers its own, a window in which a store takes no pre-image; and a
// store into growth mapped read-only until it is protected (below) waits
// here until it is. The handler takes it spinning, except on the thread
// holding it (a signal on the thread mapping). Slot -1: nothing.
class GrowthMappingLock {
 public:
  explicit GrowthMappingLock(int slot);
  ~GrowthMappingLock();
  GrowthMappingLock(const GrowthMappingLock&) = delete;
  GrowthMappingLock& operator=(const GrowthMappingLock&) = delete;

 private:
  const int slot_;
  bool held_ = false;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_GROWTH_FAULT_HANDLER_H_
