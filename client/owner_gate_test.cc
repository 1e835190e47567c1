#include "client/owner_gate.h"

#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace heapd {
namespace {

// A plain counter incremented by the owner and by visitors: any overlap of
// two increments loses one, so the total tells whether the gate excluded.
TEST(OwnerGateTest, OwnerAndVisitorsNeverOverlap) {
  OwnerGate gate;
  volatile uint64_t counter = 0;
  constexpr uint64_t kOwnerRounds = 3'000'000;
  constexpr uint64_t kVisits = 3'000;
  std::thread owner([&] {
    for (uint64_t i = 0; i < kOwnerRounds; ++i) {
      OwnerScope inside(gate);
      counter = counter + 1;
    }
  });
  std::vector<std::thread> visitors;
  for (int v = 0; v < 2; ++v) {
    visitors.emplace_back([&] {
      for (uint64_t i = 0; i < kVisits; ++i) {
        VisitorScope visit(gate);
        const uint64_t seen = counter;
        for (int spin = 0; spin < 50; ++spin) counter = counter + 0;  // widen the window
        counter = seen + 1;
      }
    });
  }
  owner.join();
  for (std::thread& visitor : visitors) visitor.join();
  EXPECT_EQ(counter, kOwnerRounds + 2 * kVisits);
}

}  // namespace
}  // namespace heapd
