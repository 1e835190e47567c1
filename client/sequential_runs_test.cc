#include "client/sequential_runs.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace heapd {
namespace {

// Faults of a sweep from `page` on, each taking what Ahead says: the pages
// taken ahead at each fault.
std::vector<uint64_t> Sweep(SequentialRuns& runs, uint64_t page, int faults) {
  std::vector<uint64_t> taken;
  for (int i = 0; i < faults; ++i) {
    const uint64_t ahead = runs.Ahead(page);
    runs.Took(page, ahead);
    taken.push_back(ahead);
    page += 1 + ahead;
  }
  return taken;
}

TEST(SequentialRunsTest, ASweepTakesDoublingRunsUpToTheMost) {
  SequentialRuns runs;
  EXPECT_EQ(Sweep(runs, 100, 9), (std::vector<uint64_t>{0, 1, 2, 4, 8, 16, 32, 64, 64}));
}

TEST(SequentialRunsTest, RandomFaultsTakeNothingAhead) {
  SequentialRuns runs;
  for (uint64_t page : {5, 900, 17, 4000, 23, 60, 950}) {
    EXPECT_EQ(runs.Ahead(page), 0u) << page;
    runs.Took(page, 0);
  }
}

// Fewer taken than offered (pages already unprotected): the stream goes on
// from the last page taken, and grows from what was taken.
TEST(SequentialRunsTest, TheStreamFollowsWhatWasTaken) {
  SequentialRuns runs;
  EXPECT_EQ(Sweep(runs, 0, 4), (std::vector<uint64_t>{0, 1, 2, 4}));  // next fault: page 11
  EXPECT_EQ(runs.Ahead(11), 8u);
  runs.Took(11, 3);
  EXPECT_EQ(runs.Ahead(15), 6u);
}

// Two threads sweeping their own halves, faulting in turn, each keep their
// stream.
TEST(SequentialRunsTest, InterleavedSweepsEachKeepTheirStream) {
  SequentialRuns runs;
  uint64_t a = 0, b = 1 << 20;
  std::vector<uint64_t> taken_a, taken_b;
  for (int i = 0; i < 6; ++i) {
    for (auto [page, taken] : {std::pair{&a, &taken_a}, std::pair{&b, &taken_b}}) {
      const uint64_t ahead = runs.Ahead(*page);
      runs.Took(*page, ahead);
      taken->push_back(ahead);
      *page += 1 + ahead;
    }
  }
  EXPECT_EQ(taken_a, (std::vector<uint64_t>{0, 1, 2, 4, 8, 16}));
  EXPECT_EQ(taken_b, taken_a);
}

}  // namespace
}  // namespace heapd
