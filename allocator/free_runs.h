// FreeRuns: the free chunks of a heap as maximal runs [start, start + length),
// indexed by start (to merge neighbours) and by length (best fit without
// scanning the heap).
//
// Invariants: runs never overlap or touch (touching runs are merged); both
// indexes hold the same runs; free_chunks() is the sum of their lengths.
#ifndef HEAPD_ALLOCATOR_FREE_RUNS_H_
#define HEAPD_ALLOCATOR_FREE_RUNS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"

namespace heapd {

class FreeRuns {
 public:
  // Takes `length` chunks from the shortest run that fits (lowest start
  // among equals) and returns the first chunk, or nullopt if no run fits.
  // REQUIRES: length > 0.
  std::optional<uint32_t> Take(uint32_t length);

  // Takes the specific run [start, start + length). REQUIRES: it is free.
  void TakeAt(uint32_t start, uint32_t length);

  // Returns [start, start + length) to the free runs.
  // REQUIRES: none of it is free already.
  void Give(uint32_t start, uint32_t length);

  // True when every chunk of [start, start + length) is free.
  bool IsFree(uint32_t start, uint32_t length) const;

  uint64_t free_chunks() const { return free_chunks_; }
  size_t run_count() const { return by_start_.size(); }
  uint32_t longest_run() const { return by_length_.empty() ? 0 : by_length_.rbegin()->first; }
  // Every run as (start, length), by start.
  const std::map<uint32_t, uint32_t>& runs() const { return by_start_; }

  absl::Status CheckInvariants() const;

 private:
  void Insert(uint32_t start, uint32_t length);
  void Erase(std::map<uint32_t, uint32_t>::iterator it);

  std::map<uint32_t, uint32_t> by_start_;              // start -> length
  std::set<std::pair<uint32_t, uint32_t>> by_length_;  // (length, start)
  uint64_t free_chunks_ = 0;
};

}  // namespace heapd

#endif  // HEAPD_ALLOCATOR_FREE_RUNS_H_
