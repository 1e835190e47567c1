// heapd::Heap: one attached heap in this process — mapped at a reserved
// address range, growing in place, with allocation, named objects and sync.
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
// which validates it.
//
// Consistency: allocations, frees and names become persistent at sync(),
// detach() or (for a bound object) construct(); after a crash the heap
// opens at the last sync. Object contents are written in place; on a heap
// with content_rollback() they too go back to this process's last sync if
// it dies (write_tracker.h: the first store to a page since the last sync
// costs one fault), elsewhere they stay as they were last written.
//
// Thread-safe, except that nothing may run concurrently with detach() or
// the destructor. A read-only heap is mapped PROT_READ: allocation fails and
// a stray store faults.
//
// Every process maps the heap at its own address: link objects with offset
// pointers (boost::interprocess::offset_ptr, as heapd::allocator does).
// Objects that other processes allocate after this one mapped the heap are
// mapped on first touch (growth_fault_handler.h).
#ifndef HEAPD_CLIENT_HEAP_H_
#define HEAPD_CLIENT_HEAP_H_

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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/large_reserve.h"
#include "allocator/lease_pool.h"
#include "client/client.h"
#include "client/growth_fault_handler.h"
#include "client/session_calls.h"
#include "client/spin_lock.h"
#include "client/type_name.h"
#include "client/write_tracker.h"
#include "heap/heap_mapping.h"
#include "heap/name_table.h"
#include "util/unique_fd.h"

namespace heapd {

// Lives in private memory just before the mapped heap, at the same distance
// from every object in every process: a heapd::allocator stored in the heap
// reaches its process's Heap through it with an offset pointer.
struct ProcessHeader {
  static constexpr uint64_t kMagic = 0x6865617064504831;  // "heapdPH1"
  uint64_t magic;
  class Heap* heap;
};
inline constexpr uint64_t kProcessHeaderBytes = 4096;

class Heap {
 public:
  ~Heap();  // detaches if detach() was not called; errors go to stderr
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Allocates `size` bytes aligned to `align` (a power of two up to 4096).
  // RESOURCE_EXHAUSTED when the heap or its file system is full,
  // FAILED_PRECONDITION on a read-only heap.
  absl::StatusOr<void*> allocate(uint64_t size, uint64_t align = 8);

  // Frees the object at `p`. INVALID_ARGUMENT if `p` is not in the heap or
  // (for objects of this thread) not a live object. Frees of other threads'
  // objects are applied by that thread or the next sync(), and frees of
  // other processes' objects are validated by the daemon when their batch
  // is sent: their errors are returned by that call or by sync().
  // `size_hint` (0: unknown) lets objects above 1 MiB go to the daemon at
  // once.
  absl::Status deallocate(void* p, uint64_t size_hint = 0);

  // construct<T>(name)(args...): allocates a T, constructs it and binds
  // `name` to it. ALREADY_EXISTS if the name is taken (nothing is left
  // allocated).
  template <typename T>
  class Constructor {
   public:
    template <typename... Args>
    absl::StatusOr<T*> operator()(Args&&... args) {
      absl::StatusOr<void*> memory = heap_->allocate(sizeof(T), alignof(T));
      if (!memory.ok()) return memory.status();
      T* object;
      try {
        object = new (*memory) T(std::forward<Args>(args)...);
      } catch (...) {
        (void)heap_->deallocate(*memory, sizeof(T));
        throw;
      }
      absl::Status bound = heap_->Bind(name_, object, sizeof(T), TypeName<T>());
      if (!bound.ok()) {
        object->~T();
        (void)heap_->deallocate(object, sizeof(T));
        return bound;
      }
      return object;
    }

   private:
    friend class Heap;
    Constructor(Heap* heap, std::string name) : heap_(heap), name_(std::move(name)) {}
    Heap* heap_;
    std::string name_;
  };
  template <typename T>
  Constructor<T> construct(std::string name) {
    return Constructor<T>(this, std::move(name));
  }

  // Binds `name` to `object`, a T in this heap made by allocate() and
  // placement new: for a structure built first and named last, so that a
  // failure while building leaves no name bound to half of it.
  // ALREADY_EXISTS if the name is taken.
  template <typename T>
  absl::Status bind(const std::string& name, const T* object) {
    return Bind(name, object, sizeof(T), TypeName<T>());
  }

  // The T bound to `name`. NOT_FOUND if unbound; FAILED_PRECONDITION if the
  // name binds another type.
  template <typename T>
  absl::StatusOr<T*> find(const std::string& name) {
    absl::StatusOr<void*> object = Find(name, TypeName<T>(), sizeof(T));
    if (!object.ok()) return object.status();
    return static_cast<T*>(*object);
  }

  // Unbinds `name`, destroys the T it bound and frees it.
  template <typename T>
  absl::Status destroy(const std::string& name) {
    absl::StatusOr<T*> object = find<T>(name);
    if (!object.ok()) return object.status();
    if (absl::Status s = Unbind(name); !s.ok()) return s;
    (*object)->~T();
    return deallocate(*object, sizeof(T));
  }

  // Makes this process's allocations, frees and object contents persistent;
  // returns the heap's new epoch. Concurrent calls run one after the other.
  absl::StatusOr<uint64_t> sync() ABSL_LOCKS_EXCLUDED(sync_mu_);

  // Syncs, returns every leased chunk and ends the session. The heap's
  // memory is unmapped: no pointer into it may be used afterwards.
  absl::Status detach();

  // Offsets and addresses in this process's mapping.
  char* base() const { return base_; }
  uint64_t offset_of(const void* p) const {
    return static_cast<uint64_t>(static_cast<const char*>(p) - base());
  }
  template <typename T = void>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(base() + offset);
  }

  const std::string& name() const { return name_; }
  bool read_only() const { return read_only_; }
  // Object contents go back to the last sync after a crash; when false,
  // content_rollback_note() says why not (heapd decides, per heap).
  bool content_rollback() const { return tracker_ != nullptr; }
  const std::string& content_rollback_note() const { return content_rollback_note_; }
  // With content_rollback(): true once heapd ended this session (it died or
  // reclaimed it) and the mapping was fenced; later stores stay in this
  // process and never reach the heap.
  bool fenced() const { return tracker_ != nullptr && tracker_->fenced(); }
  // Takes the pre-images of the pages of [p, p + size) now: needed before a
  // system call writes there (read(2) into a heap buffer) when the kernel
  // lets this process track user-mode stores only (write_tracker.h).
  void prepare_write(void* p, uint64_t size);
  uint64_t session() const { return session_; }
  uint64_t max_size() const { return max_size_; }
  ProcessHeader* process_header() const {
    return reinterpret_cast<ProcessHeader*>(base() - kProcessHeaderBytes);
  }

  // Unbinds `name`; NOT_FOUND if unbound.
  absl::Status Unbind(const std::string& name);
  // Binds `name` to the `size`-byte object at `object` of type `type_name`.
  absl::Status Bind(const std::string& name, const void* object, uint64_t size,
                    const std::string& type_name);
  // The object bound to `name`, checked to be a `type_name` of `size` bytes.
  absl::StatusOr<void*> Find(const std::string& name, const std::string& type_name, uint64_t size);

  // For transports (Client::Attach, AttachInProcess): a Heap over `calls`,
  // on the session `attached` describes. Maps `data_fd` (owned from now
  // on); `journal`: the session's undo journal when the heap tracks
  // contents. On failure the session is left to end on the serving side.
  static absl::StatusOr<std::unique_ptr<Heap>> Start(std::unique_ptr<SessionCalls> calls,
                                                     std::string name, const AttachOptions& options,
                                                     const v1::AttachResponse& attached,
                                                     int data_fd, UniqueFd journal);

  // Whether this process leases the chunk holding `p` (a thread cache's
  // small-object chunk, or one reserved for its large objects): then a free
  // there is judged here, and a double free of an object another process
  // allocated there surfaces at that process's next sync. For tests.
  bool leases(const void* p) const;

 private:
  struct ThreadCache;

  Heap(std::unique_ptr<SessionCalls> calls, std::string name, const AttachOptions& options,
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
  // Writes the mapping back (msync), including what the growth fault
  // handler mapped.
  absl::Status FlushMapping();
  absl::Status MapUpTo(uint64_t capacity);
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
  const size_t free_batch_;
  const uint64_t serial_;  // tells heaps apart in thread-local lookups
  const int data_fd_;
  bool detached_ = false;

  // mapping_ is set by Start and reset by detach (nothing runs concurrently
  // with either); in between, the heap grows by MapHeapGrowth (MapUpTo,
  // holding mapping_mu_, and the growth fault handler), which raises
  // mapped_bytes_; mapping_ adopts that size under mapping_mu_, and the
  // rest of HeapMapping may run beside them.
  absl::Mutex mapping_mu_;
  GrowingHeap growing_;  // set by Start; see growth_fault_handler.h
  int fault_slot_ = -1;  // growing_'s slot with the handler
  std::unique_ptr<HeapMapping> mapping_;
  char* base_ = nullptr;  // mapping_->base(), kept here for the fast path
  uint64_t max_size_ = 0;
  std::atomic<uint64_t> mapped_bytes_{0};

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

  absl::Mutex frees_mu_;
  std::vector<v1::ObjectRef> pending_frees_ ABSL_GUARDED_BY(frees_mu_);

  // Chunks reserved for large objects; held across the call that tops the
  // reserve up. Taken after sync_mu_.
  mutable absl::Mutex large_mu_ ABSL_ACQUIRED_AFTER(sync_mu_);
  LargeReserve large_ ABSL_GUARDED_BY(large_mu_);
  uint32_t next_reserve_chunks_ ABSL_GUARDED_BY(large_mu_);

  // Names looked up at attach, served by Find without a call.
  absl::Mutex prefetched_mu_;
  std::map<std::string, NameEntry> prefetched_ ABSL_GUARDED_BY(prefetched_mu_);
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_HEAP_H_
