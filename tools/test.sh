#!/usr/bin/env bash
# What CI (.ci/run) and a developer run: installs what is missing
# (tools/setup.sh), then runs every check, one part after the other:
#
#   format  tools/format.sh --check (clang-format)
#   layers  tools/layers.py (no #include runs from a package to one above it)
#   gcc     bazel test //...                          (the default build)
#   asan    bazel test //... --config=asan --config=thread_safety
#           (clang: ASan + UBSan over the whole suite, and -Wthread-safety
#           -Werror in the same build)
#   tsan    bazel test --config=tsan //tools/tsan:tsan_tests
#           (ThreadSanitizer over the client and daemon tests)
#   fuzz    tools/fuzz.sh (libFuzzer, FUZZ_SECONDS per fuzzer)
#   consumers  tests/consumers_test.sh (tools/install.sh into a temporary
#           prefix; C, CMake, Fortran, Python and MPI programs built
#           outside the Bazel tree against it)
#
#   bash tools/test.sh               # all of them
#   bash tools/test.sh asan tsan     # only these parts
#   bash tools/test.sh gcc -- --test_output=all   # flags after -- go to bazel
#
# Clang parts run Bazel in clang's own output base (tools/fuzz/bazel_clang.sh).
# Prints one line per part, "<part>: N passed, N failed (S s)", and ends
# with "tests: N passed, N failed" summing them (for Bazel parts N counts test
# targets; format counts one check). Fails if any part fails.
set -uo pipefail
cd "$(dirname "$0")/.."

all_parts=(format layers gcc asan tsan fuzz consumers)
parts=()
bazel_args=()
while (($#)); do
  case $1 in
    --) shift; bazel_args=("$@"); break ;;
    --config=asan) parts+=(asan) ;;  # the older spelling
    --config=tsan) parts+=(tsan) ;;
    format | layers | gcc | asan | tsan | fuzz | consumers) parts+=("$1") ;;
    *) echo "test.sh: unknown part '$1' (parts: ${all_parts[*]})" >&2; exit 2 ;;
  esac
  shift
done
((${#parts[@]})) || parts=("${all_parts[@]}")

bash tools/setup.sh || exit 1
# CI must run the clang parts: there a missing clang fails instead of skipping.
if [[ ${CI:-} == true ]]; then export FUZZ_REQUIRED=${FUZZ_REQUIRED:-1}; fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
total_passed=0
total_failed=0
rc=0
summary=()

# Counts Bazel's per-target result lines in $log.
count_bazel() {
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
  failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY)' "$log")
}

run_part() {
  local part=$1 part_rc started=$SECONDS
  passed=0
  failed=0
  echo "=== test.sh: ${part}"
  case $part in
    format)
      tools/format.sh --check 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      if ((part_rc == 0)); then passed=1; else failed=1; fi
      ;;
    layers)
      python3 tools/layers.py 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      if ((part_rc == 0)); then passed=1; else failed=1; fi
      ;;
    gcc)
      bazel test //... "${bazel_args[@]}" 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      count_bazel
      ;;
    asan)
      tools/fuzz/bazel_clang.sh test --config=asan --config=thread_safety //... \
        "${bazel_args[@]}" 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      count_bazel
      ;;
    tsan)
      tools/fuzz/bazel_clang.sh test --config=tsan //tools/tsan:tsan_tests \
        "${bazel_args[@]}" 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      count_bazel
      ;;
    consumers)
      bash tests/consumers_test.sh 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      if ((part_rc == 0)); then passed=1; else failed=1; fi
      ;;
    fuzz)
      bash tools/fuzz.sh 2>&1 | tee "$log"
      part_rc=${PIPESTATUS[0]}
      passed=$(sed -n 's/^fuzzers: \([0-9]*\) passed, [0-9]* failed$/\1/p' "$log" | tail -n 1)
      failed=$(sed -n 's/^fuzzers: [0-9]* passed, \([0-9]*\) failed$/\1/p' "$log" | tail -n 1)
      passed=${passed:-0}
      failed=${failed:-0}
      ;;
  esac
  # A part that failed without counting a failure (a build error, a crash
  # of a script) still counts as one.
  if ((part_rc != 0 && failed == 0)); then failed=1; fi
  if ((part_rc != 0)); then rc=1; fi
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
  summary+=("${part}: ${passed} passed, ${failed} failed ($((SECONDS - started)) s)")
}

for part in "${parts[@]}"; do run_part "$part"; done

printf '%s\n' "${summary[@]}"
echo "tests: ${total_passed} passed, ${total_failed} failed"
exit "$rc"
