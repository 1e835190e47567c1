#!/bin/bash
# The admin and user journeys from a shell, against a real heapd: the
# example programs (ingest a graph, query it read-only from another
# process), heapctl with and without --json, grpcurl through server
# reflection (list, describe, health, a stats call, a malformed request),
# and a clean SIGTERM.
set -u
HEAPD=$PWD/daemon/heapd
HEAPCTL=$PWD/client/heapctl
INGEST=$PWD/client/examples/graph_ingest
QUERY=$PWD/client/examples/graph_query
RAW=$PWD/client/examples/raw_pointers
WORKER=$PWD/tests/heap_worker
GRPCURL=$(command -v grpcurl || ls /usr/local/bin/grpcurl "$HOME/go/bin/grpcurl" 2>/dev/null | head -1)

DIR=$(mktemp -d /tmp/heapd-cli-XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
expect_in() {  # expect_in WHAT TEXT: TEXT contains WHAT
  case "$2" in *"$1"*) ;; *) fail "expected '$1' in: $2" ;; esac
}

"$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run" 2>"$DIR/heapd.log" &
PID=$!
export HEAPD_SOCKET=$DIR/run/heapd.sock
for _ in $(seq 600); do [ -S "$DIR/run/heapd.fd.sock" ] && break; sleep 0.05; done

# Journey 1: ingest, then a second program attaches read-only and queries.
out=$("$INGEST" --heap=graph --scale=12 --edges=20000 2>&1) || fail "graph_ingest: $out"
expect_in "ingested 20000 edges" "$out"
out=$("$QUERY" --heap=graph 2>&1) || fail "graph_query: $out"
expect_in "20000 edges (recorded 20000)" "$out"
out=$("$INGEST" --heap=graph --scale=12 --edges=10 2>&1) && fail "a second ingest under the same name succeeded"
expect_in "ALREADY_EXISTS" "$out"

# heapctl.
out=$("$HEAPCTL" heap create other --max_size=$((64 << 20)) --mode=0640) || fail "heap create: $out"
expect_in "created heap other" "$out"
out=$("$HEAPCTL" heap ls)
expect_in "graph" "$out"
expect_in "other" "$out"
out=$("$HEAPCTL" --json heap stat graph)
expect_in '"names": 1' "$out"
expect_in '"backing":' "$out"
out=$("$HEAPCTL" names ls graph)
expect_in "heapd::examples::Graph/v1" "$out"
out=$("$HEAPCTL" --json clients ls) || fail "clients ls: $out"
out=$("$HEAPCTL" heap stat nope 2>&1) && fail "stat of a missing heap succeeded"
expect_in "NOT_FOUND" "$out"
[ "$(echo "$out" | wc -l)" -eq 1 ] || fail "error is not one line: $out"
out=$("$HEAPCTL" heap frobnicate 2>&1)
[ $? -eq 2 ] || fail "a usage error did not exit 2"
out=$("$HEAPCTL" --socket="$DIR/none.sock" heap ls 2>&1) && fail "no daemon, yet success"
expect_in "UNAVAILABLE" "$out"
out=$("$HEAPCTL" heap rm other) || fail "heap rm: $out"

# A fixed-address heap: heapctl says where, and the raw-pointer example
# writes and reads it in two processes.
out=$("$HEAPCTL" heap create catalog --max_size=256M --fixed_address) || fail "fixed create: $out"
expect_in "at the fixed address 0x" "$out"
at=${out##*fixed address }
out=$("$HEAPCTL" heap stat catalog)
expect_in "mapped at: $at in every process" "$out"
out=$("$RAW" --heap=catalog write 2>&1) || fail "raw_pointers write: $out"
expect_in "write ok: heap catalog at $at" "$out"
out=$("$RAW" --heap=catalog read 2>&1) || fail "raw_pointers read: $out"
expect_in "read ok: heap catalog at $at" "$out"
out=$("$HEAPCTL" heap stat graph)
expect_in "mapped at: an address of each process's choosing" "$out"
out=$("$RAW" --heap=graph read 2>&1) && fail "raw_pointers read a heap that is not fixed"
expect_in "heap graph is not a fixed-address heap" "$out"

# Snapshots: to a directory of the test's (standing for the parallel file
# system) and to heapd's own.
mkdir -p "$DIR/pfs"
out=$("$HEAPCTL" snapshot create graph job42 --to="$DIR/pfs" --label=slurm_job_id=42) ||
  fail "snapshot create: $out"
expect_in "snapshot job42 of heap graph" "$out"
out=$("$HEAPCTL" --json snapshot ls --to="$DIR/pfs")
expect_in '"slurm_job_id": "42"' "$out"
expect_in '"heap": "graph"' "$out"
out=$("$HEAPCTL" snapshot verify job42 --to="$DIR/pfs") || fail "snapshot verify: $out"
out=$("$HEAPCTL" snapshot create graph job42 --to="$DIR/pfs" 2>&1) && fail "a second job42 was made"
expect_in "ALREADY_EXISTS" "$out"
out=$("$HEAPCTL" snapshot create graph x --to=relative/dir 2>&1) && fail "a relative target was taken"
expect_in "INVALID_ARGUMENT" "$out"
out=$("$HEAPCTL" snapshot create graph x --to="$DIR/state/heaps" 2>&1) && fail "a snapshot went among the heaps"
expect_in "inside heapd's own directories" "$out"
out=$("$HEAPCTL" snapshot create graph local 2>&1) || fail "snapshot into heapd's directory: $out"
expect_in "local" "$("$HEAPCTL" snapshot ls)"
# A writer that does not sync holds a snapshot up until its deadline.
"$WORKER" "$HEAPD_SOCKET" graph hold 7 >"$DIR/hold" &
HOLD=$!
for _ in $(seq 600); do grep -q synced "$DIR/hold" && break; sleep 0.05; done
out=$("$HEAPCTL" snapshot create graph held --wait_ms=300 2>&1) && fail "a snapshot ignored a writer"
expect_in "FAILED_PRECONDITION" "$out"
expect_in "pid $HOLD" "$out"
# ... and a snapshot that waits long enough goes ahead once the writer syncs.
"$HEAPCTL" snapshot create graph waited --wait_ms=20000 >"$DIR/waited" 2>&1 &
SNAP=$!
# The writer syncs every 0.2 s until the snapshot is through (a sync before
# the snapshot's request does not count, so one signal could come too early).
while kill -0 "$SNAP" 2>/dev/null; do kill -USR1 "$HOLD"; sleep 0.2; done
wait "$SNAP" || fail "a snapshot did not go ahead after the writer synced: $(cat "$DIR/waited")"
grep -q "synced again" "$DIR/hold" || fail "the writer did not sync again"
expect_in "snapshot waited of heap graph" "$(cat "$DIR/waited")"
kill "$HOLD"; wait "$HOLD" 2>/dev/null
# Query the snapshot in place, read-only; a read-write attach is refused.
out=$("$QUERY" --snapshot=job42 --snapshot_dir="$DIR/pfs" 2>&1) || fail "query a snapshot: $out"
expect_in "20000 edges (recorded 20000)" "$out"
"$HEAPCTL" snapshot verify job42 --to="$DIR/pfs" >/dev/null || fail "attaching changed the snapshot"
out=$("$WORKER" "$HEAPD_SOCKET" graph attach rw 2>&1)   # the heap itself still attaches
expect_in "ok attached" "$out"
# Restore it as a new heap; the graph is found there, read-only.
out=$("$HEAPCTL" snapshot restore job42 --to="$DIR/pfs" --heap=graph2) || fail "restore: $out"
expect_in "restored heap graph2" "$out"
out=$("$QUERY" --heap=graph2 2>&1) || fail "graph_query on the restored heap: $out"
expect_in "20000 edges (recorded 20000)" "$out"
out=$("$HEAPCTL" snapshot restore job42 --to="$DIR/pfs" --heap=graph2 2>&1) &&
  fail "a restore overwrote a heap without --replace"
expect_in "ALREADY_EXISTS" "$out"
"$HEAPCTL" snapshot restore job42 --to="$DIR/pfs" --heap=graph2 --replace >/dev/null ||
  fail "restore --replace"
out=$("$HEAPCTL" snapshot rm job42 --to="$DIR/pfs") || fail "snapshot rm: $out"
[ -z "$(ls -A "$DIR/pfs")" ] || fail "snapshot rm left: $(ls -A "$DIR/pfs")"

# grpcurl through server reflection.
if [ -z "$GRPCURL" ]; then
  echo "SKIPPED grpcurl checks: grpcurl is not installed (tools/setup.sh installs it)"
else
  G=("$GRPCURL" -plaintext -unix)
  S=$HEAPD_SOCKET
  out=$("${G[@]}" "$S" list 2>&1)
  expect_in "heapd.v1.Heapd" "$out"
  expect_in "grpc.health.v1.Health" "$out"
  out=$("${G[@]}" "$S" describe heapd.v1.Heapd 2>&1)
  expect_in "rpc Attach ( .heapd.v1.AttachRequest ) returns ( .heapd.v1.AttachResponse )" "$out"
  out=$("${G[@]}" "$S" describe heapd.v1.HeapStats 2>&1)
  expect_in "repeated .heapd.v1.SizeClassStats size_classes" "$out"
  out=$("${G[@]}" "$S" grpc.health.v1.Health/Check 2>&1)
  expect_in '"status": "SERVING"' "$out"
  out=$("${G[@]}" -d '{"heap":"graph"}' "$S" heapd.v1.Heapd/StatHeap 2>&1)
  expect_in '"live_objects"' "$out"
  out=$("${G[@]}" -d '{"heap":"no such/heap"}' "$S" heapd.v1.Heapd/StatHeap 2>&1)
  expect_in "Code: InvalidArgument" "$out"
  expect_in "no such/heap" "$out"
  out=$("${G[@]}" -d '{"session":"0","size":"4096"}' "$S" heapd.v1.Heapd/AllocateLarge 2>&1)
  expect_in "Code: InvalidArgument" "$out"
  out=$("${G[@]}" -d "{\"snapshot\":\"local\"}" "$S" heapd.v1.Heapd/Attach 2>&1)
  expect_in "Code: InvalidArgument" "$out"
  expect_in "read-only" "$out"
  out=$("${G[@]}" -d '{"heap":"graph","lookup":["graph"],"read_only":true}' "$S" heapd.v1.Heapd/Attach 2>&1)
  expect_in '"fd_token"' "$out"
  expect_in '"type_name": "heapd::examples::Graph/v1"' "$out"
fi

# SIGTERM: every heap synced, exit 0, sockets gone.
kill -TERM "$PID"
wait "$PID"
rc=$?
PID=
[ $rc -eq 0 ] || fail "heapd exited $rc on SIGTERM"
expect_in "every heap synced" "$(cat "$DIR/heapd.log")"
expect_in "heap other removed by uid" "$(cat "$DIR/heapd.log")"
[ -e "$DIR/run/heapd.sock" ] && fail "heapd.sock is left behind"

if [ $FAILURES -ne 0 ]; then
  echo "--- heapd log"; cat "$DIR/heapd.log"
  exit 1
fi
echo "PASS"
