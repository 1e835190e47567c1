// Messages exchanged between a client (its LeasePool and LargeReserve) and
// the daemon's ChunkDirectory about leased small-object chunks and chunks
// reserved for large objects.
#ifndef HEAPD_ALLOCATOR_LEASE_TYPES_H_
#define HEAPD_ALLOCATOR_LEASE_TYPES_H_

#include <cstdint>
#include <vector>

namespace heapd {

// The most chunks one lease call may ask for (heapd refuses more).
inline constexpr uint32_t kMaxLeaseBatch = 64;

// Identifies one client session of one heap. 0 is never a client.
using ClientId = uint64_t;

// An object named by its offset, with the size the caller believes it has
// (0: not checked).
struct ObjectRef {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Chunks of one size class a client asks for.
struct LeaseWant {
  uint32_t size_class = 0;
  uint32_t count = 0;
  std::vector<uint32_t> reuse;  // emptied chunks of the client's, offered first
};

// A chunk handed to a client: its index, its size class and the slot bitmap
// the daemon knows (live objects from earlier owners stay allocated).
struct LeaseGrant {
  uint32_t chunk = 0;
  uint32_t size_class = 0;
  std::vector<uint64_t> words;
};

// A client's view of one leased chunk, sent at sync or when returning it.
struct LeaseReport {
  uint32_t chunk = 0;
  std::vector<uint64_t> words;
  // The class the client holds it as; -1: not said. A report of another
  // class than the chunk's is stale and skipped (ChunkDirectory::Report).
  int32_t size_class = -1;
};

// What the daemon changed in a reported bitmap, for the client to apply to
// its own copy: slots freed by other clients since the last report, and
// slots of named objects that the client freed although a name binds them
// (a bound object stays live until its name is unbound).
struct LeaseCorrection {
  uint32_t chunk = 0;
  std::vector<uint32_t> freed_slots;
  std::vector<uint32_t> kept_slots;
};

// A large object a client carved from chunks reserved for it: its first
// chunk and length. `again`: sent before with a sync whose answer the
// client did not get (the daemon may have placed it then, and it may have
// been freed since): placed if its chunks are still reserved for the
// client, else skipped.
struct LargePlacement {
  uint32_t chunk = 0;
  uint32_t chunks = 0;
  bool again = false;
};

// What a client tells of the chunks reserved for it, with a sync: the large
// objects it carved there, and runs (first chunk, length) it hands back.
struct ReserveReport {
  std::vector<LargePlacement> placed;
  std::vector<LargePlacement> released;
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_LEASE_TYPES_H_
