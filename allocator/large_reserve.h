// LargeReserve: the client side of chunks reserved for large objects. heapd
// reserves runs of whole chunks for a session (AllocateLarge with reserve);
// the session carves its large objects from them with no call per object
// and tells heapd which it carved with its next sync (the placements),
// where they commit. An object freed before heapd was told of it goes
// straight back to the reserve. What a sync finds not carved goes back to
// heapd with it.
//
// An object's life here: carved (untold) -> taken for a sync (in flight)
// -> told (the sync answered: forgotten here, heapd knows it). If the sync
// fails, its placements are sent again, marked `again` (heapd places them
// if it had not, and skips them if it had), and are no longer freed
// locally: heapd may have placed them.
//
// Not thread-safe: the owning Heap serializes calls.
#ifndef HEAPD_ALLOCATOR_LARGE_RESERVE_H_
#define HEAPD_ALLOCATOR_LARGE_RESERVE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "allocator/free_runs.h"
#include "allocator/lease_types.h"

namespace heapd {

class LargeReserve {
 public:
  // heapd reserved [first, first + chunks) for this session. False (and
  // nothing added) if any of it is held already: heapd answered wrong.
  // Placements to send again that lie there are dropped (heapd had placed
  // them, and they were freed since). REQUIRES: no sync in flight.
  bool Add(uint32_t first, uint32_t chunks);

  // Carves an object of `chunks` chunks (best fit); its first chunk, or
  // nullopt if no reserved run is long enough.
  std::optional<uint32_t> Carve(uint32_t chunks);

  // If `chunk` starts an untold object: its chunks go back to the reserve,
  // true. False for anything else (heapd validates those frees).
  bool FreeUntold(uint32_t chunk);
  // True if `chunk` is reserved and not carved, or in an untold object.
  bool Holds(uint32_t chunk) const;
  // True if the object at `chunk` is untold or in flight: heapd may not
  // know it yet.
  bool NotYetTold(uint32_t chunk) const;
  // The length of the untold object at `chunk`; 0 if none starts there.
  uint32_t UntoldChunks(uint32_t chunk) const {
    auto it = untold_.find(chunk);
    return it == untold_.end() ? 0 : it->second;
  }

  // The placements a sync tells heapd: the untold objects and those of
  // failed syncs. They are in flight until SyncDone or SyncFailed.
  std::vector<LargePlacement> TakeForSync();
  void SyncDone() { in_flight_.clear(); }
  void SyncFailed();

  // Takes up to `most` runs of reserved chunks not carved, for a sync to
  // hand back: gone from here whatever becomes of the sync (heapd frees
  // them when the session ends, if not before).
  std::vector<LargePlacement> TakeFreeRuns(size_t most);
  uint64_t free_chunks() const { return free_.free_chunks(); }

 private:
  FreeRuns free_;
  std::map<uint32_t, uint32_t> untold_;  // first chunk -> chunks
  std::vector<LargePlacement> in_flight_;
  std::vector<LargePlacement> resend_;  // of failed syncs
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_LARGE_RESERVE_H_
