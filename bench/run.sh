#!/usr/bin/env bash
# Runs heapd's benchmarks with their in-process baselines, 5 repetitions
# each, and prints the medians (daemon_bench and update_bench start their
# own heapds on /dev/shm). Usage: bash bench/run.sh [REPETITIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
reps=${1:-5}
opts=(-c opt --copt=-O3)
bazel build "${opts[@]}" //bench:all //daemon:heapd
# The -c opt output directory itself: bazel-bin follows whichever
# configuration was built last, which another build may change meanwhile.
bin=$(bazel info "${opts[@]}" bazel-bin 2>/dev/null)
for b in allocator_bench sync_bench; do
  echo "== $b (median of $reps)"
  "$bin/bench/$b" --benchmark_repetitions="$reps" \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E "median|^Benchmark|^-|CPU|Run on"
done
echo "== daemon_bench: B2 (threads, 2 processes), B3 (with and without content tracking), B4, B5, B11 through heapd (median of $reps)"
"$bin/bench/daemon_bench" --heapd="$bin/daemon/heapd" --reps="$reps"
echo "== raw_pointer_bench: B3 over raw pointers, std containers in DRAM and in a fixed-address heap (median of $reps)"
"$bin/bench/raw_pointer_bench" --heapd="$bin/daemon/heapd" --reps="$reps" | sed -n '/^== medians/,$p'
echo "== update_bench: B8, 10% of a 1 GiB heap updated between syncs, with and without content tracking ($reps runs of 8 rounds each)"
"$bin/bench/update_bench" --heapd="$bin/daemon/heapd" --reps="$reps" --rounds=8
echo "== store_bench: B9a, B9c, B9b and restores, snapshot stores next to full copies (median of $reps)"
"$bin/bench/store_bench" --heapd="$bin/daemon/heapd" --reps="$reps" | sed -n '/^== medians/,$p'
echo "== reservation_bench: B13, reserved against allocated bytes per workload (one run)"
"$bin/bench/reservation_bench" --heapd="$bin/daemon/heapd"
