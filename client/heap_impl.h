// HeapImpl: what a heapd::Heap (heapd/heap.h) is inside the client
// library. Heap's methods are this class's, reached by a static downcast (a
// Heap is always a HeapImpl). It composes the session's parts and orders
// them (attach, sync, detach):
//   MappedHeap     the mapping and its growth (mapped_heap.h)
//   thread caches  each thread carves small objects (up to 1 MiB) out of
//                  chunks it leases from heapd in batches; allocate and
//                  deallocate of those make no system call, no RPC and no
//                  atomic read-modify-write (owner_gate.h); freeing another
//                  thread's object queues it for that thread's cache
//   LargeObjects   objects above 1 MiB, carved from a reserve (large_objects.h)
//   RemoteFrees    frees of objects other processes allocated, which heapd
//                  judges (remote_frees.h)
//   SyncParts      a sync or detach too large for one call (sync_parts.h)
//   WriteTracker   pre-images for content rollback (write_tracker.h)
//   PrefetchedNames  names looked up at attach (prefetched_names.h)
#ifndef HEAPD_CLIENT_HEAP_IMPL_H_
#define HEAPD_CLIENT_HEAP_IMPL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/lease_pool.h"
#include "client/large_objects.h"
#include "client/mapped_heap.h"
#include "client/prefetched_names.h"
#include "client/remote_frees.h"
#include "client/session_calls.h"
#include "client/thread_caches.h"
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
  // In a forked child: unmaps the parent's mapping of a fixed-address heap
  // (kept or not), giving its range back.
  void UnmapInForkedChild() { mapped_->UnmapInForkedChild(); }
  uint64_t session() const { return session_; }
  uint64_t max_size() const { return max_size_; }
  bool fixed_address() const { return fixed_address_; }
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
  HeapImpl(std::unique_ptr<SessionCalls> calls, std::string name, const AttachOptions& options,
           uint64_t session, int data_fd);
  // Maps the heap and takes what Attach returned.
  absl::Status Start(const v1::AttachResponse& attached, UniqueFd journal);

  // Leases `count` chunks of `size_class` for a thread cache: checked,
  // mapped, and unprotected where nothing in them is allocated.
  absl::StatusOr<std::vector<LeaseGrant>> Lease(uint32_t size_class, uint32_t count,
                                                absl::Span<const uint32_t> reuse);
  // The entry `name` binds (prefetched at attach, else looked up), checked
  // to lie within the heap.
  absl::StatusOr<NameEntry> EntryOf(const std::string& name);
  // The address of `entry`'s object, mapping the heap's growth up to it.
  absl::StatusOr<void*> MapObject(const NameEntry& entry);
  // FAILED_PRECONDITION: the session was detached (or is a forked child's
  // private copy). Checked on every path that would reach heapd or the
  // session's parts; the fast paths reach neither.
  absl::Status DetachedError() const;
  // LargeObjects' calls that take sync_mu_ themselves (to top the reserve
  // up, to tell heapd of untold objects), only through these: the
  // thread-safety analysis then refuses a call with sync_mu_ held, which
  // would deadlock.
  absl::StatusOr<uint64_t> AllocateLarge(uint64_t size) ABSL_LOCKS_EXCLUDED(sync_mu_) {
    return large_->Allocate(size);
  }
  absl::Status TellUntold() ABSL_LOCKS_EXCLUDED(sync_mu_) { return large_->TellUntold(); }
  // Whether the write tracker let a store through without its pre-image
  // (told to heapd with each sync and the detach).
  bool StoresUnseen() const;

  const std::unique_ptr<SessionCalls> calls_;
  const std::string name_;
  const bool read_only_;
  const bool fixed_address_asked_;  // AttachOptions::fixed_address
  const uint64_t session_;
  const int data_fd_;
  // The session's lifeline (its heapd.fd.sock connection), as Start saw it:
  // closed in a forked child without a lock another thread may have held.
  int lifeline_fd_ = -1;
  bool detached_ = false;

  // Set by Start and reset by detach (nothing runs concurrently with
  // either).
  std::unique_ptr<MappedHeap> mapped_;
  uint64_t max_size_ = 0;  // mapped_'s, kept here for the fast paths
  bool fixed_address_ = false;

  // Set by Start on a heap with content rollback; reset by detach.
  std::unique_ptr<WriteTracker> tracker_;
  std::string content_rollback_note_;

  // Held through a sync: its reports, generation and request parts must
  // reach heapd in the order they were taken.
  absl::Mutex sync_mu_;

  // Each thread's small objects.
  ThreadCaches caches_;

  // Frees of other processes' objects, sent to heapd.
  RemoteFrees frees_;

  // Objects above 1 MiB; set by Start.
  std::unique_ptr<LargeObjects> large_;

  // Names looked up at attach, served by Find without a call.
  PrefetchedNames prefetched_;
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_HEAP_IMPL_H_
