#!/usr/bin/env bash
# Installs what the tests need, then builds and runs every test.
# Ends with one line "N passed, N failed" counting Bazel test targets.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY)' "$log")
echo "tests: ${passed} passed, ${failed} failed"
exit "$rc"
