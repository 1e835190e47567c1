#include "heap/fixed_address.h"

#include "gtest/gtest.h"

namespace heapd {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(FixedAddressTest, FirstHeapSitsAtTheWindowsStartAfterItsGuard) {
  absl::StatusOr<uint64_t> base = FindFixedBase({}, kGiB);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(*base, kFixedWindowBegin + kFixedGuardBytes);
  EXPECT_TRUE(ValidateFixedBase(*base, kGiB).ok());
}

TEST(FixedAddressTest, HeapsDoNotOverlapAndGapsAreReused) {
  const uint64_t first = *FindFixedBase({}, kGiB);
  const AddressRange a = FixedRangeOf(first, kGiB);
  const uint64_t second = *FindFixedBase({a}, 4 * kGiB);
  const AddressRange b = FixedRangeOf(second, 4 * kGiB);
  EXPECT_FALSE(a.Overlaps(b));
  EXPECT_EQ(b.begin, a.end);
  // The first heap removed: a smaller heap takes its place, a larger one
  // goes after the second.
  EXPECT_EQ(*FindFixedBase({b}, kGiB), first);
  EXPECT_EQ(FixedRangeOf(*FindFixedBase({b}, 2 * kGiB), 2 * kGiB).begin, b.end);
  // Order of the taken ranges does not matter.
  const uint64_t third = *FindFixedBase({b, a}, kGiB);
  EXPECT_EQ(FixedRangeOf(third, kGiB).begin, b.end);
}

TEST(FixedAddressTest, RunningOutOfTheWindowIsResourceExhausted) {
  const uint64_t window = kFixedWindowEnd - kFixedWindowBegin;
  const uint64_t big = window / 2 - kFixedGuardBytes;  // two fit exactly
  const uint64_t first = *FindFixedBase({}, big);
  const uint64_t second = *FindFixedBase({FixedRangeOf(first, big)}, big);
  EXPECT_EQ(FixedRangeOf(second, big).end, kFixedWindowEnd);
  absl::StatusOr<uint64_t> third =
      FindFixedBase({FixedRangeOf(first, big), FixedRangeOf(second, big)}, 2 * 1024 * 1024);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("2 fixed-address heaps"), std::string::npos)
      << third.status();
  EXPECT_EQ(FindFixedBase({}, window).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(FixedAddressTest, RecordedBasesOutsideTheWindowAreRefused) {
  EXPECT_FALSE(ValidateFixedBase(0x555555554000, kGiB).ok());     // where PIE binaries go
  EXPECT_FALSE(ValidateFixedBase(0x7fff8000, kGiB).ok());         // ASan's shadow
  EXPECT_FALSE(ValidateFixedBase(kFixedWindowBegin, kGiB).ok());  // no room for its guard
  EXPECT_FALSE(ValidateFixedBase(kFixedWindowBegin + kFixedGuardBytes + 4096, kGiB).ok());
  EXPECT_FALSE(ValidateFixedBase(kFixedWindowEnd - kGiB + kFixedGuardBytes, kGiB).ok());
  EXPECT_TRUE(ValidateFixedBase(kFixedWindowEnd - kGiB, kGiB).ok());
  EXPECT_FALSE(ValidateFixedBase(kFixedWindowEnd - kGiB, UINT64_MAX).ok());  // no wrap
}

}  // namespace
}  // namespace heapd
