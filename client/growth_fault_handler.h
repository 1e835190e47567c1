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

// Registers the reservation [base, base + max_size) whose first `*mapped`
// bytes map `fd` (with PROT_READ, plus PROT_WRITE if `writable`; with
// MAP_SYNC if `map_sync`, see FileTakesMapSync). The handler raises
// `*mapped` when it maps more. Returns a slot for
// Unregister, or -1 if every slot is taken (then faults stay faults).
// `uffd` (-1: none): the heap's WriteTracker's userfaultfd, with which the
// growth mapped is registered and write-protected; `fenced` (null: none):
// once true, growth is mapped privately (the session is over: stores must
// not reach the heap; see WriteTracker).
int RegisterHeapForGrowthFaults(char* base, uint64_t max_size, int fd, bool writable, bool map_sync,
                                std::atomic<uint64_t>* mapped, int uffd = -1,
                                const std::atomic<bool>* fenced = nullptr);
void UnregisterHeapForGrowthFaults(int slot);

// Held while a heap's mapping grows outside the handler (Heap::MapUpTo):
// two mappers of the same range would each map it anew, and the later map
// drops the earlier one's registration for write protection until it
// registers its own, a window in which a store takes no pre-image. The
// handler takes the same lock (spinning), except on the thread holding it.
// Slot -1: nothing.
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
