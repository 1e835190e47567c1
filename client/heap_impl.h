// HeapImpl: what a heapd::Heap (heapd/heap.h) is inside the client
// library: the mapping and its growth, per-thread lease caches, frees of
// other threads and processes, the large-object reserve, multi-part syncs,
// names looked up at attach, and write tracking. Heap's methods are this
// class's, reached by a static downcast (a Heap is always a HeapImpl).
//
// Allocation: each thread carves small objects (up to 1 MiB) out of chunks
// it leases from the daemon in batches; allocate and deallocate of those
// make no system call, no RPC and no atomic read-modify-write (owner_gate.h).
// Large objects up to kMaxCarvedChunks chunks are carved from chunks heapd
// reserves for the session in growing batches (allocator/large_reserve.h):
// no RPC per object; heapd learns of them at the next sync, where they
// commit. Larger ones are one RPC each. Freeing an object of another thread
// queues it for that thread's cache; freeing one in a chunk this process
// does not lease (another process allocated it) is batched to the daemon,
// which validates it. Objects that other processes allocate after this one
// mapped the heap are mapped on first touch (growth_fault_handler.h).
#ifndef HEAPD_CLIENT_HEAP_IMPL_H_
#define HEAPD_CLIENT_HEAP_IMPL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/large_reserve.h"
#include "allocator/lease_pool.h"
#include "client/free_batch.h"
#include "client/mapped_heap.h"
#include "client/prefetched_names.h"
#include "client/session_calls.h"
#include "client/spin_lock.h"
#include "client/write_tracker.h"
#include "heap/name_table.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "util/unique_fd.h"

namespace heapd {

class HeapImpl final : public Heap {
 public:
  ~HeapImpl() override;  // detaches if detach() was not called; errors go to stderr

  // Heap's calls (heapd/heap.h says what each does). The fast two are
  // inlined into Heap's (client/heap.cc, where both are defined; no other
  // file calls them): a Heap call costs one call, as before the split.
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::StatusOr<void*> allocate(uint64_t size, uint64_t align);
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::Status deallocate(void* p, uint64_t size_hint);
  absl::StatusOr<uint64_t> sync() ABSL_LOCKS_EXCLUDED(sync_mu_);
  absl::Status detach();
  const std::string& name() const { return name_; }
  bool read_only() const { return read_only_; }
  bool content_rollback() const { return tracker_ != nullptr; }
  const std::string& content_rollback_note() const { return content_rollback_note_; }
  bool fenced() const { return tracker_ != nullptr && tracker_->fenced(); }
  void prepare_write(void* p, uint64_t size);
  // In a child after fork(): the session is the parent's, so this process
  // keeps what it mapped as its own copy-on-write view (reads see the heap
  // as the file holds it, writes stay here) and never calls heapd for it;
  // the Heap is left as detached. (On a heap with content rollback the
  // child inherited no mapping at all: MADV_DONTFORK.)
  absl::Status KeepPrivatelyAfterFork();
  uint64_t session() const { return session_; }
  uint64_t max_size() const { return max_size_; }
  absl::StatusOr<Named> Lookup(const std::string& name);
  absl::Status Unbind(const std::string& name) { return Remove(name).status(); }
  absl::StatusOr<Named> Remove(const std::string& name);
  absl::Status Bind(const std::string& name, const void* object, uint64_t size,
                    const std::string& type_name);
  absl::StatusOr<void*> Find(const std::string& name, const std::string& type_name, uint64_t size);

  // For transports (Client::Attach, AttachInProcess): a Heap over `calls`,
  // on the session `attached` describes. Maps `data_fd` (owned from now
  // on); `journal`: the session's undo journal when the heap tracks
  // contents. On failure the session is left to end on the serving side.
  static absl::StatusOr<std::unique_ptr<Heap>> Start(std::unique_ptr<SessionCalls> calls,
                                                     std::string name, const AttachOptions& options,
                                                     const v1::AttachResponse& attached,
                                                     int data_fd, UniqueFd journal);

  // The HeapImpl every Heap is.
  static HeapImpl& Of(Heap& heap) { return static_cast<HeapImpl&>(heap); }
  static const HeapImpl& Of(const Heap& heap) { return static_cast<const HeapImpl&>(heap); }

  // Whether this process leases the chunk holding `p` (a thread cache's
  // small-object chunk, or one reserved for its large objects): then a free
  // there is judged here, and a double free of an object another process
  // allocated there surfaces at that process's next sync. For tests.
  bool leases(const void* p) const;

 private:
  struct ThreadCache;

  HeapImpl(std::unique_ptr<SessionCalls> calls, std::string name, const AttachOptions& options,
           uint64_t session, int data_fd);
  // Maps the heap and takes what Attach returned.
  absl::Status Start(const v1::AttachResponse& attached, UniqueFd journal);

  ThreadCache* CacheOfThisThread();
  ThreadCache* NewCacheForThisThread();
  absl::StatusOr<std::vector<LeaseGrant>> Lease(ThreadCache* cache, uint32_t size_class,
                                                uint32_t count);
  void AdoptGrants(ThreadCache* cache, const std::vector<LeaseGrant>& grants);
  // Applies other threads' frees to `cache`. REQUIRES: inside its gate.
  void ApplyRemoteFrees(ThreadCache* cache);
  // A large object: carved from the reserve (topped up first when no run
  // fits), or from heapd when above kMaxCarvedChunks.
  absl::StatusOr<uint64_t> AllocateLarge(uint64_t size);
  // AllocateLarge of heapd: an object of `size` bytes, or with `reserve`
  // a run of chunks for the reserve, of `min_size` to `size` bytes;
  // checked, mapped and unprotected.
  absl::StatusOr<LargePlacement> TakeFromHeapd(uint64_t size, bool reserve, uint64_t min_size);
  // Hands the reserve's uncarved chunks back to heapd now (the heap is
  // full: they may be what an allocation needs); true if it held some and
  // heapd took them. Takes no lock but large_mu_ (safe from a thread
  // cache's allocation path).
  bool ReturnReserve() ABSL_LOCKS_EXCLUDED(large_mu_);
  // `call()`, and once more if the heap was full and ReturnReserve gave
  // heapd something back.
  absl::Status WithReserveBack(const std::function<absl::Status()>& call)
      ABSL_LOCKS_EXCLUDED(large_mu_);
  // One part of a sync (more=true) that tells heapd of carved objects and
  // released runs, taken at once (ChunkDirectory::TellReserve).
  absl::Status TellReserve(absl::Span<const LargePlacement> placed,
                           absl::Span<const LargePlacement> released);
  // Tells heapd of the carved objects it does not know yet (before one is
  // bound to a name), in parts of a sync.
  absl::Status PlaceUntold() ABSL_LOCKS_EXCLUDED(sync_mu_, large_mu_);
  // A free of `offset` in this process's reserve: true if it freed an
  // untold object, false if the reserve does not hold its chunk (heapd
  // judges it), INVALID_ARGUMENT if it holds it but no object starts there.
  absl::StatusOr<bool> FreeUntold(uint64_t offset, uint64_t size_hint);
  absl::Status FreeRemotely(std::vector<v1::ObjectRef> objects);
  absl::Status FlushFrees();
  // The entry `name` binds (prefetched at attach, else looked up), checked
  // to lie within the heap.
  absl::StatusOr<NameEntry> EntryOf(const std::string& name);
  // The address of `entry`'s object, mapping the heap's growth up to it.
  absl::StatusOr<void*> MapObject(const NameEntry& entry);
  // Whether the write tracker let a store through without its pre-image
  // (told to heapd with each sync and the detach).
  bool StoresUnseen() const;
  // `generation`: the content generation the sync commits (0: none); sent
  // with the last part only.
  // A sync's reports and placements but the last kReportsPerSync and
  // kPlacementsPerPart, as parts heapd holds for the last; `sent` and
  // `placed_sent` count them.
  absl::Status SendEarlierParts(const std::vector<LeaseReport>& reports, size_t* sent,
                                const std::vector<LargePlacement>& placed, size_t* placed_sent);
  // `released`: reserved runs handed back (with the last part).
  absl::Status SendSync(const std::vector<LeaseReport>& reports,
                        const std::vector<LargePlacement>& placed,
                        const std::vector<LargePlacement>& released, uint64_t generation,
                        v1::SyncResponse* response);

  const std::unique_ptr<SessionCalls> calls_;
  const std::string name_;
  const bool read_only_;
  const uint64_t session_;
  const uint32_t lease_batch_;
  const uint64_t serial_;  // tells heaps apart in thread-local lookups
  const int data_fd_;
  // The session's lifeline (its heapd.fd.sock connection), as Start saw it:
  // closed in a forked child without a lock another thread may have held.
  int lifeline_fd_ = -1;
  bool detached_ = false;

  // Set by Start and reset by detach (nothing runs concurrently with
  // either).
  std::unique_ptr<MappedHeap> mapped_;
  uint64_t max_size_ = 0;  // mapped_'s, kept here for the fast paths

  // Set by Start on a heap with content rollback; reset by detach.
  std::unique_ptr<WriteTracker> tracker_;
  std::string content_rollback_note_;

  // Held through a sync: its reports, generation and request parts must
  // reach heapd in the order they were taken.
  absl::Mutex sync_mu_;
  absl::Mutex caches_mu_;
  std::map<std::thread::id, std::unique_ptr<ThreadCache>> caches_ ABSL_GUARDED_BY(caches_mu_);
  // Which thread cache leases each chunk (null: none of this process).
  std::unique_ptr<std::atomic<ThreadCache*>[]> chunk_owner_;

  // The first rejected free of another thread's object, for sync().
  absl::Mutex deferred_mu_;
  absl::Status deferred_error_ ABSL_GUARDED_BY(deferred_mu_);

  // Frees of other processes' objects, sent to heapd in batches.
  FreeBatch frees_;

  // Chunks reserved for large objects; held across the call that tops the
  // reserve up. Taken after sync_mu_.
  mutable absl::Mutex large_mu_ ABSL_ACQUIRED_AFTER(sync_mu_);
  LargeReserve large_ ABSL_GUARDED_BY(large_mu_);
  uint32_t next_reserve_chunks_ ABSL_GUARDED_BY(large_mu_);

  // Names looked up at attach, served by Find without a call.
  PrefetchedNames prefetched_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_HEAP_IMPL_H_
