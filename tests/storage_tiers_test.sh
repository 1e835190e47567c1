#!/bin/bash
# Storage tiers from a shell, against a real heapd with two: "mem" on tmpfs
# (/dev/shm) and "disk" on the test's file system. Heaps are made on either
# (heapctl and a client's attach), listed and stat'ed with their tier and
# the image each tier gives them, snapshotted and restored onto the other
# tier, found again after a restart with the list reordered; an unknown
# tier and a snapshot among a tier's heaps are refused, naming why.
set -u
HEAPD=$PWD/daemon/heapd
HEAPCTL=$PWD/client/heapctl
INGEST=$PWD/client/examples/graph_ingest
QUERY=$PWD/client/examples/graph_query

DIR=$(mktemp -d /var/tmp/heapd-tiers-XXXXXX)
SHM=$(mktemp -d /dev/shm/heapd-tiers-XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$DIR" "$SHM"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
expect_in() {  # expect_in WHAT TEXT: TEXT contains WHAT
  case "$2" in *"$1"*) ;; *) fail "expected '$1' in: $2" ;; esac
}
start() {  # start STORAGE
  "$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run" --storage="$1" 2>>"$DIR/heapd.log" &
  PID=$!
  for _ in $(seq 600); do [ -S "$DIR/run/heapd.fd.sock" ] && return 0; sleep 0.05; done
  fail "heapd did not start with --storage=$1: $(tail -3 "$DIR/heapd.log")"
}
stop() {
  kill -TERM "$PID" && wait "$PID" || fail "heapd did not stop cleanly"
  PID=
}
export HEAPD_SOCKET=$DIR/run/heapd.sock

out=$("$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run" --storage="a:$DIR/x,b:$DIR/x/y" 2>&1) &&
  fail "overlapping tiers were taken"
expect_in "overlap" "$out"

start "mem:$SHM/heapd,disk:$DIR/disk"
out=$("$HEAPCTL" heap create a --max_size=64M 2>&1) || fail "heap create a: $out"
expect_in "on storage tier mem" "$out"
out=$("$HEAPCTL" heap create b --max_size=64M --storage=disk 2>&1) || fail "heap create b: $out"
expect_in "on storage tier disk" "$out"
out=$("$HEAPCTL" heap create c --storage=nvme 2>&1) && fail "a heap was made on an unknown tier"
expect_in "INVALID_ARGUMENT" "$out"
expect_in "no tier named 'nvme'; its tiers are mem, disk" "$out"
[ -d "$SHM/heapd/heaps/a" ] || fail "heap a is not on tier mem"
[ -d "$DIR/disk/heaps/b" ] || fail "heap b is not on tier disk"
out=$("$HEAPCTL" heap ls)
expect_in "STORAGE" "$out"
echo "$out" | grep -q '^a .* mem ' || fail "heap ls does not show a on mem: $out"
echo "$out" | grep -q '^b .* disk ' || fail "heap ls does not show b on disk: $out"
out=$("$HEAPCTL" heap stat b)
expect_in "storage tier: disk" "$out"
expect_in "clients map: a working image" "$out"
out=$("$HEAPCTL" heap stat a)
expect_in "storage tier: mem" "$out"
expect_in "clients map: the data file" "$out"
out=$("$HEAPCTL" --json heap stat b)
expect_in '"storage": "disk"' "$out"

# A client's attach that creates (AttachOptions::storage, sent as
# AttachRequest.create_storage).
out=$("$INGEST" --heap=graph --storage=disk --scale=10 --edges=5000 2>&1) ||
  fail "graph_ingest: $out"
[ -d "$DIR/disk/heaps/graph" ] || fail "the ingest's heap is not on tier disk"

# Snapshots record the tier; a restore goes where it is told, else to
# the default tier.
out=$("$HEAPCTL" snapshot create graph g1 2>&1) || fail "snapshot create: $out"
out=$("$HEAPCTL" --json snapshot verify g1 2>&1) || fail "snapshot verify: $out"
expect_in '"storage": "disk"' "$out"
out=$("$HEAPCTL" snapshot restore g1 --heap=graph-mem 2>&1) || fail "restore: $out"
expect_in "on storage tier mem" "$out"
out=$("$HEAPCTL" snapshot restore g1 --heap=graph-disk --storage=disk 2>&1) || fail "restore: $out"
expect_in "on storage tier disk" "$out"
[ -d "$DIR/disk/heaps/graph-disk" ] || fail "graph-disk is not on tier disk"
[ -d "$SHM/heapd/heaps/graph-mem" ] || fail "graph-mem is not on tier mem"
out=$("$QUERY" --heap=graph-mem 2>&1) || fail "graph_query on graph-mem: $out"
expect_in "5000 edges (recorded 5000)" "$out"
out=$("$HEAPCTL" snapshot create a x --to="$DIR/disk/heaps" 2>&1) && fail "a snapshot went among a tier's heaps"
expect_in "inside heapd's own directories" "$out"
# Replacing keeps the tier of the heap replaced.
out=$("$HEAPCTL" snapshot restore g1 --heap=graph-disk --replace 2>&1) || fail "restore --replace: $out"
expect_in "on storage tier disk" "$out"
stop

# Reordered: every heap is found on its tier; the default is now disk.
start "disk:$DIR/disk,mem:$SHM/heapd"
out=$("$HEAPCTL" heap ls)
echo "$out" | grep -q '^a .* mem ' || fail "after the restart, a is not on mem: $out"
echo "$out" | grep -q '^graph .* disk ' || fail "after the restart, graph is not on disk: $out"
out=$("$QUERY" --heap=graph 2>&1) || fail "graph_query after the restart: $out"
expect_in "5000 edges (recorded 5000)" "$out"
out=$("$HEAPCTL" heap create d --max_size=64M 2>&1) || fail "heap create d: $out"
expect_in "on storage tier disk" "$out"
out=$("$HEAPCTL" heap rm a 2>&1) || fail "heap rm a: $out"
[ -e "$SHM/heapd/heaps/a" ] && fail "heap a is still on tier mem after heap rm"
stop

if [ "$FAILURES" -ne 0 ]; then
  echo "$FAILURES failures; heapd's log:"
  tail -20 "$DIR/heapd.log"
  exit 1
fi
echo "PASS"
