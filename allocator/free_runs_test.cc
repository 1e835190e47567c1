#include "allocator/free_runs.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace heapd {
namespace {

TEST(FreeRunsTest, TakesBestFitAndMergesOnGive) {
  FreeRuns runs;
  runs.Give(0, 10);
  runs.Give(20, 3);
  EXPECT_EQ(runs.run_count(), 2u);
  EXPECT_EQ(runs.Take(3), std::optional<uint32_t>(20));  // exact fit beats lower
  EXPECT_EQ(runs.Take(4), std::optional<uint32_t>(0));
  EXPECT_EQ(runs.Take(7), std::nullopt);
  EXPECT_EQ(runs.free_chunks(), 6u);
  runs.Give(0, 4);    // merges with [4, 10)
  runs.Give(10, 10);  // merges both sides
  runs.Give(20, 3);
  EXPECT_EQ(runs.run_count(), 1u);
  EXPECT_EQ(runs.longest_run(), 23u);
  EXPECT_TRUE(runs.CheckInvariants().ok());
}

TEST(FreeRunsTest, TakeAtSplitsARun) {
  FreeRuns runs;
  runs.Give(0, 100);
  runs.TakeAt(40, 20);
  EXPECT_TRUE(runs.IsFree(0, 40));
  EXPECT_FALSE(runs.IsFree(39, 2));
  EXPECT_TRUE(runs.IsFree(60, 40));
  EXPECT_FALSE(runs.IsFree(60, 41));
  EXPECT_EQ(runs.free_chunks(), 80u);
  EXPECT_TRUE(runs.CheckInvariants().ok());
}

TEST(FreeRunsTest, RandomTakesAndGivesMatchAnArray) {
  constexpr uint32_t kChunks = 512;
  std::vector<bool> used(kChunks, false);
  std::vector<std::pair<uint32_t, uint32_t>> taken;
  FreeRuns runs;
  runs.Give(0, kChunks);
  std::mt19937 rng(7);
  for (int op = 0; op < 20000; ++op) {
    if (taken.empty() || rng() % 2 == 0) {
      const uint32_t length = 1 + rng() % 8;
      std::optional<uint32_t> start = runs.Take(length);
      // Best fit exists iff some gap of at least `length` exists.
      uint32_t best = 0;
      for (uint32_t i = 0, gap = 0; i <= kChunks; ++i) {
        if (i < kChunks && !used[i]) {
          ++gap;
        } else {
          best = std::max(best, gap);
          gap = 0;
        }
      }
      ASSERT_EQ(start.has_value(), best >= length);
      if (!start) continue;
      for (uint32_t i = *start; i < *start + length; ++i) {
        ASSERT_FALSE(used[i]);
        used[i] = true;
      }
      taken.emplace_back(*start, length);
    } else {
      const size_t k = rng() % taken.size();
      runs.Give(taken[k].first, taken[k].second);
      for (uint32_t i = taken[k].first; i < taken[k].first + taken[k].second; ++i) used[i] = false;
      taken.erase(taken.begin() + k);
    }
    ASSERT_TRUE(runs.CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace heapd
