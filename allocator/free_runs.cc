#include "allocator/free_runs.h"

#include <cassert>

#include "absl/strings/str_cat.h"

namespace heapd {

void FreeRuns::Insert(uint32_t start, uint32_t length) {
  by_start_.emplace(start, length);
  by_length_.emplace(length, start);
  free_chunks_ += length;
}

void FreeRuns::Erase(std::map<uint32_t, uint32_t>::iterator it) {
  by_length_.erase({it->second, it->first});
  free_chunks_ -= it->second;
  by_start_.erase(it);
}

std::optional<uint32_t> FreeRuns::Take(uint32_t length) {
  auto fit = by_length_.lower_bound({length, 0});
  if (fit == by_length_.end()) return std::nullopt;
  const uint32_t start = fit->second;
  TakeAt(start, length);
  return start;
}

void FreeRuns::TakeAt(uint32_t start, uint32_t length) {
  auto it = by_start_.upper_bound(start);
  assert(it != by_start_.begin());
  --it;
  const uint32_t run_start = it->first;
  const uint32_t run_end = it->first + it->second;
  assert(start + length <= run_end);
  Erase(it);
  if (run_start < start) Insert(run_start, start - run_start);
  if (start + length < run_end) Insert(start + length, run_end - start - length);
}

void FreeRuns::Give(uint32_t start, uint32_t length) {
  uint32_t begin = start;
  uint32_t end = start + length;
  auto next = by_start_.lower_bound(start);
  if (next != by_start_.end() && next->first == end) {
    end += next->second;
    Erase(next);
  }
  auto after = by_start_.lower_bound(start);
  if (after != by_start_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      Erase(prev);
    }
  }
  Insert(begin, end - begin);
}

bool FreeRuns::IsFree(uint32_t start, uint32_t length) const {
  auto it = by_start_.upper_bound(start);
  if (it == by_start_.begin()) return false;
  --it;
  return uint64_t{start} + length <= uint64_t{it->first} + it->second;
}

absl::Status FreeRuns::CheckInvariants() const {
  if (by_start_.size() != by_length_.size()) {
    return absl::InternalError("free run indexes differ in size");
  }
  uint64_t total = 0;
  uint64_t previous_end = 0;
  bool first = true;
  for (const auto& [start, length] : by_start_) {
    if (length == 0) return absl::InternalError(absl::StrCat("empty free run at ", start));
    if (!first && start <= previous_end) {
      return absl::InternalError(
          absl::StrCat("free run at chunk ", start, " overlaps or touches the previous one"));
    }
    if (by_length_.count({length, start}) == 0) {
      return absl::InternalError(
          absl::StrCat("free run at ", start, " is missing from the length index"));
    }
    first = false;
    previous_end = uint64_t{start} + length;
    total += length;
  }
  if (total != free_chunks_) {
    return absl::InternalError(
        absl::StrCat("free runs hold ", total, " chunks but count ", free_chunks_));
  }
  return absl::OkStatus();
}

}  // namespace heapd
