#include "allocator/chunk_directory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace heapd {
namespace {

uint64_t ChunkBase(uint32_t chunk) { return uint64_t{chunk} << kChunkShift; }

uint32_t ChunksFor(uint64_t size) {
  return static_cast<uint32_t>((size + kChunkSize - 1) >> kChunkShift);
}

}  // namespace

ChunkDirectory::ChunkDirectory(uint32_t capacity_chunks) { Grow(capacity_chunks); }

absl::Status ChunkDirectory::OutsideHeap(uint64_t offset) const {
  return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is outside the heap (",
                                                 chunks_.size() * kChunkSize, " bytes)"));
}

bool ChunkDirectory::PendingFree(const Chunk& chunk, uint32_t slot) {
  return std::any_of(chunk.remote_frees.begin(), chunk.remote_frees.end(),
                     [slot](const RemoteFree& f) { return f.slot == slot; });
}

void ChunkDirectory::Grow(uint32_t capacity_chunks) {
  const uint32_t old = this->capacity_chunks();
  if (capacity_chunks <= old) return;
  chunks_.resize(capacity_chunks);
  free_.Give(old, capacity_chunks - old);
}

absl::StatusOr<std::unique_ptr<ChunkDirectory>> ChunkDirectory::FromRecords(
    uint32_t capacity_chunks, absl::Span<const ChunkRecord> records) {
  // The last record of a chunk wins.
  std::map<uint32_t, const ChunkRecord*> last;
  for (const ChunkRecord& record : records) {
    if (record.chunk >= capacity_chunks) {
      return absl::DataLossError(absl::StrCat("metadata names chunk ", record.chunk,
                                              " beyond the heap's ", capacity_chunks, " chunks"));
    }
    last[record.chunk] = &record;
  }
  auto dir = std::make_unique<ChunkDirectory>(capacity_chunks);
  for (const auto& [chunk, record] : last) {
    switch (record->kind) {
      case ChunkKind::kFree:
        break;
      case ChunkKind::kSmall: {
        if (record->size_class >= kNumSizeClasses) {
          return absl::DataLossError(
              absl::StrCat("metadata gives chunk ", chunk, " size class ", record->size_class));
        }
        absl::StatusOr<SlotBitmap> bitmap =
            SlotBitmap::FromWords(SlotsPerChunk(record->size_class), record->words);
        if (!bitmap.ok()) {
          return absl::DataLossError(
              absl::StrCat("metadata of chunk ", chunk, ": ", bitmap.status().message()));
        }
        if (bitmap->empty()) break;
        if (dir->chunks_[chunk].kind != ChunkKind::kFree) {
          return absl::DataLossError(absl::StrCat("metadata makes chunk ", chunk,
                                                  " both a small chunk and part of a large run"));
        }
        dir->free_.TakeAt(chunk, 1);
        Chunk& c = dir->chunks_[chunk];
        c.kind = ChunkKind::kSmall;
        c.size_class = static_cast<uint8_t>(record->size_class);
        c.bitmap = std::make_unique<SlotBitmap>(*std::move(bitmap));
        dir->Settle(chunk);
        break;
      }
      case ChunkKind::kLargeHead: {
        const uint64_t end = uint64_t{chunk} + record->run_chunks;
        if (record->run_chunks == 0 || end > capacity_chunks ||
            !dir->free_.IsFree(chunk, record->run_chunks)) {
          return absl::DataLossError(
              absl::StrCat("metadata gives chunk ", chunk, " a large run of ", record->run_chunks,
                           " chunks that overlaps other chunks or the end of the heap"));
        }
        dir->free_.TakeAt(chunk, record->run_chunks);
        dir->chunks_[chunk].kind = ChunkKind::kLargeHead;
        dir->chunks_[chunk].run_chunks = record->run_chunks;
        for (uint32_t t = chunk + 1; t < end; ++t) {
          dir->chunks_[t].kind = ChunkKind::kLargeTail;
          dir->chunks_[t].head_chunk = chunk;
        }
        break;
      }
      default:
        return absl::DataLossError(absl::StrCat("metadata gives chunk ", chunk, " unknown kind ",
                                                static_cast<int>(record->kind)));
    }
  }
  return dir;
}

void ChunkDirectory::MarkDirty(uint32_t chunk) {
  if (chunks_[chunk].dirty) return;
  chunks_[chunk].dirty = true;
  dirty_.push_back(chunk);
}

void ChunkDirectory::MakeSmall(uint32_t chunk, uint32_t size_class) {
  Chunk& c = chunks_[chunk];
  c.kind = ChunkKind::kSmall;
  c.size_class = static_cast<uint8_t>(size_class);
  c.bitmap = std::make_unique<SlotBitmap>(SlotsPerChunk(size_class));
  MarkDirty(chunk);
}

void ChunkDirectory::MakeFree(uint32_t chunk_start, uint32_t length, bool record) {
  for (uint32_t i = chunk_start; i < chunk_start + length; ++i) {
    Chunk& c = chunks_[i];
    const bool dirty = c.dirty;
    const uint32_t incarnation = c.incarnation + 1;
    c = Chunk{};
    c.dirty = dirty;
    c.incarnation = incarnation;
  }
  if (record) MarkDirty(chunk_start);
  free_.Give(chunk_start, length);
}

void ChunkDirectory::Settle(uint32_t chunk) {
  Chunk& c = chunks_[chunk];
  leasable_[c.size_class].erase(chunk);
  if (c.bitmap->empty()) {
    MakeFree(chunk, 1);
  } else if (!c.bitmap->full()) {
    leasable_[c.size_class].insert(chunk);
  }
}

bool ChunkDirectory::Stale(const LeaseReport& report) const {
  return report.size_class >= 0 && report.chunk < chunks_.size() &&
         chunks_[report.chunk].kind == ChunkKind::kSmall &&
         static_cast<uint32_t>(report.size_class) != chunks_[report.chunk].size_class;
}

bool ChunkDirectory::Reclass(ClientId client, uint32_t chunk, uint32_t size_class) {
  if (chunk >= chunks_.size() || size_class >= kNumSizeClasses) return false;
  Chunk& c = chunks_[chunk];
  // Already of that class: granted again, empty (a client that did not
  // learn of an earlier Reclass offers it again).
  if (c.kind != ChunkKind::kSmall || c.lessee != client || client == 0 || c.bitmap->live() != 0 ||
      !c.remote_frees.empty()) {
    return false;
  }
  ++c.incarnation;
  c.size_class = static_cast<uint8_t>(size_class);
  c.bitmap = std::make_unique<SlotBitmap>(SlotsPerChunk(size_class));
  MarkDirty(chunk);
  return true;
}

absl::StatusOr<std::vector<LeaseGrant>> ChunkDirectory::Lease(ClientId client, uint32_t size_class,
                                                              uint32_t count,
                                                              absl::Span<const uint32_t> reuse) {
  if (client == 0) return absl::InvalidArgumentError("client id 0 is reserved");
  if (size_class >= kNumSizeClasses) {
    return absl::InvalidArgumentError(
        absl::StrCat("size class ", size_class, " does not exist (0..", kNumSizeClasses - 1, ")"));
  }
  std::vector<LeaseGrant> grants;
  for (uint32_t chunk : reuse) {
    if (grants.size() == count) break;
    if (Reclass(client, chunk, size_class)) {
      grants.push_back(LeaseGrant{chunk, size_class, chunks_[chunk].bitmap->words()});
    }
  }
  std::set<uint32_t>& partial = leasable_[size_class];
  while (grants.size() < count) {
    uint32_t chunk;
    if (!partial.empty()) {
      chunk = *partial.begin();
      partial.erase(partial.begin());
    } else if (std::optional<uint32_t> fresh = free_.Take(1)) {
      chunk = *fresh;
      MakeSmall(chunk, size_class);
    } else {
      break;
    }
    chunks_[chunk].lessee = client;
    clients_[client].leased.insert(chunk);
    grants.push_back(LeaseGrant{chunk, size_class, chunks_[chunk].bitmap->words()});
  }
  return grants;
}

void ChunkDirectory::ResolveRemoteFrees(uint32_t chunk, SlotBitmap& bitmap, bool final,
                                        bool lessee_died, LeaseCorrection* correction) {
  Chunk& c = chunks_[chunk];
  std::vector<RemoteFree> kept;
  for (RemoteFree& pending : c.remote_frees) {
    if (bitmap.IsAllocated(pending.slot)) {
      bitmap.Free(pending.slot);
      if (correction != nullptr) correction->freed_slots.push_back(pending.slot);
      continue;
    }
    if (lessee_died) continue;  // allocated after its last report: died with it
    if (!final && !pending.seen_free) {
      pending.seen_free = true;  // maybe allocated after this report was taken
      kept.push_back(pending);
      continue;
    }
    const uint64_t offset = ChunkBase(chunk) + uint64_t{pending.slot} * ClassSize(c.size_class);
    RejectFree(pending.freer,
               absl::StrCat("the free of offset ", offset, " was rejected: client ", c.lessee,
                            ", which leases its chunk, has no live object there (double free or "
                            "never allocated)"));
  }
  c.remote_frees = std::move(kept);
}

void ChunkDirectory::RejectFree(ClientId freer, std::string why) {
  auto it = clients_.find(freer);
  if (it != clients_.end()) it->second.rejected_frees.push_back(std::move(why));
}

absl::Status ChunkDirectory::CheckReport(ClientId client,
                                         absl::Span<const LeaseReport> reports) const {
  std::set<uint32_t> seen;
  for (const LeaseReport& report : reports) {
    if (report.chunk >= chunks_.size() || chunks_[report.chunk].kind != ChunkKind::kSmall ||
        chunks_[report.chunk].lessee != client) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", report.chunk, " is not leased by client ", client));
    }
    const Chunk& c = chunks_[report.chunk];
    if (Stale(report)) {
      // Skipped, but bounded all the same: a session's staged reports are
      // held until its sync's last part.
      if (static_cast<uint32_t>(report.size_class) >= kNumSizeClasses ||
          report.words.size() != (SlotsPerChunk(report.size_class) + 63) / 64) {
        return absl::InvalidArgumentError(absl::StrCat(
            "report for chunk ", report.chunk, " has ", report.words.size(),
            " bitmap words; the size class it names (", report.size_class, ") has another size"));
      }
      continue;
    }
    if (report.words.size() != c.bitmap->words().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("report for chunk ", report.chunk, " has ", report.words.size(),
                       " bitmap words; its size class needs ", c.bitmap->words().size()));
    }
    if (!seen.insert(report.chunk).second) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", report.chunk, " is reported twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReportResult> ChunkDirectory::Report(ClientId client,
                                                    absl::Span<const LeaseReport> reports,
                                                    bool release) {
  if (absl::Status s = CheckReport(client, reports); !s.ok()) return s;
  std::set<uint32_t> seen;
  for (const LeaseReport& report : reports) {
    if (!Stale(report)) seen.insert(report.chunk);
  }
  ReportResult result;
  for (const LeaseReport& report : reports) {
    if (Stale(report)) continue;
    Chunk& c = chunks_[report.chunk];
    SlotBitmap bitmap = *SlotBitmap::FromWords(c.bitmap->slot_count(), report.words);
    LeaseCorrection correction{report.chunk, {}, {}};
    ResolveRemoteFrees(report.chunk, bitmap, /*final=*/release, /*lessee_died=*/false, &correction);
    const uint64_t base = ChunkBase(report.chunk);
    const uint32_t slot_size = ClassSize(c.size_class);
    for (auto it = pins_.lower_bound(base); it != pins_.end() && it->first < base + kChunkSize;
         ++it) {
      const uint32_t slot = static_cast<uint32_t>((it->first - base) / slot_size);
      if (!bitmap.IsAllocated(slot)) {
        bitmap.Set(slot);
        correction.kept_slots.push_back(slot);
      }
    }
    *c.bitmap = std::move(bitmap);
    MarkDirty(report.chunk);
    if (release) EndLease(report.chunk, /*lessee_died=*/false);
    if (!correction.freed_slots.empty() || !correction.kept_slots.empty()) {
      result.corrections.push_back(std::move(correction));
    }
  }
  auto state = clients_.find(client);
  if (state == clients_.end()) return result;
  // Chunks the client did not report are unchanged since its last report:
  // resolve their pending frees against that and tell the client.
  for (uint32_t chunk : state->second.leased) {
    Chunk& c = chunks_[chunk];
    if (c.remote_frees.empty() || seen.count(chunk) != 0) continue;
    LeaseCorrection correction{chunk, {}, {}};
    ResolveRemoteFrees(chunk, *c.bitmap, /*final=*/false, /*lessee_died=*/false, &correction);
    MarkDirty(chunk);
    if (!correction.freed_slots.empty()) result.corrections.push_back(std::move(correction));
  }
  result.rejected_frees = std::move(state->second.rejected_frees);
  state->second.rejected_frees.clear();
  return result;
}

void ChunkDirectory::EndLease(uint32_t chunk, bool lessee_died) {
  Chunk& c = chunks_[chunk];
  ResolveRemoteFrees(chunk, *c.bitmap, /*final=*/true, lessee_died, nullptr);
  clients_[c.lessee].leased.erase(chunk);
  c.lessee = 0;
  MarkDirty(chunk);
  Settle(chunk);
}

absl::StatusOr<uint64_t> ChunkDirectory::AllocateLarge(ClientId client, uint64_t size) {
  if (client == 0) return absl::InvalidArgumentError("client id 0 is reserved");
  if (size == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  const uint64_t length = (size + kChunkSize - 1) >> kChunkShift;
  if (length > chunks_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no free run of ", length, " chunks for ", size, " bytes"));
  }
  std::optional<uint32_t> head = free_.Take(static_cast<uint32_t>(length));
  if (!head) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no free run of ", length, " chunks for ", size, " bytes"));
  }
  Chunk& c = chunks_[*head];
  c.kind = ChunkKind::kLargeHead;
  c.run_chunks = static_cast<uint32_t>(length);
  c.uncommitted_by = client;
  for (uint32_t t = *head + 1; t < *head + length; ++t) {
    chunks_[t].kind = ChunkKind::kLargeTail;
    chunks_[t].head_chunk = *head;
  }
  clients_[client].uncommitted_runs.insert(*head);
  return ChunkBase(*head);
}

absl::StatusOr<LargePlacement> ChunkDirectory::Reserve(ClientId client, uint32_t min_chunks,
                                                       uint32_t max_chunks) {
  if (client == 0) return absl::InvalidArgumentError("client id 0 is reserved");
  if (min_chunks == 0 || max_chunks < min_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot reserve ", min_chunks, " to ", max_chunks, " chunks"));
  }
  const uint32_t chunks = std::min(free_.longest_run(), max_chunks);
  if (chunks < min_chunks) {
    return absl::ResourceExhaustedError(absl::StrCat("no free run of ", min_chunks, " chunks"));
  }
  const uint32_t first = *free_.Take(chunks);
  ClientState& state = clients_[client];
  for (uint32_t chunk = first; chunk < first + chunks; ++chunk) {
    chunks_[chunk].kind = ChunkKind::kReserved;
    chunks_[chunk].lessee = client;
    state.reserved.insert(chunk);
  }
  return LargePlacement{first, chunks};
}

bool ChunkDirectory::ReservedFor(ClientId client, const LargePlacement& run) const {
  for (uint64_t chunk = run.chunk; chunk < uint64_t{run.chunk} + run.chunks; ++chunk) {
    if (chunk >= chunks_.size() || chunks_[chunk].kind != ChunkKind::kReserved ||
        chunks_[chunk].lessee != client) {
      return false;
    }
  }
  return true;
}

absl::Status ChunkDirectory::CheckReserveReport(ClientId client,
                                                const ReserveReport& report) const {
  std::set<uint32_t> claimed;
  for (const LargePlacement& p : report.placed) {
    const uint64_t end = uint64_t{p.chunk} + p.chunks;
    if (p.chunks == 0 || end > chunks_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a large object of ", p.chunks,
                                                     " chunks at chunk ", p.chunk,
                                                     " does not fit the heap's ", chunks_.size()));
    }
    if (p.again) continue;  // see LargePlacement
    for (uint32_t chunk = p.chunk; chunk < end; ++chunk) {
      if (chunks_[chunk].kind != ChunkKind::kReserved || chunks_[chunk].lessee != client) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the large object at offset ", ChunkBase(p.chunk), " (", p.chunks,
            " chunks) takes chunk ", chunk, ", which is not reserved for client ", client));
      }
      if (!claimed.insert(chunk).second) {
        return absl::InvalidArgumentError(absl::StrCat("the large object at offset ",
                                                       ChunkBase(p.chunk),
                                                       " overlaps another at chunk ", chunk));
      }
    }
  }
  for (const LargePlacement& run : report.released) {
    const uint64_t end = uint64_t{run.chunk} + run.chunks;
    for (uint64_t chunk = run.chunk; chunk < end; ++chunk) {
      if (chunk >= chunks_.size() || chunks_[chunk].kind != ChunkKind::kReserved ||
          chunks_[chunk].lessee != client) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the released run at chunk ", run.chunk, " (", run.chunks, " chunks) takes chunk ",
            chunk, ", which is not reserved for client ", client));
      }
      if (!claimed.insert(static_cast<uint32_t>(chunk)).second) {
        return absl::InvalidArgumentError(absl::StrCat("the released run at chunk ", run.chunk,
                                                       " overlaps another at chunk ", chunk));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkDirectory::TellReserve(ClientId client, const ReserveReport& report) {
  if (absl::Status s = CheckReserveReport(client, report); !s.ok()) return s;
  ApplyReserveReport(client, report);
  return absl::OkStatus();
}

void ChunkDirectory::ApplyReserveReport(ClientId client, const ReserveReport& report) {
  // Placements sent again last: they take only what is still reserved.
  std::vector<LargePlacement> placed = report.placed;
  std::stable_partition(placed.begin(), placed.end(),
                        [](const LargePlacement& p) { return !p.again; });
  ClientState& state = clients_[client];
  for (const LargePlacement& run : report.released) {
    for (uint32_t chunk = run.chunk; chunk < run.chunk + run.chunks; ++chunk) {
      if (chunks_[chunk].kind != ChunkKind::kReserved || chunks_[chunk].lessee != client) continue;
      state.reserved.erase(chunk);
      if (auto queued = state.reserved_frees.find(chunk); queued != state.reserved_frees.end()) {
        RejectFree(
            queued->second.freer,
            absl::StrCat("the free of offset ", ChunkBase(chunk), " was rejected: client ", client,
                         " released its chunk unused (double free or never "
                         "allocated)"));
        state.reserved_frees.erase(queued);
      }
      MakeFree(chunk, 1, /*record=*/false);  // it was free on disk all along
    }
  }
  for (const LargePlacement& p : placed) {
    if (!ReservedFor(client, p)) continue;  // sent again, and placed before
    for (uint32_t chunk = p.chunk; chunk < p.chunk + p.chunks; ++chunk) {
      Chunk& c = chunks_[chunk];
      c.lessee = 0;
      c.kind = chunk == p.chunk ? ChunkKind::kLargeHead : ChunkKind::kLargeTail;
      c.head_chunk = p.chunk;
      state.reserved.erase(chunk);
      auto queued = state.reserved_frees.find(chunk);
      if (queued == state.reserved_frees.end()) continue;
      if (chunk != p.chunk) {
        RejectFree(queued->second.freer,
                   absl::StrCat("the free of offset ", ChunkBase(chunk),
                                " was rejected: it is inside the large object at offset ",
                                ChunkBase(p.chunk), ", not at its start"));
        state.reserved_frees.erase(queued);
      }
    }
    Chunk& head = chunks_[p.chunk];
    head.run_chunks = p.chunks;
    head.uncommitted_by = client;
    state.uncommitted_runs.insert(p.chunk);
    auto queued = state.reserved_frees.find(p.chunk);
    if (queued == state.reserved_frees.end()) continue;
    const ReservedFree free = queued->second;
    state.reserved_frees.erase(queued);
    if (free.chunks != 0 && free.chunks != p.chunks) {
      RejectFree(free.freer, absl::StrCat("the free of offset ", ChunkBase(p.chunk),
                                          " was rejected: it is a large object of ", p.chunks,
                                          " chunks, not of ", free.chunks));
      continue;
    }
    state.uncommitted_runs.erase(p.chunk);
    head.uncommitted_by = 0;
    MakeFree(p.chunk, p.chunks);
  }
}

void ChunkDirectory::SettleReservedFrees(ClientId client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  std::map<uint32_t, ReservedFree>& queued = it->second.reserved_frees;
  for (auto free = queued.begin(); free != queued.end();) {
    if (!free->second.seen) {
      free->second.seen = true;
      ++free;
      continue;
    }
    RejectFree(free->second.freer,
               absl::StrCat("the free of offset ", ChunkBase(free->first), " was rejected: client ",
                            client,
                            ", for which its chunk is reserved, placed no large object "
                            "there (double free or never allocated)"));
    free = queued.erase(free);
  }
}

absl::StatusOr<ChunkDirectory::PlannedFree> ChunkDirectory::PlanFree(ClientId client,
                                                                     ObjectRef object) const {
  const uint64_t offset = object.offset;
  const uint64_t chunk = offset >> kChunkShift;
  if (chunk >= chunks_.size()) return OutsideHeap(offset);
  const Chunk& c = chunks_[chunk];
  const uint64_t in_chunk = offset & (kChunkSize - 1);
  switch (c.kind) {
    case ChunkKind::kFree:
      return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is not allocated (chunk ",
                                                     chunk, " is free): double free?"));
    case ChunkKind::kReserved:
      // Only client c.lessee knows whether it carved an object here since
      // its last report: the free waits for it (see TellReserve).
      if (in_chunk != 0 || (object.size != 0 && object.size <= kMaxSmallSize)) {
        return absl::InvalidArgumentError(
            absl::StrCat("offset ", offset, " is not the start of an object: chunk ", chunk,
                         " is reserved for client ", c.lessee, "'s large objects"));
      }
      if (clients_.at(c.lessee).reserved_frees.count(static_cast<uint32_t>(chunk)) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("offset ", offset, " is freed already (its free waits for client ",
                         c.lessee, ", for which its chunk is reserved): double free"));
      }
      return PlannedFree{static_cast<uint32_t>(chunk), 0};
    case ChunkKind::kLargeTail:
      return absl::InvalidArgumentError(
          absl::StrCat("offset ", offset, " is inside the large object at offset ",
                       ChunkBase(c.head_chunk), ", not at its start"));
    case ChunkKind::kLargeHead:
      if (in_chunk != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("offset ", offset, " is inside the large object at offset ",
                         ChunkBase(static_cast<uint32_t>(chunk)), ", not at its start"));
      }
      if (object.size != 0 &&
          (object.size <= kMaxSmallSize || ChunksFor(object.size) != c.run_chunks)) {
        return absl::InvalidArgumentError(absl::StrCat("object at offset ", offset,
                                                       " is a large object of ", c.run_chunks,
                                                       " chunks, not of ", object.size, " bytes"));
      }
      break;
    case ChunkKind::kSmall: {
      const uint32_t slot_size = ClassSize(c.size_class);
      if (in_chunk % slot_size != 0 || in_chunk / slot_size >= c.bitmap->slot_count()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "offset ", offset, " is inside an object of ", slot_size, " bytes, not at its start"));
      }
      const uint32_t slot = static_cast<uint32_t>(in_chunk / slot_size);
      if (PendingFree(c, slot)) {
        return absl::InvalidArgumentError(
            absl::StrCat("offset ", offset, " is freed already (its free waits for client ",
                         c.lessee, ", which leases its chunk): double free"));
      }
      // In a leased chunk only the lessee knows whether the slot is live
      // now: the free is queued for its next report. That holds when the
      // freer is the lessee too: a client frees the objects of chunks it
      // does not lease through the daemon, in batches, and may lease such a
      // chunk (partly used, released by another) before its batch arrives.
      // Its pool has those slots live from the grant; applying the free
      // here instead would lose it at the lessee's next report and Settle()
      // a leased chunk (make it free or leasable to a second client).
      if (c.lessee == 0 && !c.bitmap->IsAllocated(slot)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "offset ", offset, " is not a live object: double free or never allocated"));
      }
      // A size said must fit the slot. It may be of a smaller class: an
      // allocation aligned beyond its size's class takes the first class
      // whose slots are aligned so (40 bytes at 32: the 64-byte class).
      if (object.size > slot_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "object at offset ", offset, " has ", slot_size, "-byte size class ",
            static_cast<int>(c.size_class), ": ", object.size, " bytes do not fit it"));
      }
      if (IsPinned(offset)) {
        return absl::FailedPreconditionError(
            absl::StrCat("object at offset ", offset, " is bound to a name; unbind it first"));
      }
      return PlannedFree{static_cast<uint32_t>(chunk), slot};
    }
  }
  // A large run is known to the daemon from its allocation on: a free by
  // any client, before or after its allocator's sync, is exact.
  if (IsPinned(offset)) {
    return absl::FailedPreconditionError(
        absl::StrCat("object at offset ", offset, " is bound to a name; unbind it first"));
  }
  return PlannedFree{static_cast<uint32_t>(chunk), 0};
}

absl::Status ChunkDirectory::CheckFree(ClientId client, absl::Span<const ObjectRef> objects) const {
  std::set<uint64_t> offsets;
  for (const ObjectRef& object : objects) {
    if (!offsets.insert(object.offset).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("offset ", object.offset, " appears twice in one free batch"));
    }
    if (absl::StatusOr<PlannedFree> planned = PlanFree(client, object); !planned.ok()) {
      return planned.status();
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkDirectory::Free(ClientId client, absl::Span<const ObjectRef> objects) {
  std::vector<PlannedFree> plan;
  plan.reserve(objects.size());
  std::set<uint64_t> offsets;
  for (const ObjectRef& object : objects) {
    if (!offsets.insert(object.offset).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("offset ", object.offset, " appears twice in one free batch"));
    }
    absl::StatusOr<PlannedFree> planned = PlanFree(client, object);
    if (!planned.ok()) return planned.status();
    plan.push_back(*planned);
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedFree& p = plan[i];
    Chunk& c = chunks_[p.chunk];
    if (c.kind == ChunkKind::kReserved) {
      const uint64_t size = objects[i].size;
      clients_[c.lessee].reserved_frees[p.chunk] =
          ReservedFree{size == 0 ? 0 : ChunksFor(size), client, false};
      clients_[client];  // where a rejection of this free will wait for it
    } else if (c.kind == ChunkKind::kLargeHead) {
      if (c.uncommitted_by != 0) {
        clients_[c.uncommitted_by].uncommitted_runs.erase(p.chunk);
        c.uncommitted_by = 0;
      }
      MakeFree(p.chunk, c.run_chunks);
    } else if (c.lessee != 0) {
      c.remote_frees.push_back(RemoteFree{p.slot, client, false});
      clients_[client];  // where a rejection of this free will wait for it
      MarkDirty(p.chunk);
    } else {
      c.bitmap->Free(p.slot);
      MarkDirty(p.chunk);
      Settle(p.chunk);
    }
  }
  return absl::OkStatus();
}

void ChunkDirectory::Commit(ClientId client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  for (uint32_t head : it->second.uncommitted_runs) {
    chunks_[head].uncommitted_by = 0;
    MarkDirty(head);
  }
  it->second.uncommitted_runs.clear();
}

ReclaimResult ChunkDirectory::Reclaim(ClientId client) { return EndClient(client, true); }

ReclaimResult ChunkDirectory::Release(ClientId client) { return EndClient(client, false); }

ReclaimResult ChunkDirectory::EndClient(ClientId client, bool died) {
  ReclaimResult result;
  auto it = clients_.find(client);
  if (it == clients_.end()) return result;
  const std::set<uint32_t> leased = it->second.leased;
  for (uint32_t chunk : leased) EndLease(chunk, /*lessee_died=*/died);
  result.leases = static_cast<uint32_t>(leased.size());
  for (uint32_t head : it->second.uncommitted_runs) {
    chunks_[head].uncommitted_by = 0;
    MakeFree(head, chunks_[head].run_chunks);
    ++result.large_runs;
  }
  for (uint32_t chunk : it->second.reserved) MakeFree(chunk, 1, /*record=*/false);
  if (!died) {
    for (const auto& [chunk, free] : it->second.reserved_frees) {
      RejectFree(free.freer, absl::StrCat("the free of offset ", ChunkBase(chunk),
                                          " was rejected: client ", client,
                                          " ended its session without a large object there (double "
                                          "free or never allocated)"));
    }
  }
  result.rejected_frees = std::move(clients_[client].rejected_frees);
  clients_.erase(client);
  return result;
}

absl::Status ChunkDirectory::Pin(ClientId caller, ObjectRef object) {
  const uint64_t offset = object.offset;
  const uint64_t chunk = offset >> kChunkShift;
  if (chunk >= chunks_.size()) return OutsideHeap(offset);
  Chunk& c = chunks_[chunk];
  const uint64_t in_chunk = offset & (kChunkSize - 1);
  if (c.kind == ChunkKind::kSmall) {
    const uint32_t slot_size = ClassSize(c.size_class);
    const uint32_t slot = static_cast<uint32_t>(in_chunk / slot_size);
    if (in_chunk % slot_size != 0 || slot >= c.bitmap->slot_count()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset ", offset, " is not the start of an object (slots of ", slot_size, " bytes)"));
    }
    if (object.size > slot_size) {
      return absl::InvalidArgumentError(absl::StrCat("object at offset ", offset, " has ",
                                                     slot_size, " bytes, less than ", object.size));
    }
    const bool remote_freed = PendingFree(c, slot);
    if (c.lessee == caller && caller != 0 && !remote_freed) {
      if (!c.bitmap->IsAllocated(slot)) {
        c.bitmap->Set(slot);  // the lessee allocated it since its last report
        MarkDirty(static_cast<uint32_t>(chunk));
      }
    } else if (!c.bitmap->IsAllocated(slot) || remote_freed) {
      return absl::FailedPreconditionError(
          absl::StrCat("offset ", offset, " is not a live object",
                       c.lessee != 0 ? " as of its allocator's last sync" : ""));
    }
  } else if (c.kind == ChunkKind::kLargeHead && in_chunk == 0) {
    if (object.size > uint64_t{c.run_chunks} * kChunkSize) {
      return absl::InvalidArgumentError(absl::StrCat("object at offset ", offset, " has ",
                                                     uint64_t{c.run_chunks} * kChunkSize,
                                                     " bytes, less than ", object.size));
    }
    if (c.uncommitted_by != 0) {
      if (c.uncommitted_by != caller) {
        return absl::FailedPreconditionError(absl::StrCat("large object at offset ", offset,
                                                          " is not committed yet by client ",
                                                          c.uncommitted_by));
      }
      clients_[caller].uncommitted_runs.erase(static_cast<uint32_t>(chunk));
      c.uncommitted_by = 0;
      MarkDirty(static_cast<uint32_t>(chunk));
    }
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("offset ", offset, " is not the start of a live object"));
  }
  ++pins_[offset];
  return absl::OkStatus();
}

void ChunkDirectory::Unpin(uint64_t offset) {
  auto it = pins_.find(offset);
  if (it != pins_.end() && --it->second == 0) pins_.erase(it);
}

ChunkRecord ChunkDirectory::Persisted(uint32_t chunk) const {
  const Chunk& c = chunks_[chunk];
  ChunkRecord record;
  record.chunk = chunk;
  if (c.kind == ChunkKind::kSmall) {
    record.kind = ChunkKind::kSmall;
    record.size_class = c.size_class;
    record.words = c.bitmap->words();
    for (const RemoteFree& pending : c.remote_frees) {
      record.words[pending.slot >> 6] &= ~(uint64_t{1} << (pending.slot & 63));
    }
  } else if (c.kind == ChunkKind::kLargeHead && c.uncommitted_by == 0) {
    record.kind = ChunkKind::kLargeHead;
    record.run_chunks = c.run_chunks;
  }
  return record;
}

std::vector<ChunkRecord> ChunkDirectory::TakeDirtyRecords() {
  std::vector<ChunkRecord> records;
  records.reserve(dirty_.size());
  std::sort(dirty_.begin(), dirty_.end());
  for (uint32_t chunk : dirty_) {
    records.push_back(Persisted(chunk));
    chunks_[chunk].dirty = false;
  }
  dirty_.clear();
  return records;
}

std::vector<ChunkRecord> ChunkDirectory::AllRecords() const {
  std::vector<ChunkRecord> records;
  for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    const ChunkKind kind = chunks_[chunk].kind;
    if (kind != ChunkKind::kSmall && kind != ChunkKind::kLargeHead) continue;
    ChunkRecord record = Persisted(chunk);
    if (record.kind != ChunkKind::kFree) records.push_back(std::move(record));
  }
  return records;
}

DirectoryStats ChunkDirectory::Stats() const {
  DirectoryStats stats;
  stats.capacity_chunks = capacity_chunks();
  stats.free_chunks = static_cast<uint32_t>(free_.free_chunks());
  for (const Chunk& c : chunks_) {
    switch (c.kind) {
      case ChunkKind::kSmall: {
        ++stats.small_chunks;
        if (c.lessee != 0) ++stats.leased_chunks;
        uint64_t live = c.bitmap->live();
        for (const RemoteFree& pending : c.remote_frees) {
          live -= c.bitmap->IsAllocated(pending.slot) ? 1 : 0;
        }
        stats.live_objects += live;
        stats.allocated_bytes += live * ClassSize(c.size_class);
        ++stats.by_class[c.size_class].chunks;
        stats.by_class[c.size_class].live_objects += live;
        break;
      }
      case ChunkKind::kReserved:
        ++stats.large_reserve_chunks;
        break;
      case ChunkKind::kLargeHead:
        ++stats.large_objects;
        ++stats.live_objects;
        stats.large_chunks += c.run_chunks;
        stats.allocated_bytes += uint64_t{c.run_chunks} * kChunkSize;
        break;
      default:
        break;
    }
  }
  return stats;
}

bool ChunkDirectory::LeasesSmall(ClientId client, uint32_t chunk) const {
  return chunk < chunks_.size() && chunks_[chunk].kind == ChunkKind::kSmall &&
         chunks_[chunk].lessee == client;
}

ClientId ChunkDirectory::LesseeOf(uint64_t offset) const {
  const uint64_t chunk = offset >> kChunkShift;
  if (chunk >= chunks_.size()) return 0;
  const Chunk& c = chunks_[chunk];
  if (c.kind == ChunkKind::kSmall || c.kind == ChunkKind::kReserved) return c.lessee;
  // A large object not yet committed goes with its allocating client.
  return c.kind == ChunkKind::kLargeHead ? c.uncommitted_by : 0;
}

uint32_t ChunkDirectory::FreeTailChunks() const {
  const std::map<uint32_t, uint32_t>& runs = free_.runs();
  if (runs.empty()) return 0;
  const auto& [start, length] = *runs.rbegin();
  return start + length == chunks_.size() ? length : 0;
}

uint32_t ChunkDirectory::IncarnationOf(uint64_t offset) const {
  const uint64_t chunk = offset >> kChunkShift;
  return chunk < chunks_.size() ? chunks_[chunk].incarnation : 0;
}

size_t ChunkDirectory::LeaseCount(ClientId client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.leased.size();
}

absl::Status ChunkDirectory::CheckInvariants() const {
  if (absl::Status s = free_.CheckInvariants(); !s.ok()) return s;
  uint64_t free_count = 0;
  for (uint32_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    const bool in_free = free_.IsFree(i, 1);
    if ((c.kind == ChunkKind::kFree) != in_free) {
      return absl::InternalError(absl::StrCat("chunk ", i, " kind and free runs disagree"));
    }
    if (c.kind == ChunkKind::kFree) ++free_count;
    if (c.kind == ChunkKind::kLargeHead) {
      for (uint32_t t = i + 1; t < i + c.run_chunks; ++t) {
        if (t >= chunks_.size() || chunks_[t].kind != ChunkKind::kLargeTail ||
            chunks_[t].head_chunk != i) {
          return absl::InternalError(
              absl::StrCat("large run at chunk ", i, " has a bad tail at ", t));
        }
      }
      if (c.uncommitted_by != 0 && (clients_.count(c.uncommitted_by) == 0 ||
                                    clients_.at(c.uncommitted_by).uncommitted_runs.count(i) == 0)) {
        return absl::InternalError(
            absl::StrCat("uncommitted run at chunk ", i, " is unknown to its client"));
      }
    }
    if (c.kind == ChunkKind::kReserved &&
        (clients_.count(c.lessee) == 0 || clients_.at(c.lessee).reserved.count(i) == 0)) {
      return absl::InternalError(absl::StrCat("reserved chunk ", i, " unknown to its client"));
    }
    if (c.kind == ChunkKind::kLargeTail) {
      const Chunk& head = chunks_[c.head_chunk];
      if (head.kind != ChunkKind::kLargeHead || c.head_chunk + head.run_chunks <= i) {
        return absl::InternalError(absl::StrCat("chunk ", i, " is an orphan tail"));
      }
    }
    if (c.kind == ChunkKind::kSmall) {
      if (absl::Status s = c.bitmap->CheckInvariants(); !s.ok()) {
        return absl::InternalError(absl::StrCat("chunk ", i, ": ", s.message()));
      }
      const bool leasable = leasable_[c.size_class].count(i) != 0;
      if (leasable != (c.lessee == 0 && !c.bitmap->full())) {
        return absl::InternalError(absl::StrCat("chunk ", i, " leasable set is wrong"));
      }
      if (c.lessee == 0 && c.bitmap->empty()) {
        return absl::InternalError(absl::StrCat("unleased chunk ", i, " is empty but not free"));
      }
      if (c.lessee != 0 &&
          (clients_.count(c.lessee) == 0 || clients_.at(c.lessee).leased.count(i) == 0)) {
        return absl::InternalError(absl::StrCat("lease of chunk ", i, " unknown to its client"));
      }
      if (c.lessee == 0 && !c.remote_frees.empty()) {
        return absl::InternalError(absl::StrCat("unleased chunk ", i, " has pending frees"));
      }
      std::set<uint32_t> distinct;
      for (const RemoteFree& pending : c.remote_frees) {
        if (!distinct.insert(pending.slot).second || pending.slot >= c.bitmap->slot_count()) {
          return absl::InternalError(
              absl::StrCat("chunk ", i, " has a repeated or stray pending free"));
        }
      }
    }
  }
  if (free_count != free_.free_chunks()) {
    return absl::InternalError("free chunk count and free runs disagree");
  }
  for (const auto& [client, state] : clients_) {
    for (uint32_t chunk : state.leased) {
      if (chunks_[chunk].kind != ChunkKind::kSmall || chunks_[chunk].lessee != client) {
        return absl::InternalError(
            absl::StrCat("client ", client, " holds a stale lease of chunk ", chunk));
      }
    }
    for (uint32_t chunk : state.reserved) {
      if (chunks_[chunk].kind != ChunkKind::kReserved || chunks_[chunk].lessee != client) {
        return absl::InternalError(
            absl::StrCat("client ", client, " holds a stale reservation of chunk ", chunk));
      }
    }
    for (const auto& [chunk, free] : state.reserved_frees) {
      if (state.reserved.count(chunk) == 0) {
        return absl::InternalError(
            absl::StrCat("client ", client, " has a free queued for unreserved chunk ", chunk));
      }
    }
  }
  for (const auto& [offset, count] : pins_) {
    const uint64_t chunk = offset >> kChunkShift;
    const Chunk& c = chunks_[chunk];
    const bool live_small =
        c.kind == ChunkKind::kSmall && (offset & (kChunkSize - 1)) % ClassSize(c.size_class) == 0 &&
        c.bitmap->IsAllocated(
            static_cast<uint32_t>((offset & (kChunkSize - 1)) / ClassSize(c.size_class)));
    const bool live_large = c.kind == ChunkKind::kLargeHead && (offset & (kChunkSize - 1)) == 0;
    if (!live_small && !live_large) {
      return absl::InternalError(absl::StrCat("pinned offset ", offset, " is not a live object"));
    }
  }
  return absl::OkStatus();
}

}  // namespace heapd
