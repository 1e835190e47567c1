#include "allocator/large_reserve.h"

#include <algorithm>
#include <cstdint>

namespace heapd {

bool LargeReserve::Add(uint32_t first, uint32_t chunks) {
  const uint64_t end = uint64_t{first} + chunks;
  if (chunks == 0 || end > uint64_t{UINT32_MAX} + 1) return false;
  for (uint64_t chunk = first; chunk < end; ++chunk) {
    if (Holds(static_cast<uint32_t>(chunk))) return false;
  }
  // heapd reserves only free chunks: a placement to send again that lies
  // here was placed by the sync that failed and freed since.
  resend_.erase(std::remove_if(resend_.begin(), resend_.end(),
                               [&](const LargePlacement& p) {
                                 return p.chunk < end && uint64_t{p.chunk} + p.chunks > first;
                               }),
                resend_.end());
  free_.Give(first, chunks);
  return true;
}

std::optional<uint32_t> LargeReserve::Carve(uint32_t chunks) {
  std::optional<uint32_t> first = free_.Take(chunks);
  if (first) untold_[*first] = chunks;
  return first;
}

bool LargeReserve::FreeUntold(uint32_t chunk) {
  auto it = untold_.find(chunk);
  if (it == untold_.end()) return false;
  free_.Give(it->first, it->second);
  untold_.erase(it);
  return true;
}

bool LargeReserve::Holds(uint32_t chunk) const {
  if (free_.IsFree(chunk, 1)) return true;
  auto it = untold_.upper_bound(chunk);
  return it != untold_.begin() && chunk < std::prev(it)->first + std::prev(it)->second;
}

bool LargeReserve::NotYetTold(uint32_t chunk) const {
  auto starts_here = [chunk](const LargePlacement& p) { return p.chunk == chunk; };
  return untold_.count(chunk) != 0 ||
         std::any_of(in_flight_.begin(), in_flight_.end(), starts_here) ||
         std::any_of(resend_.begin(), resend_.end(), starts_here);
}

std::vector<LargePlacement> LargeReserve::TakeForSync() {
  in_flight_ = std::move(resend_);
  resend_.clear();
  for (LargePlacement& p : in_flight_) p.again = true;
  for (const auto& [first, chunks] : untold_) in_flight_.push_back({first, chunks});
  untold_.clear();
  return in_flight_;
}

std::vector<LargePlacement> LargeReserve::TakeFreeRuns(size_t most) {
  std::vector<LargePlacement> runs;
  for (const auto& [first, chunks] : free_.runs()) {
    if (runs.size() == most) break;
    runs.push_back({first, chunks});
  }
  for (const LargePlacement& run : runs) free_.TakeAt(run.chunk, run.chunks);
  return runs;
}

void LargeReserve::SyncFailed() {
  resend_.insert(resend_.end(), in_flight_.begin(), in_flight_.end());
  in_flight_.clear();
}

}  // namespace heapd
