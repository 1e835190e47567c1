#include "client/large_objects.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/size_class.h"
#include "client/heapd_answers.h"
#include "client/sync_parts.h"
#include "protocol/proto_convert.h"

namespace heapd {

absl::StatusOr<uint64_t> LargeObjects::Allocate(uint64_t size) {
  const uint64_t chunks = (size + kChunkSize - 1) / kChunkSize;
  if (chunks > kMaxCarvedChunks) {
    // With the sync lock held from the grant to its Unprotect, as for a
    // top-up: heapd keeps memory it hands out free open to stores without
    // pre-images across one sync of the session, never two
    // (ContentUndo::Forget); a thread stalled in between while others
    // synced would store where heapd no longer logs.
    absl::MutexLock sync_lock(session_.sync_mu);
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
    absl::MutexLock lock(&mu_);
    if (std::optional<uint32_t> first = reserve_.Carve(need))
      return uint64_t{*first} << kChunkShift;
  }
  // Topped up with the sync lock held, not mu_: other threads carve and
  // free meanwhile, and no sync is under way while heapd may hand out
  // chunks of placements it would send again (LargeReserve::Add).
  absl::MutexLock sync_lock(session_.sync_mu);
  {
    absl::MutexLock lock(&mu_);
    if (std::optional<uint32_t> first = reserve_.Carve(need))
      return uint64_t{*first} << kChunkShift;
    // At most a sixteenth of the heap's maximum size: what a session holds
    // unused between syncs makes the heap grow by as much.
    want = std::max<uint64_t>(
        need, std::min<uint64_t>(next_reserve_chunks_, session_.max_size / kChunkSize / 16));
  }
  absl::StatusOr<LargePlacement> run;
  if (absl::Status s = WithReserveBack([&] {
        return (run = TakeFromHeapd(want * kChunkSize, true, chunks * kChunkSize)).status();
      });
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  if (run->chunks < need || !reserve_.Add(run->chunk, run->chunks)) {
    return Unexpected(session_.heap, absl::StrCat("a reserve of ", run->chunks, " chunks at chunk ",
                                                  run->chunk, " for an object of ", need,
                                                  ", or over chunks this session holds"));
  }
  next_reserve_chunks_ = static_cast<uint32_t>(std::min<uint64_t>(2 * want, kMaxReserveChunks));
  const std::optional<uint32_t> first = reserve_.Carve(need);
  if (!first) return Unexpected(session_.heap, "a reserve the object does not fit");
  return uint64_t{*first} << kChunkShift;
}

absl::StatusOr<LargePlacement> LargeObjects::TakeFromHeapd(uint64_t size, bool reserve,
                                                           uint64_t min_size) {
  const std::string& heap = session_.heap;
  v1::AllocateLargeRequest request;
  request.set_session(session_.id);
  request.set_size(size);
  request.set_reserve(reserve);
  request.set_min_size(min_size);
  v1::AllocateLargeResponse response;
  if (absl::Status s = session_.calls->AllocateLarge(request, &response); !s.ok()) return s;
  if (absl::Status s = CheckCapacity(heap, response.capacity_bytes(), session_.max_size); !s.ok()) {
    return s;
  }
  const uint64_t taken = response.size();
  if (absl::Status s = CheckObject(heap, response.offset(), taken, response.capacity_bytes());
      !s.ok() || response.offset() % kChunkSize != 0 || taken % kChunkSize != 0 ||
      taken < std::max(min_size, reserve ? 0 : size) || taken > size + kChunkSize - 1) {
    return s.ok() ? Unexpected(heap, absl::StrCat(taken, " bytes of large object or reserve at ",
                                                  "offset ", response.offset(), " for ", size))
                  : s;
  }
  if (absl::Status s = session_.mapped->MapUpTo(response.capacity_bytes()); !s.ok()) {
    // The caller never sees it: give an object back (a reserve is freed
    // when the session ends).
    if (reserve) return s;
    v1::ObjectRef object;
    object.set_offset(response.offset());
    if (absl::Status freed = session_.frees->FreeNow({object}); !freed.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), "; then freeing the object at ",
                                                 response.offset(), " failed: ", freed.message()));
    }
    return s;
  }
  if (session_.tracker != nullptr) {
    session_.tracker->Unprotect(response.offset(), taken);  // free: no pre-images
  }
  return LargePlacement{static_cast<uint32_t>(response.offset() >> kChunkShift),
                        static_cast<uint32_t>(taken >> kChunkShift)};
}

absl::StatusOr<bool> LargeObjects::FreeUntold(uint64_t offset, uint64_t size_hint) {
  const uint32_t chunk = static_cast<uint32_t>(offset >> kChunkShift);
  absl::MutexLock lock(&mu_);
  if (!reserve_.Holds(chunk)) return false;
  const uint32_t chunks = offset % kChunkSize == 0 ? reserve_.UntoldChunks(chunk) : 0;
  if (chunks == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heap ", session_.heap, ": offset ", offset,
        " is not the start of an object (its chunk is reserved for this process's large "
        "objects, free or inside one): double free?"));
  }
  if (size_hint != 0 &&
      (size_hint <= kMaxSmallSize || (size_hint + kChunkSize - 1) / kChunkSize != chunks)) {
    return absl::InvalidArgumentError(absl::StrCat("heap ", session_.heap, ": object at offset ",
                                                   offset, " is a large object of ", chunks,
                                                   " chunks, not of ", size_hint, " bytes"));
  }
  reserve_.FreeUntold(chunk);  // heapd never knew of it
  return true;
}

bool LargeObjects::Holds(uint32_t chunk) const {
  absl::MutexLock lock(&mu_);
  return reserve_.Holds(chunk);
}

bool LargeObjects::Untold(uint32_t chunk) const {
  absl::MutexLock lock(&mu_);
  return reserve_.NotYetTold(chunk);
}

absl::Status LargeObjects::WithReserveBack(const std::function<absl::Status()>& call) {
  absl::Status status = call();
  if (status.code() != absl::StatusCode::kResourceExhausted) return status;
  // What this process freed and has not told heapd of yet, and the reserve
  // it holds unused, may be what the call needs. Both are tried: each may
  // free what the other cannot.
  const bool flushed = session_.frees->pending() && session_.frees->Flush().ok();
  const bool returned = ReturnReserve();
  if (flushed || returned) status = call();
  return status;
}

bool LargeObjects::ReturnReserve() {
  std::vector<LargePlacement> released;
  {
    absl::MutexLock lock(&mu_);
    released = reserve_.TakeFreeRuns(kPlacementsPerPart);
  }
  // Failed: the runs stay reserved until the session ends.
  return !released.empty() && Tell({}, released).ok();
}

absl::Status LargeObjects::Tell(absl::Span<const LargePlacement> placed,
                                absl::Span<const LargePlacement> released) {
  v1::SyncRequest request;
  request.set_session(session_.id);
  request.set_more(true);  // taken at once; committed by the next sync
  for (const LargePlacement& object : placed) ToProto(object, request.add_placed());
  for (const LargePlacement& run : released) ToProto(run, request.add_released());
  v1::SyncResponse response;
  return session_.calls->Sync(request, &response);
}

absl::Status LargeObjects::TellUntold() {
  absl::MutexLock sync_lock(session_.sync_mu);
  const std::vector<LargePlacement> placed = TakeForSync(/*release_reserve=*/false).placed;
  absl::Status status;
  for (size_t i = 0; i < placed.size() && status.ok(); i += kPlacementsPerPart) {
    status = Tell(absl::MakeConstSpan(placed).subspan(i, kPlacementsPerPart), {});
  }
  SyncEnded(status.ok());
  return status;
}

LargeObjects::ForSync LargeObjects::TakeForSync(bool release_reserve) {
  absl::MutexLock lock(&mu_);
  ForSync taken;
  taken.placed = reserve_.TakeForSync();
  if (release_reserve) {
    taken.released = reserve_.TakeFreeRuns(kPlacementsPerPart);
    next_reserve_chunks_ = kFirstReserveChunks;
  }
  return taken;
}

void LargeObjects::SyncEnded(bool committed) {
  absl::MutexLock lock(&mu_);
  if (committed) {
    reserve_.SyncDone();
  } else {
    reserve_.SyncFailed();
  }
}

}  // namespace heapd
