// SequentialRuns: how many pages after a faulting one the write tracker
// (write_tracker.h) takes with it, for programs that store through memory
// in order (updating an array in place, a solver's sweep): each page then
// costs a 4 KiB copy instead of a write-protect fault's round trip.
//
// A few streams are followed at once (threads sweeping their own parts).
// A fault at the page a stream expects next extends it: the pages taken
// ahead double each time, up to kMaxAhead; any other fault starts a
// stream (nothing taken ahead), replacing the one unused longest. A
// program storing at random takes nothing ahead.
//
// Used by the tracker's thread only.
#ifndef HEAPD_CLIENT_SEQUENTIAL_RUNS_H_
#define HEAPD_CLIENT_SEQUENTIAL_RUNS_H_

#include <array>
#include <cstdint>

namespace heapd {

class SequentialRuns {
 public:
  static constexpr uint64_t kMaxAhead = 64;  // pages: 256 KiB

  // A store faulted at page number `page`: the pages after it to take with
  // it (0 .. kMaxAhead). The caller takes at most that many, and says how
  // many it took with Took (fewer where the pages were not protected).
  uint64_t Ahead(uint64_t page);
  void Took(uint64_t page, uint64_t ahead);

 private:
  struct Stream {
    uint64_t next = UINT64_MAX;  // the page a fault would come at next
    uint64_t ahead = 0;          // pages taken ahead at its last fault
    uint64_t used = 0;           // when it was last extended (a counter)
  };
  std::array<Stream, 8> streams_;
  uint64_t clock_ = 0;
  Stream* current_ = nullptr;  // the stream of the last Ahead
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_SEQUENTIAL_RUNS_H_
