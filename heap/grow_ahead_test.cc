#include "heap/grow_ahead.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace heapd {
namespace {

// Waits up to 10 s for `done`.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(10));
  return done();
}

TEST(GrowAheadTest, GrowsOncePerRequestWhileDueAndNeverWhenNot) {
  std::atomic<uint32_t> capacity{16};
  std::atomic<bool> due{true};
  std::atomic<int> growths{0};
  GrowAhead ahead(
      [&]() -> std::optional<uint32_t> {
        if (!due) return std::nullopt;
        return capacity.load();
      },
      [&](uint32_t seen) {
        EXPECT_EQ(seen, capacity.load());
        capacity += 4;
        ++growths;
        return absl::OkStatus();
      });
  EXPECT_EQ(growths, 0) << "nothing grows before a request";
  ahead.Request();
  ASSERT_TRUE(Eventually([&] { return growths == 1; }));
  ahead.Request();
  ASSERT_TRUE(Eventually([&] { return growths == 2; }));
  due = false;
  ahead.Request();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(growths, 2) << "grew though no growth was due";
}

TEST(GrowAheadTest, AfterAFailureTheSameCapacityWaitsForTheBackOff) {
  std::atomic<uint32_t> capacity{16};
  std::atomic<int> attempts{0};
  GrowAhead ahead([&]() -> std::optional<uint32_t> { return capacity.load(); },
                  [&](uint32_t) {
                    ++attempts;
                    return absl::ResourceExhaustedError("disk full");
                  },
                  absl::Milliseconds(300));
  ahead.Request();
  ASSERT_TRUE(Eventually([&] { return attempts == 1; }));
  ahead.Request();  // within the back-off, same capacity: not tried
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(attempts, 1);
  capacity = 20;  // a lease grew the heap: a new capacity is tried at once
  ahead.Request();
  ASSERT_TRUE(Eventually([&] { return attempts == 2; }));
  absl::SleepFor(absl::Milliseconds(400));  // past the back-off
  ahead.Request();
  ASSERT_TRUE(Eventually([&] { return attempts == 3; }));
}

TEST(GrowAheadTest, StopWaitsForAGrowthUnderWayAndLaterRequestsDoNothing) {
  absl::Notification growing;
  absl::Notification release;
  std::atomic<bool> finished{false};
  std::atomic<int> growths{0};
  GrowAhead ahead([]() -> std::optional<uint32_t> { return 1; },
                  [&](uint32_t) {
                    ++growths;
                    growing.Notify();
                    release.WaitForNotification();
                    finished = true;
                    return absl::OkStatus();
                  });
  ahead.Request();
  growing.WaitForNotification();
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    ahead.Stop();
    stopped = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(stopped) << "Stop returned during a growth";
  release.Notify();
  stopper.join();
  EXPECT_TRUE(finished) << "Stop returned before the growth under way ended";
  ahead.Request();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(growths, 1);
}

}  // namespace
}  // namespace heapd
