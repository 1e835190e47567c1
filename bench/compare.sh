#!/usr/bin/env bash
# Runs heapd's benchmarks for two commits in one run, so that both meet the
# same machine in the same state: each commit is built (-c opt -O3) in a
# worktree of its own, then every benchmark runs for one commit, then the
# other, then the first again, and so on (ROUNDS times each, alternating;
# each run reports its own medians over REPS). Compare a change's figures
# only within one such run.
#
#   bash bench/compare.sh BEFORE [AFTER=HEAD] [ROUNDS=2] [REPS=3]
#
# Worktrees under $COMPARE_DIR (default /tmp/heapd-compare), kept for the
# next run (their Bazel caches too); remove them with `git worktree remove`.
# B6 (snapshot_bench.sh, mounts) runs when root. Benchmarks a commit does
# not have are left out for it. BENCHES="daemon_bench store_bench" runs
# only those.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 1)) || { sed -n '2,15p' "$0"; exit 2; }
rounds=${3:-2}
reps=${4:-3}
work=${COMPARE_DIR:-/tmp/heapd-compare}
bash tools/setup.sh
mkdir -p "$work"
declare -A dir bin
sides=(before after)
commits=([0]="$1" [1]="${2:-HEAD}")
for i in 0 1; do
  side=${sides[$i]}
  rev=$(git rev-parse --verify "${commits[$i]}^{commit}")
  dir[$side]=$work/$rev
  [ -d "${dir[$side]}" ] || git worktree add --detach "${dir[$side]}" "$rev" >/dev/null
  echo "== building $side: $(git log --oneline -1 "$rev" | cut -c1-100)"
  (cd "${dir[$side]}" && bazel build -c opt --copt=-O3 //bench:all //daemon:heapd >/dev/null 2>&1)
  bin[$side]=$(cd "${dir[$side]}" && bazel info -c opt --copt=-O3 bazel-bin 2>/dev/null)
done

run() {  # run SIDE BENCH: one run of BENCH for SIDE, if it has it
  local side=$1 name=$2 b=${bin[$1]}
  case $name in
    allocator_bench | sync_bench)
      [ -x "$b/bench/$name" ] || return 0
      "$b/bench/$name" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true 2>&1 |
        grep -E "median" ;;
    c_api_bench)
      [ -x "$b/bench/$name" ] || return 0
      "$b/bench/$name" --heapd="$b/daemon/heapd" --reps="$reps" 2>&1 | tail -6 ;;
    daemon_bench)
      [ -x "$b/bench/$name" ] || return 0
      "$b/bench/$name" --heapd="$b/daemon/heapd" --reps="$reps" 2>&1 | sed -n '/^figure/,$p' ;;
    store_bench)
      [ -x "$b/bench/$name" ] || return 0
      "$b/bench/$name" --heapd="$b/daemon/heapd" --reps="$reps" 2>&1 | sed -n '/^== medians/,$p' ;;
    update_bench)
      [ -x "$b/bench/$name" ] || return 0
      "$b/bench/$name" --heapd="$b/daemon/heapd" --reps="$reps" --rounds=8 2>&1 | tail -15 ;;
    growth_bench)
      [ -x "$b/bench/$name" ] || return 0
      "$b/bench/$name" --rounds=256 ;;
    snapshot_bench)
      [ "$(id -u)" -eq 0 ] || return 0
      (cd "${dir[$side]}" && bash bench/snapshot_bench.sh "$reps") 2>&1 | tail -8 ;;
  esac
}

benches=${BENCHES:-allocator_bench sync_bench daemon_bench update_bench store_bench c_api_bench \
growth_bench snapshot_bench}
for name in $benches; do
  for ((round = 0; round < rounds; ++round)); do
    # Alternating which goes first: neither always meets a warmer machine.
    order=(before after)
    ((round % 2)) && order=(after before)
    for side in "${order[@]}"; do
      echo "== $name, $side, round $((round + 1))"
      # A benchmark that fails (or prints nothing the filter keeps) is
      # reported; the others still run.
      run "$side" "$name" || echo "($name: no figures for $side)"
    done
  done
done
