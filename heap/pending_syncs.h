// PendingSyncs: what each client's next sync commits besides the reports it
// sends last.
//  - Staged reports: a sync may come in parts (PersistentHeap::StageReports);
//    the reports of its earlier parts wait here, by chunk, until the last
//    part applies them with its own. A chunk staged again replaces its
//    earlier report.
//  - Deferred frees: on a heap whose contents roll back, a client's frees
//    belong to the same unit as its stores (PersistentHeap::Free): they wait
//    here, checked, until its next sync commits the stores that unlinked the
//    objects, and are dropped if it dies first.
// A client that dies commits none of it (Drop).
//
// Holds no chunk state of its own: each call that needs the chunks' state
// is given the heap's ChunkDirectory. Not thread-safe: the heap's mutex
// guards it and the directory together.
#ifndef HEAPD_HEAP_PENDING_SYNCS_H_
#define HEAPD_HEAP_PENDING_SYNCS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "allocator/chunk_directory.h"
#include "allocator/lease_types.h"

namespace heapd {

class PendingSyncs {
 public:
  // Holds `reports` of `client` (already checked) until TakeStaged.
  void Stage(ClientId client, absl::Span<const LeaseReport> reports);
  // `last` with the client's staged reports of other chunks (a chunk in
  // `last` is reported by `last`); none stay staged.
  std::vector<LeaseReport> TakeStaged(ClientId client, absl::Span<const LeaseReport> last);

  // Defers the frees of `objects` (checked with ChunkDirectory::CheckFree)
  // to `client`'s next sync, with their chunks' lessee and incarnation now.
  // INVALID_ARGUMENT, deferring none, if one of them is deferred already.
  absl::Status DeferFrees(const ChunkDirectory& directory, ClientId client,
                          absl::Span<const ObjectRef> objects);
  // Applies `client`'s deferred frees (its sync committed); those whose
  // object is gone since (its chunk was emptied and maybe reused, or
  // another session freed it first) go to `rejected`, the rest are freed.
  void ApplyFrees(ChunkDirectory& directory, ClientId client, std::vector<std::string>* rejected);
  // `lessee`'s session ended (its leases ended in `directory`): deferred
  // frees of objects in chunks it leased are judged by the directory from
  // now on; if it died, those of objects not live in its last report were
  // allocated after it and died with it, and are dropped.
  void SettleFrees(const ChunkDirectory& directory, ClientId lessee, bool lessee_died);

  // `client` died: its staged reports and deferred frees go with it.
  void Drop(ClientId client);

  size_t StagedCount(ClientId client) const;
  size_t DeferredCount(ClientId client) const;

 private:
  struct DeferredFree {
    ObjectRef object;
    // The session that leased its chunk when it was freed (0: none), until
    // that session ends (SettleFrees).
    ClientId lessee = 0;
    uint32_t incarnation = 0;  // of its chunk when it was checked
  };
  // By client, then by chunk: each chunk is leased by its client, which
  // bounds them.
  std::map<ClientId, std::map<uint32_t, LeaseReport>> staged_;
  // By client, then by offset.
  std::map<ClientId, std::map<uint64_t, DeferredFree>> deferred_;
};

}  // namespace heapd

#endif  // HEAPD_HEAP_PENDING_SYNCS_H_
