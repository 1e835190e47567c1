#include "heap/pending_syncs.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace heapd {

void PendingSyncs::Stage(ClientId client, absl::Span<const LeaseReport> reports) {
  std::map<uint32_t, LeaseReport>& staged = staged_[client];
  for (const LeaseReport& report : reports) staged[report.chunk] = report;
}

std::vector<LeaseReport> PendingSyncs::TakeStaged(ClientId client,
                                                  absl::Span<const LeaseReport> last) {
  std::vector<LeaseReport> all(last.begin(), last.end());
  auto staged = staged_.find(client);
  if (staged == staged_.end()) return all;
  std::set<uint32_t> in_last;
  for (const LeaseReport& report : last) in_last.insert(report.chunk);
  for (auto& [chunk, report] : staged->second) {
    if (in_last.count(chunk) == 0) all.push_back(std::move(report));
  }
  staged_.erase(staged);
  return all;
}

absl::Status PendingSyncs::DeferFrees(const ChunkDirectory& directory, ClientId client,
                                      absl::Span<const ObjectRef> objects) {
  std::map<uint64_t, DeferredFree>& deferred = deferred_[client];
  for (const ObjectRef& object : objects) {
    if (deferred.count(object.offset) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offset ", object.offset, " is freed twice by this session since its last sync"));
    }
  }
  for (const ObjectRef& object : objects) {
    deferred[object.offset] = DeferredFree{object, directory.LesseeOf(object.offset),
                                           directory.IncarnationOf(object.offset)};
  }
  return absl::OkStatus();
}

void PendingSyncs::ApplyFrees(ChunkDirectory& directory, ClientId client,
                              std::vector<std::string>* rejected) {
  auto it = deferred_.find(client);
  if (it == deferred_.end()) return;
  std::vector<ObjectRef> objects;
  for (const auto& [offset, deferred] : it->second) {
    // Its chunk became free since (the object it named was freed by
    // another, or died with its session) and may hold another now.
    if (directory.IncarnationOf(offset) != deferred.incarnation) {
      rejected->push_back(absl::StrCat("the free of offset ", offset,
                                       " was rejected: its object was gone before this session's "
                                       "sync applied the free (double free?)"));
      continue;
    }
    objects.push_back(deferred.object);
  }
  deferred_.erase(it);
  if (directory.Free(client, objects).ok()) return;
  // One of them went bad meanwhile (another session freed it first: a
  // double free). The rest still go.
  for (const ObjectRef& object : objects) {
    absl::Status s = directory.Free(client, absl::MakeConstSpan(&object, 1));
    if (!s.ok()) rejected->push_back(std::string(s.message()));
  }
}

void PendingSyncs::SettleFrees(const ChunkDirectory& directory, ClientId lessee, bool lessee_died) {
  for (auto& [freer, frees] : deferred_) {
    for (auto it = frees.begin(); it != frees.end();) {
      DeferredFree& deferred = it->second;
      if (deferred.lessee != lessee) {
        ++it;
        continue;
      }
      deferred.lessee = 0;
      // Its chunk is back at the lessee's last report: an object not live
      // there was allocated after it and died with the lessee.
      if (lessee_died &&
          !directory.CheckFree(freer, absl::MakeConstSpan(&deferred.object, 1)).ok()) {
        it = frees.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void PendingSyncs::Drop(ClientId client) {
  staged_.erase(client);
  deferred_.erase(client);
}

size_t PendingSyncs::StagedCount(ClientId client) const {
  auto it = staged_.find(client);
  return it == staged_.end() ? 0 : it->second.size();
}

size_t PendingSyncs::DeferredCount(ClientId client) const {
  auto it = deferred_.find(client);
  return it == deferred_.end() ? 0 : it->second.size();
}

}  // namespace heapd
