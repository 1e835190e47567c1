// R-MAT edge generator (Chakrabarti et al.; Graph500 parameters a=0.57,
// b=0.19, c=0.19, d=0.05): deterministic for a seed, so every run and every
// process of a benchmark ingests the same graph.
#ifndef HEAPD_CLIENT_EXAMPLES_RMAT_H_
#define HEAPD_CLIENT_EXAMPLES_RMAT_H_

#include <cstdint>
#include <random>
#include <utility>

namespace heapd {

class RmatGenerator {
 public:
  RmatGenerator(int scale, uint64_t seed) : scale_(scale), random_(seed) {}

  // The next edge (source, destination), both below 2^scale.
  std::pair<uint64_t, uint64_t> Next() {
    uint64_t source = 0;
    uint64_t destination = 0;
    for (int bit = 0; bit < scale_; ++bit) {
      const double r = uniform_(random_);
      const uint64_t right = r >= kA + kB ? 1 : 0;                          // c or d
      const uint64_t down = (r >= kA && r < kA + kB) || r >= kA + kB + kC;  // b or d
      source = (source << 1) | right;
      destination = (destination << 1) | down;
    }
    return {source, destination};
  }

 private:
  static constexpr double kA = 0.57;
  static constexpr double kB = 0.19;
  static constexpr double kC = 0.19;

  int scale_;
  std::mt19937_64 random_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

}  // namespace heapd

#endif  // HEAPD_CLIENT_EXAMPLES_RMAT_H_
