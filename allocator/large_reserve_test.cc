#include "allocator/large_reserve.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

TEST(LargeReserveTest, CarvesBestFitAndTakesUntoldFreesBack) {
  LargeReserve reserve;
  EXPECT_FALSE(reserve.Carve(1).has_value());
  ASSERT_TRUE(reserve.Add(10, 4));
  ASSERT_TRUE(reserve.Add(20, 1));
  EXPECT_EQ(reserve.Carve(1), 20u);  // the run that fits best
  EXPECT_EQ(reserve.Carve(3), 10u);
  EXPECT_FALSE(reserve.Carve(2).has_value());
  EXPECT_EQ(reserve.UntoldChunks(10), 3u);
  EXPECT_EQ(reserve.UntoldChunks(11), 0u);
  EXPECT_TRUE(reserve.Holds(12));   // inside the object at 10
  EXPECT_FALSE(reserve.Holds(14));  // never reserved
  EXPECT_TRUE(reserve.Holds(20));   // an untold object

  EXPECT_FALSE(reserve.FreeUntold(11));  // not the start of an object
  EXPECT_TRUE(reserve.FreeUntold(10));
  EXPECT_FALSE(reserve.FreeUntold(10));  // a second free is heapd's to judge
  EXPECT_EQ(reserve.free_chunks(), 4u);
  EXPECT_EQ(reserve.Carve(4), 10u);
  EXPECT_TRUE(reserve.Add(30, 2));
  EXPECT_TRUE(reserve.Add(40, 3));
  EXPECT_FALSE(reserve.Add(41, 4));  // overlaps a reserved run
  EXPECT_FALSE(reserve.Add(10, 1));  // an untold object
  std::vector<LargePlacement> runs = reserve.TakeFreeRuns(1);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].chunk, 30u);
  EXPECT_EQ(runs[0].chunks, 2u);
  EXPECT_EQ(reserve.TakeFreeRuns(5).size(), 1u);
  EXPECT_EQ(reserve.free_chunks(), 0u);
  EXPECT_FALSE(reserve.Carve(1).has_value());
}

TEST(LargeReserveTest, PlacementsOfAFailedSyncAreSentAgainAndNeverFreedLocally) {
  LargeReserve reserve;
  ASSERT_TRUE(reserve.Add(0, 8));
  const uint32_t a = *reserve.Carve(2);
  const uint32_t b = *reserve.Carve(1);
  std::vector<LargePlacement> first = reserve.TakeForSync();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_FALSE(reserve.FreeUntold(a));  // in flight: heapd frees it
  EXPECT_TRUE(reserve.NotYetTold(a));
  reserve.SyncFailed();
  EXPECT_TRUE(reserve.NotYetTold(a));
  const uint32_t c = *reserve.Carve(1);
  std::vector<LargePlacement> second = reserve.TakeForSync();
  ASSERT_EQ(second.size(), 3u);
  EXPECT_EQ(second[0].chunk, a);
  EXPECT_EQ(second[0].chunks, 2u);
  EXPECT_EQ(second[1].chunk, b);
  EXPECT_EQ(second[2].chunk, c);
  EXPECT_FALSE(reserve.FreeUntold(b));
  reserve.SyncDone();
  EXPECT_FALSE(reserve.NotYetTold(a));
  EXPECT_TRUE(reserve.TakeForSync().empty());
}

}  // namespace
}  // namespace heapd
