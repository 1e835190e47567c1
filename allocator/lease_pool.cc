#include "allocator/lease_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace heapd {

LeasePool::LeasePool(LeaseSource* source, uint64_t max_chunks, uint32_t lease_batch)
    : source_(source),
      lease_batch_(std::clamp<uint32_t>(lease_batch, 1, kMaxLeaseBatch)),
      by_chunk_(max_chunks) {
  next_batch_.fill(1);
}

absl::StatusOr<uint64_t> LeasePool::AllocateSlow(uint32_t size_class) {
  std::vector<ChunkLease*>& candidates = with_space_[size_class];
  while (!candidates.empty()) {
    ChunkLease* lease = candidates.back();
    candidates.pop_back();
    if (!lease->bitmap.full()) {
      current_[size_class] = lease;
      return Allocate(size_class);
    }
  }
  const std::vector<uint32_t> offered = Offers(size_class, next_batch_[size_class]);
  absl::StatusOr<std::vector<LeaseGrant>> grants =
      source_->LeaseChunks(size_class, next_batch_[size_class], offered);
  if (!grants.ok()) {
    // The daemon may have taken them back as this class before the call
    // failed: in doubt until a later lease grants them.
    for (uint32_t chunk : offered) PutInDoubt(by_chunk_.Get(chunk));
    return grants.status();
  }
  next_batch_[size_class] = std::min(2 * next_batch_[size_class], lease_batch_);
  // Checked whole before the pool changes: a grant it cannot take leaves
  // no chunk half taken back.
  std::vector<SlotBitmap> bitmaps;
  for (const LeaseGrant& grant : *grants) {
    const bool was_offered =
        std::find(offered.begin(), offered.end(), grant.chunk) != offered.end();
    absl::StatusOr<SlotBitmap> bitmap =
        SlotBitmap::FromWords(SlotsPerChunk(size_class), grant.words);
    if (grant.size_class != size_class || grant.chunk >= by_chunk_.max_chunks() ||
        (by_chunk_.Get(grant.chunk) != nullptr) != was_offered || !bitmap.ok()) {
      for (uint32_t chunk : offered) PutInDoubt(by_chunk_.Get(chunk));
      return absl::InternalError(absl::StrCat("lease source granted chunk ", grant.chunk,
                                              " of class ", grant.size_class, " for class ",
                                              size_class, ", which this pool cannot take"));
    }
    bitmaps.push_back(*std::move(bitmap));
  }
  for (size_t i = 0; i < grants->size(); ++i) {
    const LeaseGrant& grant = (*grants)[i];
    if (ChunkLease* held = by_chunk_.Get(grant.chunk)) {
      Reclass(held, size_class, std::move(bitmaps[i]));
      if (!held->bitmap.full()) candidates.push_back(held);
      continue;
    }
    absl::StatusOr<SlotBitmap> bitmap = std::move(bitmaps[i]);
    auto lease = std::make_unique<ChunkLease>(ChunkLease{
        uint64_t{grant.chunk} << kChunkShift, grant.chunk, size_class, ClassSize(size_class), false,
        false, bitmap->live() == 0, false, false, *std::move(bitmap)});
    by_chunk_.Set(grant.chunk, lease.get());
    if (!lease->bitmap.full()) candidates.push_back(lease.get());
    leases_.push_back(std::move(lease));
  }
  // Fill the lowest chunk first: keeps objects dense.
  std::sort(candidates.begin(), candidates.end(),
            [](const ChunkLease* a, const ChunkLease* b) { return a->chunk > b->chunk; });
  if (candidates.empty()) {
    return absl::InternalError(
        absl::StrCat("lease source granted no chunk with a free slot of class ", size_class));
  }
  current_[size_class] = candidates.back();
  candidates.pop_back();
  return Allocate(size_class);
}

std::vector<uint32_t> LeasePool::Offers(uint32_t size_class, uint32_t most) {
  std::vector<uint32_t> offers;
  // In doubt first, whatever the class asked (granted as it is if the
  // daemon holds it so already).
  for (const ChunkLease* lease : in_doubt_) {
    if (offers.size() < most) offers.push_back(lease->chunk);
  }
  size_t kept = 0;
  for (ChunkLease* lease : emptied_) {
    if (lease->bitmap.live() != 0 || lease == current_[lease->size_class]) {
      lease->emptied = false;
      continue;
    }
    emptied_[kept++] = lease;
    if (lease->size_class != size_class && lease->heapd_empty && !lease->reporting &&
        offers.size() < most) {
      offers.push_back(lease->chunk);
    }
  }
  emptied_.resize(kept);
  return offers;
}

void LeasePool::Reclass(ChunkLease* lease, uint32_t size_class, SlotBitmap bitmap) {
  std::vector<ChunkLease*>& old_list = with_space_[lease->size_class];
  old_list.erase(std::remove(old_list.begin(), old_list.end(), lease), old_list.end());
  emptied_.erase(std::remove(emptied_.begin(), emptied_.end(), lease), emptied_.end());
  in_doubt_.erase(std::remove(in_doubt_.begin(), in_doubt_.end(), lease), in_doubt_.end());
  lease->emptied = false;
  lease->in_doubt = false;
  lease->heapd_empty = true;
  lease->size_class = size_class;
  lease->slot_size = ClassSize(size_class);
  lease->bitmap = std::move(bitmap);
  // Reported at the next sync whatever it holds.
  lease->dirty = true;
}

void LeasePool::PutInDoubt(ChunkLease* lease) {
  if (lease == nullptr || lease->in_doubt) return;
  std::vector<ChunkLease*>& list = with_space_[lease->size_class];
  list.erase(std::remove(list.begin(), list.end(), lease), list.end());
  emptied_.erase(std::remove(emptied_.begin(), emptied_.end(), lease), emptied_.end());
  lease->emptied = false;
  lease->in_doubt = true;
  in_doubt_.push_back(lease);
}

int LeasePool::SizeClassAt(uint64_t offset) const {
  const ChunkLease* lease = by_chunk_.Get(offset >> kChunkShift);
  return lease == nullptr ? -1 : static_cast<int>(lease->size_class);
}

LeaseReport LeasePool::ReportOf(const ChunkLease& lease) const {
  return LeaseReport{lease.chunk, lease.bitmap.words(), static_cast<int32_t>(lease.size_class)};
}

std::vector<LeaseReport> LeasePool::TakeDirtyReports() {
  std::vector<LeaseReport> reports;
  for (auto& lease : leases_) {
    if (!lease->dirty) continue;
    reports.push_back(ReportOf(*lease));
    lease->dirty = false;
    lease->reporting = true;
  }
  return reports;
}

void LeasePool::Redirty(absl::Span<const LeaseReport> reports) {
  for (const LeaseReport& report : reports) {
    ChunkLease* lease = by_chunk_.Get(report.chunk);
    if (lease == nullptr) continue;
    lease->dirty = true;
    lease->reporting = false;
    // Applied or not: empty for sure only if it was before and the report too.
    lease->heapd_empty =
        lease->heapd_empty && SlotBitmap::NoneAllocated(lease->bitmap.slot_count(), report.words);
  }
}

void LeasePool::ReportsApplied(absl::Span<const LeaseReport> reports) {
  for (const LeaseReport& report : reports) {
    ChunkLease* lease = by_chunk_.Get(report.chunk);
    if (lease == nullptr) continue;
    lease->reporting = false;
    lease->heapd_empty = SlotBitmap::NoneAllocated(lease->bitmap.slot_count(), report.words);
  }
}

std::vector<LeaseReport> LeasePool::ReleaseAll() {
  std::vector<LeaseReport> reports;
  reports.reserve(leases_.size());
  for (auto& lease : leases_) {
    reports.push_back(ReportOf(*lease));
    by_chunk_.Set(lease->chunk, nullptr);
  }
  leases_.clear();
  current_.fill(nullptr);
  for (auto& list : with_space_) list.clear();
  emptied_.clear();
  in_doubt_.clear();
  return reports;
}

void LeasePool::ApplyCorrections(absl::Span<const LeaseCorrection> corrections) {
  for (const LeaseCorrection& correction : corrections) {
    ChunkLease* lease = by_chunk_.Get(correction.chunk);
    if (lease == nullptr) continue;
    const bool was_full = lease->bitmap.full();
    for (uint32_t slot : correction.freed_slots) {
      if (slot < lease->bitmap.slot_count() && lease->bitmap.IsAllocated(slot)) {
        lease->bitmap.Free(slot);
      }
    }
    for (uint32_t slot : correction.kept_slots) {
      if (slot < lease->bitmap.slot_count() && !lease->bitmap.IsAllocated(slot)) {
        lease->bitmap.Set(slot);
      }
    }
    if (!correction.kept_slots.empty()) lease->heapd_empty = false;
    if (lease->in_doubt || lease == current_[lease->size_class]) continue;
    if (was_full && !lease->bitmap.full()) with_space_[lease->size_class].push_back(lease);
    if (lease->bitmap.live() == 0 && !lease->emptied) {
      lease->emptied = true;
      emptied_.push_back(lease);
    }
  }
}

std::string LeasePool::DescribeNotLive(uint64_t offset) const {
  const ChunkLease* lease = by_chunk_.Get(offset >> kChunkShift);
  if (lease == nullptr) return absl::StrCat("offset ", offset, " is in no leased chunk");
  const uint64_t in_chunk = offset & (kChunkSize - 1);
  if (in_chunk % lease->slot_size != 0) {
    return absl::StrCat("offset ", offset, " is inside an object of ", lease->slot_size,
                        " bytes, not at its start (chunk ", lease->chunk, ")");
  }
  return absl::StrCat("offset ", offset, " is not a live object (chunk ", lease->chunk, ", slot ",
                      in_chunk / lease->slot_size, "): double free or never allocated");
}

absl::Status LeasePool::CheckInvariants() const {
  for (const auto& lease : leases_) {
    if (by_chunk_.Get(lease->chunk) != lease.get()) {
      return absl::InternalError(
          absl::StrCat("lease of chunk ", lease->chunk, " is missing from the chunk map"));
    }
    if (absl::Status s = lease->bitmap.CheckInvariants(); !s.ok()) return s;
    const auto& list = with_space_[lease->size_class];
    if (!lease->bitmap.full() && current_[lease->size_class] != lease.get() && !lease->in_doubt &&
        std::find(list.begin(), list.end(), lease.get()) == list.end()) {
      return absl::InternalError(
          absl::StrCat("chunk ", lease->chunk, " has free slots but cannot be found"));
    }
  }
  size_t marked = 0;
  for (const auto& lease : leases_) marked += lease->emptied ? 1 : 0;
  for (const ChunkLease* lease : emptied_) {
    if (!lease->emptied) return absl::InternalError("an unmarked lease in the emptied list");
  }
  if (marked != emptied_.size()) {
    return absl::InternalError(
        absl::StrCat(marked, " leases marked emptied, ", emptied_.size(), " in the list"));
  }
  for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
    if (current_[c] != nullptr && current_[c]->size_class != c) {
      return absl::InternalError(absl::StrCat("current chunk of class ", c, " has another class"));
    }
  }
  return absl::OkStatus();
}

}  // namespace heapd
