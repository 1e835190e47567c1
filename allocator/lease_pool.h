// LeasePool: the client side of chunk leases. It holds the small-object
// chunks one owner (a client thread) leased from the daemon and carves
// objects out of them locally: allocate and free make no system call and no
// RPC, only bitmap updates.
//
// Ownership: the pool owns its ChunkLease records. The LeaseSource outlives
// the pool. Not thread-safe: one thread uses a pool at a time.
//
// Invariants (checked by CheckInvariants()):
//   - by_chunk_ maps exactly the leased chunks to their records;
//   - current_[c], if set, is a lease of class c;
//   - a lease of class c with a free slot is current_[c] or in with_space_[c]
//     (the lists may also hold leases that filled up since; they are skipped);
//   - emptied_ holds exactly the leases marked `emptied` (each once), and
//     in_doubt_ those marked `in_doubt`; none is both, nor current.
//
// Memory follows the data: a lease a free empties, not its class's current
// one, is offered to the daemon when the pool next leases for another
// class (ChunkDirectory::Reclass), so a program whose objects move on to
// larger classes (growing vectors) reuses the chunks they leave. Only a
// chunk the daemon is known to hold empty is offered (granted empty, or
// its last report the daemon answered was empty) and none whose report is
// in flight: a report of the old class must never reach the daemon after
// the chunk changed class (reports also say their class, and the daemon
// skips stale ones). If the lease call fails, the chunks offered are in
// doubt (the daemon may hold them as the old class or the new one, empty
// either way): never allocated from, offered first at the next lease
// whatever its class (the daemon grants as it is one already of that
// class), and back to use once granted.
#ifndef HEAPD_ALLOCATOR_LEASE_POOL_H_
#define HEAPD_ALLOCATOR_LEASE_POOL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "allocator/chunk_map.h"
#include "allocator/lease_types.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"

namespace heapd {

// Where a pool gets chunks from: the daemon over RPC, or an in-process PersistentHeap.
class LeaseSource {
 public:
  virtual ~LeaseSource() = default;
  // Leases up to `count` chunks of `size_class` (at least one on success),
  // first of `reuse` (at most `count` chunks of the pool's, emptied, of
  // other classes) those the daemon gives back as this class
  // (ChunkDirectory::Reclass).
  virtual absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(uint32_t size_class, uint32_t count,
                                                              absl::Span<const uint32_t> reuse) = 0;
};

enum class LocalFree {
  kFreed,      // the object was live in a chunk of this pool; it is free now
  kNotLeased,  // the offset is in no chunk of this pool: free it at the daemon
  kNotLive,    // the offset is in a leased chunk but is not a live object
};

class LeasePool {
 public:
  // `max_chunks` bounds chunk indices (the heap's maximum size in chunks);
  // `lease_batch` (clamped to 1..kMaxLeaseBatch) is the most chunks one
  // LeaseChunks call asks for. A class's first call asks for one and each
  // next call twice as many, up to `lease_batch`: a class used lightly
  // holds one chunk, not a batch, and a class's chunks leased ahead of use
  // are at most as many as it filled.
  LeasePool(LeaseSource* source, uint64_t max_chunks, uint32_t lease_batch);
  LeasePool(const LeasePool&) = delete;
  LeasePool& operator=(const LeasePool&) = delete;

  // Returns the heap offset of a new object of `size_class`.
  // Fails with the source's error (RESOURCE_EXHAUSTED when the heap is full).
  absl::StatusOr<uint64_t> Allocate(uint32_t size_class) {
    ChunkLease* lease = current_[size_class];
    if (lease != nullptr) {
      const int64_t slot = lease->bitmap.AllocateLowest();
      if (slot >= 0) {
        lease->dirty = true;
        return lease->base + static_cast<uint64_t>(slot) * lease->slot_size;
      }
    }
    return AllocateSlow(size_class);
  }

  // Frees the object at `offset` if it lies in a chunk of this pool.
  LocalFree Free(uint64_t offset) {
    ChunkLease* lease = by_chunk_.Get(offset >> kChunkShift);
    if (lease == nullptr) return LocalFree::kNotLeased;
    const uint64_t in_chunk = offset & (kChunkSize - 1);
    const uint32_t slot = SlotIndex(lease->size_class, in_chunk);
    if (uint64_t{slot} * lease->slot_size != in_chunk || slot >= lease->bitmap.slot_count() ||
        !lease->bitmap.IsAllocated(slot)) {
      return LocalFree::kNotLive;
    }
    const bool was_full = lease->bitmap.full();
    lease->bitmap.Free(slot);
    lease->dirty = true;
    if (lease != current_[lease->size_class]) {
      if (was_full) with_space_[lease->size_class].push_back(lease);
      if (lease->bitmap.live() == 0 && !lease->emptied) {
        lease->emptied = true;
        emptied_.push_back(lease);
      }
    }
    return LocalFree::kFreed;
  }

  // Returns the size class of the leased chunk holding `offset`, or -1.
  int SizeClassAt(uint64_t offset) const;

  // Reports for every chunk changed since the last call; marks them clean.
  std::vector<LeaseReport> TakeDirtyReports();

  // Marks the chunks of `reports` changed again, so the next
  // TakeDirtyReports includes them (the daemon did not answer the sync that
  // carried them: it may have applied them or not).
  void Redirty(absl::Span<const LeaseReport> reports);
  // The daemon answered the sync that carried `reports` (TakeDirtyReports'):
  // it holds those chunks as they said.
  void ReportsApplied(absl::Span<const LeaseReport> reports);

  // Reports for every leased chunk and forgets them all (detach).
  std::vector<LeaseReport> ReleaseAll();

  // Applies the daemon's corrections to reported chunks. Corrections for
  // chunks the pool no longer holds are ignored.
  void ApplyCorrections(absl::Span<const LeaseCorrection> corrections);

  size_t leased_chunks() const { return leases_.size(); }
  absl::Status CheckInvariants() const;

  // Describes why freeing `offset` was rejected, for error messages.
  std::string DescribeNotLive(uint64_t offset) const;

 private:
  struct ChunkLease {
    uint64_t base;
    uint32_t chunk;
    uint32_t size_class;
    uint32_t slot_size;
    bool dirty;
    bool emptied;      // in emptied_
    bool heapd_empty;  // the daemon holds it with no object (see the file comment)
    bool reporting;    // a report of it is in flight
    bool in_doubt;     // in in_doubt_: its class at the daemon is not known
    SlotBitmap bitmap;
  };

  absl::StatusOr<uint64_t> AllocateSlow(uint32_t size_class);
  // The chunks to offer for a lease of `size_class`: emptied leases of
  // other classes, at most `most`. Drops from emptied_ those no longer
  // empty or now current.
  std::vector<uint32_t> Offers(uint32_t size_class, uint32_t most);
  // `lease`, offered, came back as an empty chunk of `size_class`.
  void Reclass(ChunkLease* lease, uint32_t size_class, SlotBitmap bitmap);
  // A lease call that offered `lease` failed (null: nothing).
  void PutInDoubt(ChunkLease* lease);
  LeaseReport ReportOf(const ChunkLease& lease) const;

  LeaseSource* source_;
  uint32_t lease_batch_;
  std::array<uint32_t, kNumSizeClasses> next_batch_;  // of each class's next call
  std::vector<std::unique_ptr<ChunkLease>> leases_;
  ChunkMap<ChunkLease> by_chunk_;
  std::array<ChunkLease*, kNumSizeClasses> current_{};
  std::array<std::vector<ChunkLease*>, kNumSizeClasses> with_space_;
  // Leases a free emptied while not current (see the file comment).
  std::vector<ChunkLease*> emptied_;
  // Leases offered to a lease call that failed (see the file comment).
  std::vector<ChunkLease*> in_doubt_;
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_LEASE_POOL_H_
