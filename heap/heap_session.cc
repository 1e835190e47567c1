#include "heap/heap_session.h"

#include "absl/strings/str_cat.h"

namespace heapd {

HeapSession::HeapSession(PersistentHeap* heap, ClientId client, uint32_t lease_batch)
    : heap_(heap),
      client_(client),
      pool_(this, heap->config().max_size / kChunkSize, lease_batch) {}

absl::StatusOr<std::unique_ptr<HeapSession>> HeapSession::Start(PersistentHeap* heap,
                                                                ClientId client,
                                                                uint32_t lease_batch) {
  if (client == 0) return absl::InvalidArgumentError("client id 0 is reserved");
  std::unique_ptr<HeapSession> session(new HeapSession(heap, client, lease_batch));
  absl::StatusOr<std::unique_ptr<HeapMapping>> mapping = HeapMapping::Map(
      heap->data_fd(), heap->config().max_size, heap->capacity_bytes(), /*writable=*/true);
  if (!mapping.ok()) return mapping.status();
  session->mapping_ = *std::move(mapping);
  return session;
}

absl::Status HeapSession::MapCapacity() { return mapping_->Extend(heap_->capacity_bytes()); }

absl::StatusOr<std::vector<LeaseGrant>> HeapSession::LeaseChunks(uint32_t size_class,
                                                                 uint32_t count) {
  absl::StatusOr<std::vector<LeaseGrant>> grants = heap_->LeaseChunks(client_, size_class, count);
  if (!grants.ok()) return grants;
  if (absl::Status s = MapCapacity(); !s.ok()) return s;
  return grants;
}

absl::StatusOr<uint64_t> HeapSession::Allocate(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  if (size <= kMaxSmallSize) return pool_.Allocate(SizeClassFor(size));
  absl::StatusOr<uint64_t> offset = heap_->AllocateLarge(client_, size);
  if (!offset.ok()) return offset;
  if (absl::Status s = MapCapacity(); !s.ok()) {
    // The caller never sees the object: give it back.
    const ObjectRef object{*offset, size};
    if (absl::Status freed = heap_->Free(client_, absl::MakeConstSpan(&object, 1)); !freed.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), "; then freeing the object at ",
                                                 *offset, " failed: ", freed.message()));
    }
    return s;
  }
  return offset;
}

absl::Status HeapSession::Deallocate(uint64_t offset) {
  switch (pool_.Free(offset)) {
    case LocalFree::kFreed:
      return absl::OkStatus();
    case LocalFree::kNotLive:
      return absl::InvalidArgumentError(pool_.DescribeNotLive(offset));
    case LocalFree::kNotLeased:
      break;
  }
  const ObjectRef object{offset, 0};
  return heap_->Free(client_, absl::MakeConstSpan(&object, 1));
}

absl::StatusOr<uint64_t> HeapSession::Sync() {
  if (absl::Status s = mapping_->Flush(); !s.ok()) return s;
  const std::vector<LeaseReport> reports = pool_.TakeDirtyReports();
  absl::StatusOr<SyncResult> result = heap_->Sync(client_, reports);
  if (!result.ok()) {
    pool_.Redirty(reports);  // report them again at the next sync
    return result.status();
  }
  pool_.ApplyCorrections(result->corrections);
  if (!result->rejected_frees.empty()) {
    return absl::InvalidArgumentError(result->rejected_frees.front());
  }
  return result->epoch;
}

absl::Status HeapSession::Detach() {
  if (absl::Status s = mapping_->Flush(); !s.ok()) return s;
  return heap_->Detach(client_, pool_.ReleaseAll()).status();
}

}  // namespace heapd
