// What every heapd fuzzer (a *_fuzz.cc, see tools/fuzz/fuzz.bzl) defines
// besides LLVMFuzzerTestOneInput: seed inputs made by the real encoders.
//
// The replay driver runs them on every ordinary `bazel test`, so the seeds
// keep matching the current format even before the checked-in corpus is
// regenerated, and writes them out with --write_corpus=DIR (docs/testing.md).
#ifndef HEAPD_TOOLS_FUZZ_FUZZ_SEEDS_H_
#define HEAPD_TOOLS_FUZZ_FUZZ_SEEDS_H_

#include <string>
#include <utility>
#include <vector>

namespace heapd::fuzz {

// (file name, input bytes). Names are stable so that regenerating the
// corpus rewrites the same files instead of adding new ones.
using Seeds = std::vector<std::pair<std::string, std::string>>;

Seeds MakeSeeds();

}  // namespace heapd::fuzz

#endif  // HEAPD_TOOLS_FUZZ_FUZZ_SEEDS_H_
