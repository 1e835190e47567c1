// What tests/power_loss_test's writer (heap_worker append) puts in a heap:
// object I of PowerLossSize(I) bytes, word K holding PowerLossStamp(I, K).
#ifndef HEAPD_TESTS_POWER_LOSS_MODEL_H_
#define HEAPD_TESTS_POWER_LOSS_MODEL_H_

#include <cstdint>

namespace heapd {

// Small objects mostly, a large one (above 1 MiB) every seventh.
inline uint64_t PowerLossSize(uint64_t i) {
  if (i % 7 == 6) return (uint64_t{3} << 20) / 2 + 8 * i;
  return 8 * (1 + (i * 37) % 512);
}

inline uint64_t PowerLossStamp(uint64_t i, uint64_t k) { return (i << 32) ^ (k * 0x9E3779B9u); }

}  // namespace heapd

#endif  // HEAPD_TESTS_POWER_LOSS_MODEL_H_
