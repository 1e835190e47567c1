#!/usr/bin/env bash
# B6: snapshot of B3's heap (2^22 R-MAT edges, scale 18) on tmpfs, ext4 and
# XFS with reflink — time and extra space used — and restore time. Each
# file system is made fresh (tmpfs mount, loop-mounted images), a heapd runs
# on it, graph_ingest builds the heap, then heapctl snapshots it into the
# same file system REPS times. On ext4 and XFS it runs twice: heaps with a
# working image (heapd's default: a snapshot reads the durable image once
# its redo logs are applied) and, as the same-run baseline, direct ones
# (--working_images=false: the data file itself). Needs root. Times: wall time of
# `heapctl snapshot create` (process start and connect included) and
# heapd's own (the answer's duration_us, from the call's arrival).
# Usage: bash bench/snapshot_bench.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
[ "$(id -u)" -eq 0 ] || { echo "B6 needs root (mounts)"; exit 1; }
bazel build -c opt --copt=-O3 //daemon:heapd //client:heapctl //client/examples:graph_ingest >/dev/null 2>&1
BIN=$PWD/bazel-bin
W=$(mktemp -d /tmp/heapd-b6-XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  umount "$W/mnt" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
used_kb() { df -k --output=used "$W/mnt" | tail -1 | tr -d ' '; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

printf "%-12s %-8s %12s %10s %16s %11s   runs (snapshot ms, heapd ms)\n" fs method "snapshot ms" \
  "heapd ms" "extra space MB" "restore ms"
for run in tmpfs ext4 xfs ext4:direct xfs:direct; do
  fs=${run%%:*}
  images=true
  [ "$run" = "$fs" ] || images=false
  mkdir -p "$W/mnt"
  case $fs in
    tmpfs) mount -t tmpfs -o size=4g tmpfs "$W/mnt" ;;
    ext4) truncate -s 4G "$W/img"; mkfs.ext4 -q -F "$W/img"; mount -o loop "$W/img" "$W/mnt" ;;
    xfs) truncate -s 4G "$W/img"; mkfs.xfs -q -f -m reflink=1 "$W/img"; mount -o loop "$W/img" "$W/mnt" ;;
  esac
  "$BIN/daemon/heapd" --state_dir="$W/mnt/state" --runtime_dir="$W/run" --log_level=warn \
    --working_images=$images &
  PID=$!
  for _ in $(seq 100); do [ -S "$W/run/heapd.fd.sock" ] && break; sleep 0.05; done
  export HEAPD_SOCKET=$W/run/heapd.sock
  "$BIN/client/examples/graph_ingest" --heap=b3 --scale=18 --edges=4194304 --seed=2026 >/dev/null
  mkdir -p "$W/mnt/snaps"
  sync
  snap=(); daemon=(); extra=(); restore=(); method=
  for i in $(seq "$reps"); do
    before=$(used_kb)
    t0=$(now_ms)
    out=$("$BIN/client/heapctl" --json snapshot create b3 "s$i" --to="$W/mnt/snaps")
    t1=$(now_ms)
    sync
    after=$(used_kb)
    method=$(echo "$out" | sed -n 's/.*"copy_method": "\(.*\)".*/\1/p')
    snap+=($((t1 - t0)))
    us=$(echo "$out" | sed -n 's/.*"duration_us": "\([0-9]*\)".*/\1/p')
    daemon+=($(( (us + 500) / 1000 )))
    extra+=($(( (after - before) / 1024 )))
    t0=$(now_ms)
    "$BIN/client/heapctl" snapshot restore "s$i" --to="$W/mnt/snaps" --heap="r$i" >/dev/null
    t1=$(now_ms)
    restore+=($((t1 - t0)))
    "$BIN/client/heapctl" heap rm "r$i" >/dev/null
    "$BIN/client/heapctl" snapshot rm "s$i" --to="$W/mnt/snaps" >/dev/null
  done
  printf "%-12s %-8s %12s %10s %16s %11s   %s; %s\n" "$run" "$method" \
    "$(printf '%s\n' "${snap[@]}" | median)" "$(printf '%s\n' "${daemon[@]}" | median)" \
    "$(printf '%s\n' "${extra[@]}" | median)" "$(printf '%s\n' "${restore[@]}" | median)" \
    "${snap[*]}" "${daemon[*]}"
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  umount "$W/mnt"; rm -f "$W/img"
done
