#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "allocator/slot_bitmap.h"
#include "client/heap_impl.h"
#include "client/heapd_answers.h"
#include "client/owner_gate.h"
#include "client/sync_parts.h"
#include "heap/fixed_address.h"
#include "heap/undo_record.h"
#include "protocol/proto_convert.h"
#include "protocol/version.h"

namespace heapd {

HeapImpl::HeapImpl(std::unique_ptr<SessionCalls> calls, std::string name,
                   const AttachOptions& options, uint64_t session, int data_fd)
    : calls_(std::move(calls)),
      name_(std::move(name)),
      read_only_(options.read_only),
      fixed_address_asked_(options.fixed_address),
      session_(session),
      data_fd_(data_fd),
      caches_(name_, std::max<uint32_t>(options.lease_batch, 1),
              [this](uint32_t size_class, uint32_t count, absl::Span<const uint32_t> reuse) {
                return Lease(size_class, count, reuse);
              }),
      frees_(calls_.get(), session, options.free_batch) {}

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
  if (caches_.OwnerOf(offset / kChunkSize) != nullptr) return true;
  return large_ != nullptr && large_->Holds(static_cast<uint32_t>(offset >> kChunkShift));
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
  const uint64_t fixed_base = attached.heap().fixed_address();
  if (fixed_address_asked_ && fixed_base == 0) {
    // A heapd before revision 3 ignores the request and makes or serves a
    // heap mapped anywhere.
    return absl::FailedPreconditionError(
        absl::StrCat("heap ", name_, " is not a fixed-address heap, and fixed_address was asked",
                     attached.protocol_revision() < kFixedAddressRevision
                         ? absl::StrCat(": heapd speaks revision ", attached.protocol_revision(),
                                        " of heapd.v1, and fixed-address heaps need ",
                                        kFixedAddressRevision, "; upgrade heapd")
                         : ""));
  }
  if (fixed_base != 0) {
    if (absl::Status s = ValidateFixedBase(fixed_base, max_size); !s.ok()) {
      return Unexpected(name_, std::string(s.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<MappedHeap>> mapped =
      MappedHeap::Map(name_, data_fd_, max_size, attached.heap().capacity_bytes(), !read_only_,
                      kProcessHeaderBytes, fixed_base);
  if (!mapped.ok()) return mapped.status();
  mapped_ = *std::move(mapped);
  base_ = mapped_->base();
  max_size_ = max_size;
  fixed_address_ = fixed_base != 0;
  *process_header() = ProcessHeader{ProcessHeader::kMagic, this};
  content_rollback_note_ = attached.heap().content_rollback_note();
  if (attached.heap().content_rollback() && !read_only_) {
    if (!journal.valid()) return Unexpected(name_, "content rollback without an undo journal");
    absl::StatusOr<std::unique_ptr<WriteTracker>> tracker = WriteTracker::Start(
        base_, mapped_->mapped_bytes_counter(), data_fd_, std::move(journal), calls_->lifeline(),
        /*heapd_revision_2=*/attached.protocol_revision() >= kGuardedJournalsRevision);
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
  large_ = std::make_unique<LargeObjects>(LargeObjects::Session{
      calls_.get(), session_, name_, max_size_, mapped_.get(), tracker_.get(), &frees_, &sync_mu_});
  lifeline_fd_ = calls_->lifeline();
  caches_.Start(max_size / kChunkSize);
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
  large_.reset();    // it works with the tracker
  tracker_.reset();  // it watches the lifeline and uses the data fd
  calls_->Close();
  if (data_fd_ >= 0) close(data_fd_);
}

absl::Status HeapImpl::DetachedError() const {
  return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is detached"));
}

absl::StatusOr<std::vector<LeaseGrant>> HeapImpl::Lease(uint32_t size_class, uint32_t count,
                                                        absl::Span<const uint32_t> reuse) {
  if (detached_) return DetachedError();  // its pools were handed back
  v1::LeaseChunksRequest request;
  request.set_session(session_);
  v1::LeaseWant* want = request.add_wants();
  want->set_size_class(size_class);
  want->set_count(count);
  for (uint32_t chunk : reuse) want->add_reuse(chunk);
  v1::LeaseChunksResponse response;
  const absl::Status leased = large_->WithReserveBack([&] {
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
  return grants;
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
      ThreadCaches::Cache* cache = caches_.OfThisThread();
      OwnerScope inside(cache->gate);
      if (cache->has_queued_frees.load(std::memory_order_relaxed)) caches_.ApplyQueuedFrees(cache);
      absl::StatusOr<uint64_t> offset = cache->pool.Allocate(size_class);
      if (!offset.ok()) return offset.status();
      return base() + *offset;
    }
  }
  if (detached_) return DetachedError();
  absl::StatusOr<uint64_t> offset = AllocateLarge(size);
  if (!offset.ok()) return offset.status();
  return base() + *offset;
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
  if (ThreadCaches::Cache* owner = caches_.OwnerOf(offset >> kChunkShift)) {
    ThreadCaches::Cache* mine = caches_.OfThisThread();
    if (owner != mine) {
      // Another thread's object: that thread (or the next sync) frees it;
      // a bad one is reported by the next sync().
      ThreadCaches::QueueFree(owner, offset);
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
  if (detached_) return DetachedError();
  if (absl::StatusOr<bool> freed = large_->FreeUntold(offset, size_hint); !freed.ok() || *freed) {
    return freed.status();
  }
  return frees_.Free(offset, size_hint);
}

bool HeapImpl::StoresUnseen() const { return tracker_ != nullptr && !tracker_->error().ok(); }

absl::StatusOr<uint64_t> HeapImpl::sync() {
  absl::MutexLock sync_lock(&sync_mu_);
  if (read_only_) {
    return absl::FailedPreconditionError(absl::StrCat("heap ", name_, " is attached read-only"));
  }
  if (detached_) return DetachedError();
  if (absl::Status s = mapped_->Flush(); !s.ok()) return s;
  absl::Status frees = frees_.Flush();
  const std::vector<ThreadCaches::Cache*> caches = caches_.All();
  std::vector<std::vector<LeaseReport>> by_cache(caches.size());
  std::vector<LeaseReport> reports;
  for (size_t i = 0; i < caches.size(); ++i) {
    VisitorScope visit(caches[i]->gate);
    caches_.ApplyQueuedFrees(caches[i]);
    by_cache[i] = caches[i]->pool.TakeDirtyReports();
    reports.insert(reports.end(), by_cache[i].begin(), by_cache[i].end());
  }
  // The reserve goes back, but for what was carved from it: no free chunk
  // stays held from other sessions (or from small objects) between syncs.
  const LargeObjects::ForSync large = large_->TakeForSync(/*release_reserve=*/true);
  // Protect again what this generation wrote: from here on, a store takes a
  // pre-image of the page as this sync commits it.
  const uint64_t generation = tracker_ != nullptr ? tracker_->BeginSync() : 0;
  v1::SyncResponse response;
  SyncParts parts(reports, large.placed);
  absl::Status sent = parts.SendEarlier(*calls_, session_);
  if (sent.ok()) {
    v1::SyncRequest last;
    last.set_session(session_);
    last.set_generation(generation);
    last.set_stores_unseen(StoresUnseen());
    parts.FillLast(&last);
    for (const LargePlacement& run : large.released) ToProto(run, last.add_released());
    sent = calls_->Sync(last, &response);
  }
  if (tracker_ != nullptr) tracker_->EndSync();
  large_->SyncEnded(sent.ok());
  if (absl::Status s = std::move(sent); !s.ok()) {
    for (size_t i = 0; i < caches.size(); ++i) {
      VisitorScope visit(caches[i]->gate);
      caches[i]->pool.Redirty(by_cache[i]);  // report them at the next sync
    }
    return s;
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    if (by_cache[i].empty()) continue;
    VisitorScope visit(caches[i]->gate);
    caches[i]->pool.ReportsApplied(by_cache[i]);
  }
  if (absl::Status s = CheckCapacity(name_, response.capacity_bytes(), max_size_); !s.ok()) {
    return s;
  }
  for (const v1::LeaseCorrection& c : response.corrections()) {
    if (uint64_t{c.chunk()} >= max_size_ / kChunkSize) {
      return Unexpected(name_, absl::StrCat("a correction of chunk ", c.chunk()));
    }
    ThreadCaches::Cache* owner = caches_.OwnerOf(c.chunk());
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
  if (absl::Status rejected = caches_.TakeRejected(); !rejected.ok()) return rejected;
  if (tracker_ != nullptr) {
    if (absl::Status s = tracker_->error(); !s.ok()) return s;
  }
  return response.epoch();
}

absl::Status HeapImpl::detach() {
  if (detached_) return DetachedError();
  detached_ = true;
  absl::Status status;
  std::vector<LeaseReport> reports;
  if (!read_only_) {
    status.Update(mapped_->Flush());
    status.Update(frees_.Flush());
    for (ThreadCaches::Cache* cache : caches_.All()) {
      VisitorScope visit(cache->gate);
      caches_.ApplyQueuedFrees(cache);
      std::vector<LeaseReport> released = cache->pool.ReleaseAll();
      std::move(released.begin(), released.end(), std::back_inserter(reports));
    }
  }
  // Detach carries the last kReportsPerSync leases; heapd holds the earlier
  // parts and returns them all with it, in one epoch. If a part failed, no
  // detach commits this session's stores without it: the session ends
  // without one (as a crash: heapd puts it back at its last sync).
  const std::vector<LargePlacement> placed = large_->TakeForSync(/*release_reserve=*/false).placed;
  SyncParts parts(reports, placed);
  if (const absl::Status earlier = parts.SendEarlier(*calls_, session_); earlier.ok()) {
    v1::DetachRequest request;
    request.set_session(session_);
    if (tracker_ != nullptr) request.set_generation(tracker_->BeginSync());
    request.set_stores_unseen(StoresUnseen());
    parts.FillLast(&request);
    status.Update(calls_->Detach(request));
  } else {
    status.Update(
        absl::Status(earlier.code(), absl::StrCat("heap ", name_, ": ", earlier.message(),
                                                  "; the session ends at its last sync")));
  }
  mapped_->StopGrowth();
  large_.reset();    // it works in the mapping, with the tracker
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
  if (detached_) return DetachedError();
  if (const uint64_t offset = offset_of(object); offset % kChunkSize == 0 && !read_only_) {
    // heapd binds only objects it knows (one in flight with a sync: once
    // that sync is over, TellUntold sends whatever is left).
    if (large_->Untold(static_cast<uint32_t>(offset >> kChunkShift))) {
      if (absl::Status s = TellUntold(); !s.ok()) return s;
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
  if (detached_) return DetachedError();
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
bool Heap::fixed_address() const { return HeapImpl::Of(*this).fixed_address(); }
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
