#!/usr/bin/env bash
# Runs heapd's benchmarks with their in-process baselines, 5 repetitions
# each, and prints the medians (daemon_bench starts its own heapd on
# /dev/shm). Usage: bash bench/run.sh [REPETITIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
reps=${1:-5}
bazel build -c opt --copt=-O3 //bench:all //daemon:heapd
for b in allocator_bench sync_bench; do
  echo "== $b (median of $reps)"
  bazel-bin/bench/$b --benchmark_repetitions="$reps" \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E "median|^Benchmark|^-|CPU|Run on"
done
echo "== daemon_bench: B2 (threads, 2 processes), B3, B4, B5 through heapd (median of $reps)"
bazel-bin/bench/daemon_bench --heapd=bazel-bin/daemon/heapd --reps="$reps"
