#include "allocator/size_class.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

TEST(SizeClassTest, ClassesAreIncreasingMultiplesOfEight) {
  EXPECT_EQ(ClassSize(0), 8u);
  EXPECT_EQ(ClassSize(kNumSizeClasses - 1), kMaxSmallSize);
  for (uint32_t c = 1; c < kNumSizeClasses; ++c) {
    EXPECT_GT(ClassSize(c), ClassSize(c - 1)) << c;
    EXPECT_EQ(ClassSize(c) % 8, 0u) << c;
  }
}

TEST(SizeClassTest, EverySizeMapsToTheSmallestFittingClass) {
  for (uint64_t size = 1; size <= kMaxSmallSize; ++size) {
    const uint32_t c = SizeClassFor(size);
    ASSERT_LT(c, kNumSizeClasses) << size;
    ASSERT_GE(ClassSize(c), size) << size;
    if (c > 0) {
      ASSERT_LT(ClassSize(c - 1), size) << size;
    }
  }
}

TEST(SizeClassTest, InternalFragmentationIsBounded) {
  for (uint64_t size = 1; size <= kMaxSmallSize; ++size) {
    const uint64_t waste = ClassSize(SizeClassFor(size)) - size;
    if (size >= 32) {
      ASSERT_LT(waste * 4, ClassSize(SizeClassFor(size))) << size;
    } else {
      ASSERT_LE(waste, 7u) << size;
    }
  }
}

TEST(SizeClassTest, AboutFourClassesPerDoubling) {
  uint32_t classes_in_64_to_128 = 0;
  for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
    if (ClassSize(c) > 64 && ClassSize(c) <= 128) ++classes_in_64_to_128;
  }
  EXPECT_EQ(classes_in_64_to_128, 4u);
}

TEST(SizeClassTest, SlotIndexIsExactDivisionForEveryOffset) {
  for (uint32_t c = 0; c < kNumSizeClasses; ++c) {
    const uint32_t size = ClassSize(c);
    EXPECT_EQ(SlotsPerChunk(c), kChunkSize / size);
    for (uint64_t off = 0; off < kChunkSize; ++off) {
      if (SlotIndex(c, off) != off / size) {
        FAIL() << "class " << c << " offset " << off;
      }
    }
  }
}

}  // namespace
}  // namespace heapd
