#include "allocator/slot_bitmap.h"

#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace heapd {
namespace {

TEST(SlotBitmapTest, AllocatesLowestFreeSlotUntilFull) {
  SlotBitmap bitmap(130);  // two full words and a padded third
  for (int64_t i = 0; i < 130; ++i) ASSERT_EQ(bitmap.AllocateLowest(), i);
  EXPECT_TRUE(bitmap.full());
  EXPECT_EQ(bitmap.AllocateLowest(), -1);
  EXPECT_TRUE(bitmap.CheckInvariants().ok());
}

TEST(SlotBitmapTest, FreedSlotIsReusedFirst) {
  SlotBitmap bitmap(1000);
  for (int i = 0; i < 1000; ++i) bitmap.AllocateLowest();
  bitmap.Free(777);
  bitmap.Free(3);
  EXPECT_EQ(bitmap.live(), 998u);
  EXPECT_EQ(bitmap.AllocateLowest(), 3);
  EXPECT_EQ(bitmap.AllocateLowest(), 777);
  EXPECT_EQ(bitmap.AllocateLowest(), -1);
  EXPECT_TRUE(bitmap.CheckInvariants().ok());
}

// A fresh chunk's words have their padding bits set: it is still empty.
TEST(SlotBitmapTest, NoneAllocatedIgnoresPadding) {
  SlotBitmap bitmap(100);  // 2 words, 28 padding bits
  EXPECT_NE(bitmap.words()[1], 0u);
  EXPECT_TRUE(SlotBitmap::NoneAllocated(100, bitmap.words()));
  ASSERT_EQ(bitmap.AllocateLowest(), 0);
  EXPECT_FALSE(SlotBitmap::NoneAllocated(100, bitmap.words()));
  SlotBitmap last(100);
  for (int i = 0; i < 100; ++i) last.AllocateLowest();
  for (uint32_t slot = 0; slot < 99; ++slot) last.Free(slot);
  EXPECT_FALSE(SlotBitmap::NoneAllocated(100, last.words()));  // slot 99, in word 1
  EXPECT_TRUE(SlotBitmap::NoneAllocated(128, std::vector<uint64_t>{0, 0}));
}

TEST(SlotBitmapTest, WordsRoundTripAndPaddingIsForced) {
  SlotBitmap bitmap(70);
  bitmap.AllocateLowest();
  bitmap.Set(69);
  std::vector<uint64_t> words = bitmap.words();
  words[1] &= 0x3F;  // a client that cleared padding bits
  absl::StatusOr<SlotBitmap> loaded = SlotBitmap::FromWords(70, words);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->live(), 2u);
  EXPECT_TRUE(loaded->IsAllocated(0));
  EXPECT_TRUE(loaded->IsAllocated(69));
  EXPECT_TRUE(loaded->CheckInvariants().ok());
  EXPECT_EQ(loaded->words(), bitmap.words());
}

TEST(SlotBitmapTest, FromWordsRejectsWrongLength) {
  std::vector<uint64_t> words(3, 0);
  absl::StatusOr<SlotBitmap> loaded = SlotBitmap::FromWords(64, words);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("3 words"), std::string::npos);
}

TEST(SlotBitmapTest, RandomOperationsMatchASet) {
  std::mt19937_64 rng(42);
  for (uint32_t slots : {1u, 63u, 64u, 65u, 4096u, 26214u, 262144u}) {
    SlotBitmap bitmap(slots);
    std::set<uint32_t> live;
    for (int op = 0; op < 20000; ++op) {
      if (live.empty() || (rng() % 3 != 0 && live.size() < slots)) {
        const int64_t slot = bitmap.AllocateLowest();
        ASSERT_GE(slot, 0);
        // The lowest free slot is the first gap in `live`.
        uint32_t expected = 0;
        for (uint32_t s : live) {
          if (s != expected) break;
          ++expected;
        }
        ASSERT_EQ(static_cast<uint32_t>(slot), expected);
        live.insert(static_cast<uint32_t>(slot));
      } else {
        auto it = live.begin();
        std::advance(it, rng() % std::min<size_t>(live.size(), 64));
        bitmap.Free(*it);
        live.erase(it);
      }
      ASSERT_EQ(bitmap.live(), live.size());
    }
    ASSERT_TRUE(bitmap.CheckInvariants().ok()) << slots;
  }
}

}  // namespace
}  // namespace heapd
