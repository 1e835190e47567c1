#!/usr/bin/env bash
# Builds every heapd fuzzer (heapd_fuzz_test, tools/fuzz/fuzz.bzl) with
# Debian's clang, libFuzzer, ASan and UBSan (--config=fuzz), then fuzzes each
# for a bounded time from a temporary copy of its checked-in corpus, so a run
# never changes the work tree. Any crash, leak, UBSan report, slow input or
# memory blow-up fails; the input that caused it is kept and printed.
#
# Prints one line per fuzzer and ends with "fuzzers: N passed, N failed".
# When clang-14 or libFuzzer is missing it says why and exits 0, unless
# FUZZ_REQUIRED=1 (tools/test.sh sets it in CI): then a skip is a failure.
#
# Environment:
#   FUZZ_SECONDS    seconds per fuzzer (default 25; 0 skips fuzzing)
#   FUZZ_TARGETS    labels to fuzz instead of all, space-separated
#   FUZZ_ARTIFACTS  where crash inputs go (default: a new directory in /tmp)
#   HEAPD_CLANG_OUTPUT_BASE  see tools/fuzz/bazel_clang.sh
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-25}

skip() {
  echo "fuzz: skipped: $*"
  if [[ ${FUZZ_REQUIRED:-0} == 1 ]]; then
    echo "fuzz: FUZZ_REQUIRED=1: fuzzers must run here" >&2
    echo "fuzzers: 0 passed, 1 failed"
    exit 1
  fi
  exit 0
}

[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz: FUZZ_SECONDS=$seconds is not a number" >&2; exit 2; }
# Asked for: not a failure, even in CI.
((seconds > 0)) || { echo "fuzz: skipped: FUZZ_SECONDS=0"; exit 0; }
command -v clang-14 >/dev/null || skip "clang-14 is not installed (tools/setup.sh installs it)"

# libFuzzer and the sanitizer runtimes come with libclang-rt-14-dev: link a
# do-nothing fuzzer the way the real ones are linked.
probe=$(mktemp -d /tmp/heapd-fuzz-probe.XXXXXX)
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$probe/probe.cc"
if ! clang-14 -x c++ "$probe/probe.cc" -fsanitize=fuzzer,address,undefined \
  -fsanitize-link-c++-runtime -lstdc++ -o "$probe/probe" >"$probe/log" 2>&1; then
  reason=$(head -n 3 "$probe/log")
  rm -rf "$probe"
  skip "clang-14 cannot link a libFuzzer binary (is libclang-rt-14-dev installed?): ${reason}"
fi
rm -rf "$probe"

bazel_clang=tools/fuzz/bazel_clang.sh
started=$SECONDS

query="attr(tags, 'heapd_fuzzer', kind(cc_binary, //...))"
listing=$("$bazel_clang" query --keep_going "$query" --output=build 2>/dev/null)
# "//pkg:name corpus_dir" per fuzzer, from its tags and generator location.
mapfile -t fuzzers < <(awk -F'"' '
  /^  name = / { name = $2 }
  /^  generator_location = / { split($2, parts, "/BUILD"); pkg = parts[1] }
  /heapd_fuzz_corpus=/ {
    for (i = 1; i <= NF; i++) if ($i ~ /^heapd_fuzz_corpus=/) corpus = substr($i, 19)
  }
  /^\)/ { print "//" pkg ":" name " " corpus }' <<<"$listing")
if [[ -n ${FUZZ_TARGETS:-} ]]; then
  wanted=()
  for f in "${fuzzers[@]}"; do
    for t in $FUZZ_TARGETS; do [[ ${f%% *} == "$t" ]] && wanted+=("$f"); done
  done
  fuzzers=("${wanted[@]}")
fi
if ((${#fuzzers[@]} == 0)); then
  echo "fuzz: no fuzzers found (query: $query)" >&2
  echo "fuzzers: 0 passed, 1 failed"
  exit 1
fi

labels=()
for f in "${fuzzers[@]}"; do labels+=("${f%% *}"); done
echo "fuzz: building ${#labels[@]} fuzzers with clang (--config=fuzz)"
build_log=$(mktemp)
if ! "$bazel_clang" build --config=fuzz "${labels[@]}" >"$build_log" 2>&1; then
  tail -n 60 "$build_log"
  rm -f "$build_log"
  echo "fuzz: the fuzzers did not build" >&2
  echo "fuzzers: 0 passed, ${#labels[@]} failed"
  exit 1
fi
rm -f "$build_log"
bin=$("$bazel_clang" info --config=fuzz bazel-bin 2>/dev/null)
echo "fuzz: built in $((SECONDS - started)) s; ${seconds} s per fuzzer"

artifacts=${FUZZ_ARTIFACTS:-$(mktemp -d /tmp/heapd-fuzz-artifacts.XXXXXX)}
mkdir -p "$artifacts"
work=$(mktemp -d /tmp/heapd-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Every sanitizer report is fatal; libFuzzer exits with 77 on a finding.
# Stacks get file:line from llvm-14's symbolizer.
symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:external_symbolizer_path=$symbolizer
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:external_symbolizer_path=$symbolizer
passed=0
failed=0
for f in "${fuzzers[@]}"; do
  label=${f%% *}
  corpus=${f#* }
  name=${label##*:}
  package=${label#//}
  package=${package%%:*}
  seeds="$work/$name.corpus"
  mkdir -p "$seeds"
  [[ -d $corpus ]] && cp -r "$corpus/." "$seeds/"
  log="$work/$name.log"
  # -timeout: one input may take at most 10 s; -rss_limit_mb/-malloc_limit_mb:
  # an input may not make the process grow past 2 GiB or allocate 1 GiB at once.
  "$bin/$package/$name" "$seeds" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -error_exitcode=77 -timeout_exitcode=77 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$name-" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  new=$(sed -n 's/^stat::new_units_added: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1)
  if ((rc == 0)); then
    passed=$((passed + 1))
    echo "fuzz: PASSED ${label}: ${runs:-?} runs in ${seconds} s, ${new:-?} new inputs, ${cov:-cov: ?}"
  else
    failed=$((failed + 1))
    echo "fuzz: FAILED ${label} (exit ${rc}); its log ends:"
    grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|RELOAD)' "$log" | tail -n 60
    for input in "$artifacts/$name"-*; do
      [[ -f $input ]] || continue
      echo "fuzz: input kept as ${input} ($(stat -c %s "$input") bytes); first bytes:"
      od -A d -t x1 "$input" | head -n 16
      echo "fuzz: reproduce: tools/fuzz/bazel_clang.sh run --config=fuzz ${label} -- ${input}"
      echo "fuzz: add it to ${corpus}/ to make it a regression test of 'bazel test ${label}_test'"
    done
  fi
done
rmdir "$artifacts" 2>/dev/null  # kept only when it holds something
echo "fuzz: done in $((SECONDS - started)) s"
echo "fuzzers: ${passed} passed, ${failed} failed"
((failed == 0))
