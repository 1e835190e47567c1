#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"
#include "client/heap_impl.h"
#include "client/owner_gate.h"
#include "heap/fault_point.h"
#include "heap/undo_record.h"
#include "protocol/fd_protocol.h"
#include "protocol/proto_convert.h"
#include "protocol/version.h"
#include "util/errno_status.h"

namespace heapd {
namespace {

// Lease reports per Sync call (a report of a chunk of 8-byte objects is
// 32 KiB; this keeps a call well under the message limit).
constexpr size_t kReportsPerSync = 1024;
// Placements per Sync call (well under heapd's kMaxPlacementsPerCall).
constexpr size_t kPlacementsPerPart = 16384;

// Large objects of up to this many chunks are carved from the session's
// reserve; the reserve grows in batches from the first size, doubling up
// to the last (one call per batch; what a session has not carved is freed
// when it ends).
constexpr uint32_t kMaxCarvedChunks = 64;  // 128 MiB
constexpr uint32_t kFirstReserveChunks = 4;
constexpr uint32_t kMaxReserveChunks = 128;  // 256 MiB

std::atomic<uint64_t> next_serial{1};

// Every number heapd sends is checked before it is used as an index or an
// address: a wrong one is an error, never a stray store.
absl::Status Unexpected(const std::string& heap, const std::string& what) {
  return absl::InternalError(absl::StrCat("heap ", heap, ": heapd answered ", what));
}

absl::Status CheckCapacity(const std::string& heap, uint64_t capacity, uint64_t max_size) {
  if (capacity > max_size || capacity % kChunkSize != 0) {
    return Unexpected(heap,
                      absl::StrCat("a capacity of ", capacity, " bytes (maximum ", max_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckGrant(const std::string& heap, const v1::LeaseGrant& grant, uint32_t size_class,
                        uint64_t capacity) {
  if (grant.size_class() != size_class || uint64_t{grant.chunk()} >= capacity / kChunkSize ||
      static_cast<size_t>(grant.words_size()) != SlotBitmap::WordCount(SlotsPerChunk(size_class))) {
    return Unexpected(heap, absl::StrCat("a lease of chunk ", grant.chunk(), " of size class ",
                                         grant.size_class(), " with ", grant.words_size(),
                                         " bitmap words for class ", size_class));
  }
  return absl::OkStatus();
}

absl::Status CheckObject(const std::string& heap, uint64_t offset, uint64_t size,
                         uint64_t max_size) {
  if (offset >= max_size || size > max_size - offset) {
    return Unexpected(heap, absl::StrCat("an object of ", size, " bytes at offset ", offset,
                                         " (maximum size ", max_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

// One thread's lease pool. The owner thread allocates and frees in it
// inside `gate` (OwnerScope: no atomic read-modify-write); sync and detach
// visit it (VisitorScope). Other threads never touch `pool`: their frees of
// its objects wait in `remote_frees` until the owner or a visitor applies
// them.
struct HeapImpl::ThreadCache final : LeaseSource {
  ThreadCache(HeapImpl* heap, uint64_t max_chunks, uint32_t lease_batch)
      : heap(heap), pool(this, max_chunks, lease_batch) {}
  absl::StatusOr<std::vector<LeaseGrant>> LeaseChunks(uint32_t size_class,
                                                      uint32_t count) override {
    return heap->Lease(this, size_class, count);
  }

  HeapImpl* const heap;
  OwnerGate gate;
  LeasePool pool ABSL_GUARDED_BY(gate);

  SpinLock remote_lock;
  std::vector<uint64_t> remote_frees ABSL_GUARDED_BY(remote_lock);
  std::atomic<bool> has_remote_frees{false};
};

void HeapImpl::ApplyRemoteFrees(ThreadCache* cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache->gate) {
  std::vector<uint64_t> frees;
  cache->remote_lock.lock();
  frees.swap(cache->remote_frees);
  cache->has_remote_frees.store(false, std::memory_order_relaxed);
  cache->remote_lock.unlock();
  for (uint64_t offset : frees) {
    const LocalFree result = cache->pool.Free(offset);
    if (result == LocalFree::kFreed) continue;
    const std::string why = result == LocalFree::kNotLive
                                ? cache->pool.DescribeNotLive(offset)
                                : absl::StrCat("offset ", offset, " is in no leased chunk");
    absl::MutexLock lock(&deferred_mu_);
    deferred_error_.Update(absl::InvalidArgumentError(
        absl::StrCat("heap ", name_, ": a free from another thread was rejected: ", why)));
  }
}

HeapImpl::HeapImpl(std::unique_ptr<SessionCalls> calls, std::string name,
                   const AttachOptions& options, uint64_t session, int data_fd)
    : calls_(std::move(calls)),
      name_(std::move(name)),
      read_only_(options.read_only),
      session_(session),
      lease_batch_(std::max<uint32_t>(options.lease_batch, 1)),
      serial_(next_serial.fetch_add(1)),
      data_fd_(data_fd),
      frees_(options.free_batch),
      next_reserve_chunks_(kFirstReserveChunks) {}

absl::StatusOr<std::unique_ptr<Heap>> HeapImpl::Start(std::unique_ptr<SessionCalls> calls,
                                                      std::string name,
                                                      const AttachOptions& options,
                                                      const v1::AttachResponse& attached,
                                                      int data_fd, UniqueFd journal) {
  std::unique_ptr<HeapImpl> heap(
      new HeapImpl(std::move(calls), std::move(name), options, attached.session(), data_fd));
  if (absl::Status s = heap->Start(attached, std::move(journal)); !s.ok()) {
    heap->detached_ = true;  // the serving side ends the session when its connection closes
    return s;
  }
  return std::unique_ptr<Heap>(std::move(heap));
}

bool HeapImpl::leases(const void* p) const {
  const uint64_t offset = offset_of(p);
  if (offset >= max_size_) return false;
  if (chunk_owner_[offset / kChunkSize].load(std::memory_order_acquire) != nullptr) return true;
  absl::MutexLock lock(&large_mu_);
  return large_.Holds(static_cast<uint32_t>(offset >> kChunkShift));
}

absl::Status HeapImpl::Start(const v1::AttachResponse& attached, UniqueFd journal) {
  if (attached.protocol_revision() < kMinProtocolRevision) {
    return absl::FailedPreconditionError(absl::StrCat(
        "heapd speaks revision ", attached.protocol_revision(), " of heapd.v1; this library (",
        kHeapdVersion, ") needs ", kMinProtocolRevision, " or later: upgrade heapd"));
  }
  const uint64_t max_size = attached.heap().max_size();
  if (max_size == 0 || max_size > kMaxHeapBytes || max_size % kChunkSize != 0 ||
      attached.session() == 0) {
    return Unexpected(name_, absl::StrCat("a maximum size of ", max_size, " bytes and session ",
                                          attached.session()));
  }
  if (absl::Status s = CheckCapacity(name_, attached.heap().capacity_bytes(), max_size); !s.ok()) {
    return s;
  }
  for (const v1::NameEntry& entry : attached.found()) {
    if (absl::Status s = CheckObject(name_, entry.offset(), entry.size(), max_size); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::unique_ptr<MappedHeap>> mapped =
      MappedHeap::Map(name_, data_fd_, max_size, attached.heap().capacity_bytes(), !read_only_,
                      kProcessHeaderBytes);
  if (!mapped.ok()) return mapped.status();
  mapped_ = *std::move(mapped);
  base_ = mapped_->base();
  max_size_ = max_size;
  *process_header() = ProcessHeader{ProcessHeader::kMagic, this};
  content_rollback_note_ = attached.heap().content_rollback_note();
  if (attached.heap().content_rollback() && !read_only_) {
    if (!journal.valid()) return Unexpected(name_, "content rollback without an undo journal");
    absl::StatusOr<std::unique_ptr<WriteTracker>> tracker = WriteTracker::Start(
        base_, mapped_->mapped_bytes_counter(), data_fd_, std::move(journal), calls_->lifeline());
    if (!tracker.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("heap ", name_,
                       " rolls object contents back after a crash, and this process cannot "
                       "take pre-images of the pages it writes: ",
                       tracker.status().message(),
                       " (attach it read-only, or run heapd with --track_contents=false)"));
    }
    tracker_ = *std::move(tracker);
  }
  mapped_->StartGrowth(tracker_.get());
  lifeline_fd_ = calls_->lifeline();
  const uint64_t max_chunks = max_size / kChunkSize;
  chunk_owner_.reset(new std::atomic<ThreadCache*>[max_chunks]());
  std::vector<NameEntry> found;
  for (const v1::NameEntry& entry : attached.found()) found.push_back(FromProto(entry));
  prefetched_.Put(std::move(found));
  return absl::OkStatus();
}

HeapImpl::~HeapImpl() {
  if (!detached_) {
    if (absl::Status s = detach(); !s.ok()) {
      std::fprintf(stderr, "heapd: detaching heap %s failed: %s\n", name_.c_str(),
                   s.ToString().c_str());
    }
  }
  tracker_.reset();  // it watches the lifeline and uses the data fd
  calls_->Close();
  if (data_fd_ >= 0) close(data_fd_);
}

HeapImpl::ThreadCache* HeapImpl::CacheOfThisThread() {
  struct LastUsed {
    uint64_t serial = 0;
    ThreadCache* cache = nullptr;
  };
  static thread_local LastUsed last;
  if (last.serial != serial_) last = {serial_, NewCacheForThisThread()};
  return last.cache;
}

HeapImpl::ThreadCache* HeapImpl::NewCacheForThisThread() {
  absl::MutexLock lock(&caches_mu_);
  std::unique_ptr<ThreadCache>& cache = caches_[std::this_thread::get_id()];
  if (cache == nullptr) {
    cache = std::make_unique<ThreadCache>(this, max_size_ / kChunkSize, lease_batch_);
  }
  return cache.get();
}

absl::StatusOr<std::vector<LeaseGrant>> HeapImpl::Lease(ThreadCache* cache, uint32_t size_class,
                                                        uint32_t count) {
  v1::LeaseChunksRequest request;
  request.set_session(session_);
  v1::LeaseWant* want = request.add_wants();
  want->set_size_class(size_class);
  want->set_count(count);
  v1::LeaseChunksResponse response;
  const absl::Status leased = WithReserveBack([&] {
    response.Clear();
    return calls_->LeaseChunks(request, &response);
  });
  if (!leased.ok()) return leased;
  if (absl::Status s = CheckCapacity(name_, response.capacity_bytes(), max_size_); !s.ok()) {
    return s;
  }
  for (const v1::LeaseGrant& grant : response.grants()) {
    if (absl::Status s = CheckGrant(name_, grant, size_class, response.capacity_bytes()); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = mapped_->MapUpTo(response.capacity_bytes()); !s.ok()) return s;
  std::vector<LeaseGrant> grants;
  grants.reserve(response.grants_size());
  for (const v1::LeaseGrant& grant : response.grants()) grants.push_back(FromProto(grant));
  if (tracker_ != nullptr) {
    // An empty chunk was free at the last commit: no pre-images needed.
    for (const LeaseGrant& grant : grants) {
      if (SlotBitmap::NoneAllocated(SlotsPerChunk(grant.size_class), grant.words)) {
        tracker_->Unprotect(uint64_t{grant.chunk} * kChunkSize, kChunkSize);
      }
    }
  }
  AdoptGrants(cache, grants);
  return grants;
}

void HeapImpl::AdoptGrants(ThreadCache* cache, const std::vector<LeaseGrant>& grants) {
  for (const LeaseGrant& grant : grants) {
    chunk_owner_[grant.chunk].store(cache, std::memory_order_release);
  }
}

absl::StatusOr<void*> HeapImpl::allocate(uint64_t size, uint64_t align) {
  if (read_only_) {
    return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is attached read-only"));
  }
  if (size == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  if (size > max_size_) {  // before any arithmetic on it (a size near 2^64 would wrap)
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", size, " bytes in heap ",
                                                   name_, " of at most ", max_size_));
  }
  if (align == 0 || (align & (align - 1)) != 0 || align > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", align, " is not a power of two up to 4096"));
  }
  if (size <= kMaxSmallSize) {
    uint32_t size_class = SizeClassFor(size);
    // Slots of a class are aligned to the largest power of two dividing its
    // size (chunks are 2 MiB aligned); every class is 8-byte aligned.
    while (align > 8 && size_class < kNumSizeClasses && ClassSize(size_class) % align != 0) {
      ++size_class;
    }
    if (size_class < kNumSizeClasses) {
      ThreadCache* cache = CacheOfThisThread();
      OwnerScope inside(cache->gate);
      if (cache->has_remote_frees.load(std::memory_order_relaxed)) ApplyRemoteFrees(cache);
      absl::StatusOr<uint64_t> offset = cache->pool.Allocate(size_class);
      if (!offset.ok()) return offset.status();
      return base() + *offset;
    }
  }
  absl::StatusOr<uint64_t> offset = AllocateLarge(size);
  if (!offset.ok()) return offset.status();
  return base() + *offset;
}

absl::StatusOr<uint64_t> HeapImpl::AllocateLarge(uint64_t size) {
  const uint64_t chunks = (size + kChunkSize - 1) / kChunkSize;
  if (chunks > kMaxCarvedChunks) {
    absl::StatusOr<LargePlacement> run;
    if (absl::Status s = WithReserveBack(
            [&] { return (run = TakeFromHeapd(size, /*reserve=*/false, 0)).status(); });
        !s.ok()) {
      return s;
    }
    return uint64_t{run->chunk} << kChunkShift;
  }
  const uint32_t need = static_cast<uint32_t>(chunks);
  uint64_t want;
  {
    absl::MutexLock lock(&large_mu_);
    if (std::optional<uint32_t> first = large_.Carve(need)) return uint64_t{*first} << kChunkShift;
  }
  // Topped up with sync_mu_ held, not large_mu_: other threads carve and
  // free meanwhile, and no sync is under way while heapd may hand out
  // chunks of placements it would send again (LargeReserve::Add).
  absl::MutexLock sync_lock(&sync_mu_);
  {
    absl::MutexLock lock(&large_mu_);
    if (std::optional<uint32_t> first = large_.Carve(need)) return uint64_t{*first} << kChunkShift;
    // At most a sixteenth of the heap's maximum size: what a session holds
    // unused between syncs makes the heap grow by as much.
    want = std::max<uint64_t>(
        need, std::min<uint64_t>(next_reserve_chunks_, max_size_ / kChunkSize / 16));
  }
  absl::StatusOr<LargePlacement> run;
  if (absl::Status s = WithReserveBack([&] {
        return (run = TakeFromHeapd(want * kChunkSize, true, chunks * kChunkSize)).status();
      });
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&large_mu_);
  if (run->chunks < need || !large_.Add(run->chunk, run->chunks)) {
    return Unexpected(
        name_, absl::StrCat("a reserve of ", run->chunks, " chunks at chunk ", run->chunk,
                            " for an object of ", need, ", or over chunks this session holds"));
  }
  next_reserve_chunks_ = std::min(2 * next_reserve_chunks_, kMaxReserveChunks);
  const std::optional<uint32_t> first = large_.Carve(need);
  if (!first) return Unexpected(name_, "a reserve the object does not fit");
  return uint64_t{*first} << kChunkShift;
}

absl::StatusOr<LargePlacement> HeapImpl::TakeFromHeapd(uint64_t size, bool reserve,
                                                       uint64_t min_size) {
  v1::AllocateLargeRequest request;
  request.set_session(session_);
  request.set_size(size);
  request.set_reserve(reserve);
  request.set_min_size(min_size);
  v1::AllocateLargeResponse response;
  if (absl::Status s = calls_->AllocateLarge(request, &response); !s.ok()) return s;
  if (absl::Status s = CheckCapacity(name_, response.capacity_bytes(), max_size_); !s.ok()) {
    return s;
  }
  const uint64_t taken = response.size();
  if (absl::Status s = CheckObject(name_, response.offset(), taken, response.capacity_bytes());
      !s.ok() || response.offset() % kChunkSize != 0 || taken % kChunkSize != 0 ||
      taken < std::max(min_size, reserve ? 0 : size) || taken > size + kChunkSize - 1) {
    return s.ok() ? Unexpected(name_, absl::StrCat(taken, " bytes of large object or reserve at ",
                                                   "offset ", response.offset(), " for ", size))
                  : s;
  }
  if (absl::Status s = mapped_->MapUpTo(response.capacity_bytes()); !s.ok()) {
    // The caller never sees it: give an object back (a reserve is freed
    // when the session ends).
    if (reserve) return s;
    v1::ObjectRef object;
    object.set_offset(response.offset());
    if (absl::Status freed = FreeRemotely({object}); !freed.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), "; then freeing the object at ",
                                                 response.offset(), " failed: ", freed.message()));
    }
    return s;
  }
  if (tracker_ != nullptr) tracker_->Unprotect(response.offset(), taken);  // free: no pre-images
  return LargePlacement{static_cast<uint32_t>(response.offset() >> kChunkShift),
                        static_cast<uint32_t>(taken >> kChunkShift)};
}

absl::StatusOr<bool> HeapImpl::FreeUntold(uint64_t offset, uint64_t size_hint) {
  const uint32_t chunk = static_cast<uint32_t>(offset >> kChunkShift);
  absl::MutexLock lock(&large_mu_);
  if (!large_.Holds(chunk)) return false;
  const uint32_t chunks = offset % kChunkSize == 0 ? large_.UntoldChunks(chunk) : 0;
  if (chunks == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heap ", name_, ": offset ", offset,
        " is not the start of an object (its chunk is reserved for this process's large "
        "objects, free or inside one): double free?"));
  }
  if (size_hint != 0 &&
      (size_hint <= kMaxSmallSize || (size_hint + kChunkSize - 1) / kChunkSize != chunks)) {
    return absl::InvalidArgumentError(absl::StrCat("heap ", name_, ": object at offset ", offset,
                                                   " is a large object of ", chunks,
                                                   " chunks, not of ", size_hint, " bytes"));
  }
  large_.FreeUntold(chunk);  // heapd never knew of it
  return true;
}

absl::Status HeapImpl::WithReserveBack(const std::function<absl::Status()>& call) {
  absl::Status status = call();
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  // What this process freed and has not told heapd of yet, and the reserve
  // it holds unused, may be what the call needs.
  const bool pending = !frees_.empty();
  // Both are tried: each may free what the other cannot.
  const bool flushed = pending && FlushFrees().ok();
  const bool returned = ReturnReserve();
  if (flushed || returned) status = call();
  return status;
}

bool HeapImpl::ReturnReserve() {
  std::vector<LargePlacement> released;
  {
    absl::MutexLock lock(&large_mu_);
    released = large_.TakeFreeRuns(kPlacementsPerPart);
  }
  // Failed: the runs stay reserved until the session ends.
  return !released.empty() && TellReserve({}, released).ok();
}

absl::Status HeapImpl::TellReserve(absl::Span<const LargePlacement> placed,
                                   absl::Span<const LargePlacement> released) {
  v1::SyncRequest request;
  request.set_session(session_);
  request.set_more(true);  // taken at once; committed by the next sync
  for (const LargePlacement& object : placed) ToProto(object, request.add_placed());
  for (const LargePlacement& run : released) ToProto(run, request.add_released());
  v1::SyncResponse response;
  return calls_->Sync(request, &response);
}

absl::Status HeapImpl::PlaceUntold() {
  absl::MutexLock sync_lock(&sync_mu_);
  std::vector<LargePlacement> placed;
  {
    absl::MutexLock lock(&large_mu_);
    placed = large_.TakeForSync();
  }
  absl::Status status;
  for (size_t i = 0; i < placed.size() && status.ok(); i += kPlacementsPerPart) {
    status = TellReserve(absl::MakeConstSpan(placed).subspan(i, kPlacementsPerPart), {});
  }
  absl::MutexLock lock(&large_mu_);
  if (status.ok()) {
    large_.SyncDone();
  } else {
    large_.SyncFailed();
  }
  return status;
}

absl::Status HeapImpl::deallocate(void* p, uint64_t size_hint) {
  if (read_only_) {
    return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is attached read-only"));
  }
  // Any address of the reservation is checked further by the pool or the
  // daemon; this only keeps the owner lookup in bounds.
  const char* address = static_cast<const char*>(p);
  if (address < base_ || address >= base_ + max_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address 0x", absl::Hex(reinterpret_cast<uintptr_t>(p)), " is not in heap ", name_));
  }
  const uint64_t offset = offset_of(p);
  if (ThreadCache* owner = chunk_owner_[offset >> kChunkShift].load(std::memory_order_acquire)) {
    ThreadCache* mine = CacheOfThisThread();
    if (owner != mine) {
      // Another thread's object: that thread (or the next sync) frees it;
      // a bad one is reported by the next sync().
      owner->remote_lock.lock();
      owner->remote_frees.push_back(offset);
      owner->has_remote_frees.store(true, std::memory_order_relaxed);
      owner->remote_lock.unlock();
      return absl::OkStatus();
    }
    OwnerScope inside(mine->gate);
    const LocalFree result = mine->pool.Free(offset);
    if (result == LocalFree::kFreed) return absl::OkStatus();
    if (result == LocalFree::kNotLive) {
      return absl::InvalidArgumentError(
          absl::StrCat("heap ", name_, ": ", mine->pool.DescribeNotLive(offset)));
    }
  }
  if (absl::StatusOr<bool> freed = FreeUntold(offset, size_hint); !freed.ok() || *freed) {
    return freed.status();
  }
  v1::ObjectRef object;
  object.set_offset(offset);
  object.set_size(size_hint);
  if (size_hint > kMaxSmallSize) return FreeRemotely({object});
  return FreeRemotely(frees_.Add(std::move(object)));
}

absl::Status HeapImpl::FreeRemotely(std::vector<v1::ObjectRef> objects) {
  if (objects.empty()) return absl::OkStatus();
  auto send = [this](auto begin, auto end) {
    v1::FreeRequest request;
    request.set_session(session_);
    request.mutable_objects()->Add(begin, end);
    return calls_->Free(request);
  };
  absl::Status status = send(objects.begin(), objects.end());
  if (status.ok() || objects.size() == 1 ||
      (status.code() != absl::StatusCode::kInvalidArgument &&
       status.code() != absl::StatusCode::kFailedPrecondition)) {
    return status;
  }
  // A batch is all or nothing: free the others one by one and report the
  // first bad one.
  absl::Status first;
  for (auto it = objects.begin(); it != objects.end(); ++it) first.Update(send(it, it + 1));
  return first;
}

absl::Status HeapImpl::FlushFrees() { return FreeRemotely(frees_.TakeAll()); }

absl::Status HeapImpl::SendEarlierParts(const std::vector<LeaseReport>& reports, size_t* sent,
                                        const std::vector<LargePlacement>& placed,
                                        size_t* placed_sent) {
  while (reports.size() - *sent > kReportsPerSync ||
         placed.size() - *placed_sent > kPlacementsPerPart) {
    v1::SyncRequest request;
    request.set_session(session_);
    request.set_more(true);
    for (const size_t end = std::min(reports.size(), *sent + kReportsPerSync); *sent < end;
         ++*sent) {
      ToProto(reports[*sent], request.add_reports());
    }
    for (const size_t end = std::min(placed.size(), *placed_sent + kPlacementsPerPart);
         *placed_sent < end; ++*placed_sent) {
      ToProto(placed[*placed_sent], request.add_placed());
    }
    v1::SyncResponse response;
    if (absl::Status s = calls_->Sync(request, &response); !s.ok()) return s;
    FaultPoint("client.sync.between_parts");
  }
  return absl::OkStatus();
}

absl::Status HeapImpl::SendSync(const std::vector<LeaseReport>& reports,
                                const std::vector<LargePlacement>& placed,
                                const std::vector<LargePlacement>& released, uint64_t generation,
                                v1::SyncResponse* response) {
  // heapd holds the earlier parts and commits them with the last, with the
  // contents: one sync, one epoch.
  size_t sent = 0;
  size_t placed_sent = 0;
  if (absl::Status s = SendEarlierParts(reports, &sent, placed, &placed_sent); !s.ok()) return s;
  v1::SyncRequest request;
  request.set_session(session_);
  request.set_generation(generation);
  request.set_stores_unseen(StoresUnseen());
  for (; sent < reports.size(); ++sent) ToProto(reports[sent], request.add_reports());
  for (; placed_sent < placed.size(); ++placed_sent) {
    ToProto(placed[placed_sent], request.add_placed());
  }
  for (const LargePlacement& run : released) ToProto(run, request.add_released());
  return calls_->Sync(request, response);
}

bool HeapImpl::StoresUnseen() const { return tracker_ != nullptr && !tracker_->error().ok(); }

absl::StatusOr<uint64_t> HeapImpl::sync() {
  absl::MutexLock sync_lock(&sync_mu_);
  if (read_only_) {
    return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is attached read-only"));
  }
  if (absl::Status s = mapped_->Flush(); !s.ok()) return s;
  absl::Status frees = FlushFrees();
  std::vector<ThreadCache*> caches;
  {
    absl::MutexLock lock(&caches_mu_);
    for (const auto& [thread, cache] : caches_) caches.push_back(cache.get());
  }
  std::vector<std::vector<LeaseReport>> by_cache(caches.size());
  std::vector<LeaseReport> reports;
  for (size_t i = 0; i < caches.size(); ++i) {
    VisitorScope visit(caches[i]->gate);
    ApplyRemoteFrees(caches[i]);
    by_cache[i] = caches[i]->pool.TakeDirtyReports();
    reports.insert(reports.end(), by_cache[i].begin(), by_cache[i].end());
  }
  // The reserve goes back, but for what was carved from it: no free chunk
  // stays held from other sessions (or from small objects) between syncs.
  std::vector<LargePlacement> placed;
  std::vector<LargePlacement> released;
  {
    absl::MutexLock lock(&large_mu_);
    placed = large_.TakeForSync();
    released = large_.TakeFreeRuns(kPlacementsPerPart);
    next_reserve_chunks_ = kFirstReserveChunks;  // batches grow again from here
  }
  // Protect again what this generation wrote: from here on, a store takes a
  // pre-image of the page as this sync commits it.
  const uint64_t generation = tracker_ != nullptr ? tracker_->BeginSync() : 0;
  v1::SyncResponse response;
  absl::Status sent = SendSync(reports, placed, released, generation, &response);
  if (tracker_ != nullptr) tracker_->EndSync();
  {
    absl::MutexLock lock(&large_mu_);
    if (sent.ok()) {
      large_.SyncDone();
    } else {
      large_.SyncFailed();
    }
  }
  if (absl::Status s = std::move(sent); !s.ok()) {
    for (size_t i = 0; i < caches.size(); ++i) {
      VisitorScope visit(caches[i]->gate);
      caches[i]->pool.Redirty(by_cache[i]);  // report them at the next sync
    }
    return s;
  }
  if (absl::Status s = CheckCapacity(name_, response.capacity_bytes(), max_size_); !s.ok()) {
    return s;
  }
  for (const v1::LeaseCorrection& c : response.corrections()) {
    if (uint64_t{c.chunk()} >= max_size_ / kChunkSize) {
      return Unexpected(name_, absl::StrCat("a correction of chunk ", c.chunk()));
    }
    ThreadCache* owner = chunk_owner_[c.chunk()].load(std::memory_order_acquire);
    if (owner == nullptr) continue;
    const LeaseCorrection correction{c.chunk(),
                                     {c.freed_slots().begin(), c.freed_slots().end()},
                                     {c.kept_slots().begin(), c.kept_slots().end()}};
    VisitorScope visit(owner->gate);
    owner->pool.ApplyCorrections(absl::MakeConstSpan(&correction, 1));
  }
  if (absl::Status s = mapped_->MapUpTo(response.capacity_bytes()); !s.ok()) return s;
  if (!frees.ok()) return frees;
  if (response.rejected_frees_size() != 0) {
    return absl::InvalidArgumentError(response.rejected_frees(0));
  }
  {
    absl::MutexLock lock(&deferred_mu_);
    absl::Status deferred = std::exchange(deferred_error_, absl::OkStatus());
    if (!deferred.ok()) return deferred;
  }
  if (tracker_ != nullptr) {
    if (absl::Status s = tracker_->error(); !s.ok()) return s;
  }
  return response.epoch();
}

absl::Status HeapImpl::detach() {
  if (detached_) return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is detached"));
  detached_ = true;
  absl::Status status;
  std::vector<LeaseReport> reports;
  if (!read_only_) {
    status.Update(mapped_->Flush());
    status.Update(FlushFrees());
    absl::MutexLock lock(&caches_mu_);
    for (const auto& [thread, cache] : caches_) {
      VisitorScope visit(cache->gate);
      ApplyRemoteFrees(cache.get());
      std::vector<LeaseReport> released = cache->pool.ReleaseAll();
      std::move(released.begin(), released.end(), std::back_inserter(reports));
    }
  }
  // Detach carries the last kReportsPerSync leases; heapd holds the earlier
  // parts and returns them all with it, in one epoch. If a part failed, no
  // detach commits this session's stores without it: the session ends
  // without one (as a crash: heapd puts it back at its last sync).
  std::vector<LargePlacement> placed;
  {
    absl::MutexLock lock(&large_mu_);
    placed = large_.TakeForSync();
  }
  size_t sent = 0;
  size_t placed_sent = 0;
  const absl::Status parts = SendEarlierParts(reports, &sent, placed, &placed_sent);
  if (parts.ok()) {
    v1::DetachRequest request;
    request.set_session(session_);
    if (tracker_ != nullptr) request.set_generation(tracker_->BeginSync());
    request.set_stores_unseen(StoresUnseen());
    for (; sent < reports.size(); ++sent) ToProto(reports[sent], request.add_reports());
    for (; placed_sent < placed.size(); ++placed_sent) {
      ToProto(placed[placed_sent], request.add_placed());
    }
    status.Update(calls_->Detach(request));
  } else {
    status.Update(absl::Status(parts.code(), absl::StrCat("heap ", name_, ": ", parts.message(),
                                                          "; the session ends at its last sync")));
  }
  mapped_->StopGrowth();
  tracker_.reset();  // before the lifeline closes: that would fence the mapping
  mapped_.reset();
  calls_->Close();
  return status;
}

absl::Status HeapImpl::KeepPrivatelyAfterFork() {
  detached_ = true;  // no detach: the session is the parent's
  // The parent's lifeline: heapd must see the parent's end when it comes,
  // not when this child exits.
  if (lifeline_fd_ >= 0) close(lifeline_fd_);
  return mapped_->MapPrivately(!read_only_);
}

void HeapImpl::prepare_write(void* p, uint64_t size) {
  if (tracker_ == nullptr || size == 0) return;
  const uintptr_t page = ~uintptr_t{kUndoPageBytes - 1};
  auto* first = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) & page);
  auto* last = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + size - 1) & page);
  for (char* at = first; at <= last; at += kUndoPageBytes) {
    // A store that changes nothing, from user mode: it faults once, and the
    // tracker takes the pre-image.
    __atomic_fetch_add(at, 0, __ATOMIC_RELAXED);
  }
}

absl::Status HeapImpl::Bind(const std::string& name, const void* object, uint64_t size,
                            const std::string& type_name) {
  if (const uint64_t offset = offset_of(object); offset % kChunkSize == 0 && !read_only_) {
    bool untold;
    {
      absl::MutexLock lock(&large_mu_);
      untold = large_.NotYetTold(static_cast<uint32_t>(offset >> kChunkShift));
    }
    // heapd binds only objects it knows (one in flight with a sync: once
    // that sync is over, PlaceUntold sends whatever is left).
    if (untold) {
      if (absl::Status s = PlaceUntold(); !s.ok()) return s;
    }
  }
  v1::BindRequest request;
  request.set_session(session_);
  request.set_name(name);
  request.set_offset(offset_of(object));
  request.set_size(size);
  request.set_type_name(type_name);
  return calls_->Bind(request);
}

absl::StatusOr<Heap::Named> HeapImpl::Remove(const std::string& name) {
  prefetched_.Forget(name);
  v1::UnbindRequest request;
  request.set_session(session_);
  request.set_name(name);
  absl::StatusOr<NameEntry> entry = calls_->Unbind(request);
  if (!entry.ok()) return entry.status();
  if (absl::Status s = CheckObject(name_, entry->offset, entry->size, max_size_); !s.ok()) {
    return s;
  }
  return Named{base() + entry->offset, entry->size, entry->type_name};
}

absl::StatusOr<Heap::Named> HeapImpl::Lookup(const std::string& name) {
  absl::StatusOr<NameEntry> entry = EntryOf(name);
  if (!entry.ok()) return entry.status();
  absl::StatusOr<void*> object = MapObject(*entry);
  if (!object.ok()) return object.status();
  return Named{*object, entry->size, entry->type_name};
}

absl::StatusOr<void*> HeapImpl::Find(const std::string& name, const std::string& type_name,
                                     uint64_t size) {
  absl::StatusOr<NameEntry> entry = EntryOf(name);
  if (!entry.ok()) return entry.status();
  if (entry->type_name != type_name) {
    return absl::FailedPreconditionError(absl::StrCat(
        "name '", name, "' in heap ", name_, " binds a ", entry->type_name, ", not a ", type_name));
  }
  if (entry->size < size) {
    return absl::FailedPreconditionError(absl::StrCat("name '", name, "' in heap ", name_,
                                                      " binds ", entry->size, " bytes; a ",
                                                      type_name, " needs ", size));
  }
  return MapObject(*entry);
}

absl::StatusOr<NameEntry> HeapImpl::EntryOf(const std::string& name) {
  if (detached_) return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is detached"));
  std::optional<NameEntry> prefetched = prefetched_.Take(name);
  NameEntry entry;
  if (prefetched.has_value()) {
    entry = *std::move(prefetched);
  } else {
    absl::StatusOr<NameEntry> found = calls_->Lookup(name);
    if (!found.ok()) return found.status();
    entry = *std::move(found);
  }
  if (absl::Status s = CheckObject(name_, entry.offset, entry.size, max_size_); !s.ok()) return s;
  return entry;
}

absl::StatusOr<void*> HeapImpl::MapObject(const NameEntry& entry) {
  // An object beyond what this process mapped: map what other clients
  // grew the heap by (what it links to is mapped on first touch).
  if (absl::Status s = mapped_->MapUpToFileSize(entry.offset + entry.size); !s.ok()) {
    if (s.code() != absl::StatusCode::kDataLoss) return s;
    return absl::DataLossError(absl::StrCat("name '", entry.name, "' in heap ", name_,
                                            " binds bytes beyond the data file"));
  }
  return base() + entry.offset;
}

// heapd::Heap's calls are HeapImpl's (heapd/heap.h): defined here, beside
// them, so that the compiler takes the fast path in without a second call.
Heap::~Heap() = default;
absl::StatusOr<void*> Heap::allocate(uint64_t size, uint64_t align) {
  return HeapImpl::Of(*this).allocate(size, align);
}
absl::Status Heap::deallocate(void* p, uint64_t size_hint) {
  return HeapImpl::Of(*this).deallocate(p, size_hint);
}
absl::StatusOr<uint64_t> Heap::sync() { return HeapImpl::Of(*this).sync(); }
absl::Status Heap::detach() { return HeapImpl::Of(*this).detach(); }
const std::string& Heap::name() const { return HeapImpl::Of(*this).name(); }
bool Heap::read_only() const { return HeapImpl::Of(*this).read_only(); }
bool Heap::content_rollback() const { return HeapImpl::Of(*this).content_rollback(); }
const std::string& Heap::content_rollback_note() const {
  return HeapImpl::Of(*this).content_rollback_note();
}
bool Heap::fenced() const { return HeapImpl::Of(*this).fenced(); }
void Heap::prepare_write(void* p, uint64_t size) { HeapImpl::Of(*this).prepare_write(p, size); }
uint64_t Heap::session() const { return HeapImpl::Of(*this).session(); }
uint64_t Heap::max_size() const { return HeapImpl::Of(*this).max_size(); }
absl::StatusOr<Heap::Named> Heap::Lookup(const std::string& name) {
  return HeapImpl::Of(*this).Lookup(name);
}
absl::Status Heap::Unbind(const std::string& name) { return HeapImpl::Of(*this).Unbind(name); }
absl::StatusOr<Heap::Named> Heap::Remove(const std::string& name) {
  return HeapImpl::Of(*this).Remove(name);
}
absl::Status Heap::Bind(const std::string& name, const void* object, uint64_t size,
                        const std::string& type_name) {
  return HeapImpl::Of(*this).Bind(name, object, size, type_name);
}
absl::StatusOr<void*> Heap::Find(const std::string& name, const std::string& type_name,
                                 uint64_t size) {
  return HeapImpl::Of(*this).Find(name, type_name, size);
}

}  // namespace heapd
