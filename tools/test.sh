#!/usr/bin/env bash
# Installs what the tests need, builds and runs every Bazel test (gcc), then
# builds the fuzzers with clang and fuzzes each for a bounded time
# (tools/fuzz.sh; FUZZ_SECONDS sets the time per fuzzer, 0 skips them).
# Ends with one line "tests: N passed, N failed" counting Bazel test targets
# and fuzzers together; the line before it gives each part.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
log=$(mktemp)
fuzz_log=$(mktemp)
trap 'rm -f "$log" "$fuzz_log"' EXIT
# Clang configs (asan, and any *san or clang config) build in clang's own
# output base, so that they do not evict the gcc build's cache.
bazel=bazel
for arg in "$@"; do
  if [[ $arg =~ ^--config=(clang|fuzz|[a-z]*san)$ ]]; then bazel=tools/fuzz/bazel_clang.sh; fi
done
"$bazel" test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY)' "$log")

# CI must fuzz: there a missing clang fails the run instead of skipping.
if [[ ${CI:-} == true ]]; then export FUZZ_REQUIRED=${FUZZ_REQUIRED:-1}; fi
bash tools/fuzz.sh 2>&1 | tee "$fuzz_log"
fuzz_rc=${PIPESTATUS[0]}
fuzz_passed=$(sed -n 's/^fuzzers: \([0-9]*\) passed, [0-9]* failed$/\1/p' "$fuzz_log" | tail -n 1)
fuzz_failed=$(sed -n 's/^fuzzers: [0-9]* passed, \([0-9]*\) failed$/\1/p' "$fuzz_log" | tail -n 1)
fuzz_passed=${fuzz_passed:-0}
fuzz_failed=${fuzz_failed:-0}
# A fuzz.sh that failed without counting a failure (a crash of the script
# itself) still counts as one.
if ((fuzz_rc != 0 && fuzz_failed == 0)); then fuzz_failed=1; fi
if ((fuzz_rc != 0 && rc == 0)); then rc=1; fi

echo "bazel test targets ${passed} passed, ${failed} failed; fuzzers ${fuzz_passed} passed, ${fuzz_failed} failed"
echo "tests: $((passed + fuzz_passed)) passed, $((failed + fuzz_failed)) failed"
exit "$rc"
