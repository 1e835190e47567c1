#!/bin/bash
# Snapshot stores end to end, with real heapds: two heapds with
# their own state directories (nodes node-a and node-b) and one store
# directory standing for the parallel file system; a third heapd (node-c)
# with an empty block cache stands for a new allocation.
#
#   each node ingests a graph and adds its part to one job version; an
#   unchanged heap stored again writes no data block; ls, --json, --quiet,
#   du, verify; a heap changed in a few bytes adds deltas (restored
#   exactly); restores on the other node, on node-c (every part on one
#   node), each checked by querying the graph (same vertices, edges, degrees
#   and 2-hop reach as the source); a second restore of the same version
#   reads nothing from the store (node cache); rm then gc keeps what the
#   remaining version names; a damaged block is found by verify and stops a
#   restore; another user cannot read root's store; grpcurl calls the same
#   RPCs. Everything started here is stopped by PID; only Unix sockets.
set -u
HEAPD=$PWD/daemon/heapd
HEAPCTL=$PWD/client/heapctl
INGEST=$PWD/client/examples/graph_ingest
QUERY=$PWD/client/examples/graph_query
WORKER=$PWD/tests/heap_worker
GRPCURL=$(command -v grpcurl || ls /usr/local/bin/grpcurl "$HOME/go/bin/grpcurl" 2>/dev/null | head -1)

DIR=$(mktemp -d /tmp/heapd-store-XXXXXX)
chmod 0755 "$DIR"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
expect_in() {  # expect_in WHAT TEXT: TEXT contains WHAT
  case "$2" in *"$1"*) ;; *) fail "expected '$1' in: $2" ;; esac
}

start_node() {  # start_node NAME: started, and answering (a killed one's sockets may remain)
  "$HEAPD" --node_name="$1" --state_dir="$DIR/$1/state" --runtime_dir="$DIR/$1/run" \
    2>>"$DIR/$1.log" &
  PIDS+=($!)
  for _ in $(seq 600); do
    HEAPD_SOCKET="$DIR/$1/run/heapd.sock" "$HEAPCTL" heap ls >/dev/null 2>&1 && break
    sleep 0.05
  done
}
on() {  # on NODE COMMAND...: heapctl (or a program) against NODE's heapd
  local node=$1
  shift
  HEAPD_SOCKET="$DIR/$node/run/heapd.sock" "$@"
}
# The graph's fingerprint: graph_query's answer without its timing.
fingerprint() { on "$1" "$QUERY" --heap="$2" 2>&1 | sed 's/^attach+find [0-9.]* ms; //'; }

start_node node-a
start_node node-b
STORE=$DIR/store
mkdir -m 0700 "$STORE"

out=$(on node-a "$INGEST" --heap=graph --scale=14 --edges=200000 2>&1) || fail "ingest on a: $out"
out=$(on node-b "$INGEST" --heap=graph --scale=13 --edges=100000 --seed=7 2>&1) ||
  fail "ingest on b: $out"
A_GRAPH=$(fingerprint node-a graph)
B_GRAPH=$(fingerprint node-b graph)
expect_in "200000 edges (recorded 200000)" "$A_GRAPH"

# One job version, a part from each node.
out=$(on node-a "$HEAPCTL" snapshot create graph job-7 --store="$STORE" --label=slurm_job_id=7) ||
  fail "create on a: $out"
expect_in "part job-7/node-a/graph" "$out"
out=$(on node-b "$HEAPCTL" --json snapshot create graph job-7 --store="$STORE") ||
  fail "create on b: $out"
expect_in '"node": "node-b"' "$out"
# The store's first versions: every block now is job-7's (damaged below).
JOB7_BLOCKS=$(find "$STORE/blocks" -type f -name '[0-9a-f]*' | sort)
out=$(on node-a "$HEAPCTL" snapshot create graph job-7 --store="$STORE" 2>&1) &&
  fail "a second part node-a/graph of job-7 was made"
expect_in "ALREADY_EXISTS" "$out"
# Unchanged since: no data block is new (only the manifest differs, and
# metadata blocks that name the epoch).
out=$(on node-a "$HEAPCTL" --json snapshot create graph job-8 --store="$STORE") ||
  fail "second create on a: $out"
new=$(echo "$out" | sed -n 's/.*"blocks_written": "\{0,1\}\([0-9]*\).*/\1/p')
[ "${new:-0}" -le 2 ] || fail "an unchanged heap wrote $new new blocks: $out"
# No writer attached since job-7 (only read-only queries): heapd knows the
# data unchanged and reuses job-7's data blocks without reading the heap.
expect_in '"data_reused": true' "$out"
expect_in '"hashed_bytes": "0"' "$out"   # (--json prints every field, zeros too)


out=$(on node-a "$HEAPCTL" snapshot ls --store="$STORE") || fail "ls: $out"
expect_in "node-b" "$out"
expect_in "job-8" "$out"
out=$(on node-a "$HEAPCTL" snapshot ls --store="$STORE" --quiet)
expect_in "job-7 node-a graph" "$out"
expect_in "job-7 node-b graph" "$out"
out=$(on node-a "$HEAPCTL" --json snapshot ls --store="$STORE")
expect_in '"slurm_job_id": "7"' "$out"
out=$(on node-a "$HEAPCTL" snapshot du --store="$STORE") || fail "du: $out"
expect_in "in 3 parts" "$out"
out=$(on node-a "$HEAPCTL" snapshot verify job-7 --store="$STORE") || fail "verify: $out"
expect_in "every block's hash" "$out"

# Restores: b takes a's part; c (a new node) takes every part.
out=$(on node-b "$HEAPCTL" snapshot restore job-7 --store="$STORE" --heap=graph2 2>&1)
# b's own part is chosen when none is named.
[ "$(fingerprint node-b graph2)" = "$B_GRAPH" ] || fail "b's own part restored wrong: $out"
out=$(on node-b "$HEAPCTL" snapshot restore job-7 --store="$STORE" --from_node=node-a \
  --heap=graph-a 2>&1) || fail "restore of a's part on b: $out"
[ "$(fingerprint node-b graph-a)" = "$A_GRAPH" ] || fail "a's graph restored on b differs"
start_node node-c
out=$(on node-c "$HEAPCTL" snapshot restore job-7 --store="$STORE" 2>&1) &&
  fail "an ambiguous restore succeeded"
expect_in "FAILED_PRECONDITION" "$out"
while read -r version node heap; do
  [ "$version" = job-7 ] || continue
  out=$(on node-c "$HEAPCTL" snapshot restore job-7 --store="$STORE" --from_node="$node" \
    --from_heap="$heap" --heap="$node-$heap" 2>&1) || fail "restore $node/$heap on c: $out"
done < <(on node-c "$HEAPCTL" snapshot ls --store="$STORE" --quiet)
[ "$(fingerprint node-c node-a-graph)" = "$A_GRAPH" ] || fail "a's graph on c differs"
[ "$(fingerprint node-c node-b-graph)" = "$B_GRAPH" ] || fail "b's graph on c differs"
# The same part again on c: every block is in c's cache now.
out=$(on node-c "$HEAPCTL" snapshot restore job-7 --store="$STORE" --from_node=node-a \
  --heap=again 2>&1) || fail "second restore on c: $out"
expect_in "0 blocks read from the store" "$(grep 'heap again restored' "$DIR/node-c.log")"
[ "$(fingerprint node-c again)" = "$A_GRAPH" ] || fail "a's graph from c's cache differs"

# A writer that attaches, stores without ever syncing and dies (no epoch
# passes; here, on a file system, its store stays in the data file, as in a
# full snapshot) changes what heapd knows: the next part is read and
# hashed again, and each part restores to what the heap held.
S_A=$DIR/node-a/run/heapd.sock
out=$("$WORKER" "$S_A" counter put counter 5 2>&1) || fail "put: $out"
out=$(on node-a "$HEAPCTL" --json snapshot create counter c1 --store="$STORE") || fail "c1: $out"
out=$(on node-a "$HEAPCTL" --json snapshot create counter c2 --store="$STORE") || fail "c2: $out"
expect_in '"data_reused": true' "$out"
"$WORKER" "$S_A" counter scribble-and-die counter 9 >/dev/null 2>&1
for _ in $(seq 400); do
  grep -q "on heap counter .* ended: " "$DIR/node-a.log" 2>/dev/null && break
  sleep 0.05
done
sleep 0.2
out=$(on node-a "$HEAPCTL" --json snapshot create counter c3 --store="$STORE") || fail "c3: $out"
expect_in '"data_reused": false' "$out"
case "$out" in *'"hashed_bytes": "0"'*) fail "a changed heap was not read: $out" ;; esac
# A few bytes changed since c2: stored as the pages that changed.
case "$out" in *'"delta_blocks"'*) ;; *) fail "c3 stored no block as a delta: $out" ;; esac
now=$("$WORKER" "$S_A" counter get counter 2>&1)
for version in c1 c3; do
  out=$(on node-b "$HEAPCTL" snapshot restore "$version" --store="$STORE" --heap="counter-$version" 2>&1) ||
    fail "restore $version: $out"
done
[ "$("$WORKER" "$DIR/node-b/run/heapd.sock" counter-c1 get counter 2>&1)" = "value 5" ] ||
  fail "c1 restored is not 5"
[ "$("$WORKER" "$DIR/node-b/run/heapd.sock" counter-c3 get counter 2>&1)" = "$now" ] ||
  fail "c3 restored differs from the heap ($now)"

# rm, then gc: what job-7 names stays; what only the removed versions
# named goes.
out=$(on node-a "$INGEST" --heap=scratch --scale=10 --edges=5000 --seed=9 2>&1) ||
  fail "ingest scratch: $out"
out=$(on node-a "$HEAPCTL" snapshot create scratch job-9 --store="$STORE") || fail "create: $out"
for version in job-8 job-9; do
  out=$(on node-a "$HEAPCTL" snapshot rm "$version" --store="$STORE") || fail "rm $version: $out"
done
out=$(on node-a "$HEAPCTL" snapshot gc --store="$STORE" --grace_s=0 2>&1) &&
  fail "gc took a grace of 0 s"
expect_in "INVALID_ARGUMENT" "$out"
# Blocks younger than the grace stay; made older (as if written two
# minutes ago), the unnamed ones go.
out=$(on node-a "$HEAPCTL" --json snapshot gc --store="$STORE" --grace_s=60) || fail "gc: $out"
expect_in '"blocks_removed": "0"' "$out"
find "$STORE/blocks" -type f -exec touch -d '-2 minutes' {} +
out=$(on node-a "$HEAPCTL" snapshot gc --store="$STORE" --grace_s=60 --dry_run) || fail "gc: $out"
expect_in "would remove" "$out"
out=$(on node-a "$HEAPCTL" --json snapshot gc --store="$STORE" --grace_s=60) || fail "gc: $out"
case "$out" in *'"blocks_removed": "0"'*) fail "gc removed nothing: $out" ;; esac
out=$(on node-a "$HEAPCTL" --json snapshot gc --store="$STORE" --grace_s=60) || fail "gc: $out"
expect_in '"blocks_removed": "0"' "$out"   # a second gc finds nothing more
out=$(on node-a "$HEAPCTL" snapshot verify job-7 --store="$STORE") || fail "verify after gc: $out"
out=$(on node-a "$HEAPCTL" snapshot ls --store="$STORE" --quiet)
case "$out" in *job-8*) fail "job-8 still listed: $out" ;; esac

# heapd killed (SIGKILL) while it stores a part (its lease, written
# before its first block, is seen in the store): no part appears, the
# store's other versions are whole, and the part is stored anew after
# heapd restarts.
out=$(on node-a "$INGEST" --heap=big --scale=18 --edges=2000000 2>&1) || fail "ingest big: $out"
leases_before=$(ls "$STORE/leases" 2>/dev/null | wc -l)
on node-a "$HEAPCTL" snapshot create big killed --store="$STORE" >/dev/null 2>&1 &
CREATE=$!
for _ in $(seq 500); do
  [ "$(ls "$STORE/leases" 2>/dev/null | wc -l)" -gt "$leases_before" ] && break
  sleep 0.01
done
kill -9 "${PIDS[0]}"
wait "${PIDS[0]}" 2>/dev/null
wait "$CREATE" 2>/dev/null
start_node node-a
if [ -e "$STORE/versions/killed/node-a/big.recipe" ]; then
  echo "note: the create finished before heapd was killed"
else
  echo "heapd killed while it stored part killed/node-a/big"
  out=$(on node-a "$HEAPCTL" snapshot ls --store="$STORE" --quiet)
  case "$out" in *killed*) fail "a killed create left a part: $out" ;; esac
  out=$(on node-a "$HEAPCTL" snapshot verify job-7 --store="$STORE") ||
    fail "job-7 after a killed create: $out"
  out=$(on node-a "$HEAPCTL" snapshot create big killed --store="$STORE") ||
    fail "the killed part stored again: $out"
fi
out=$(on node-c "$HEAPCTL" snapshot restore killed --store="$STORE" --heap=big 2>&1) ||
  fail "restore of the part stored after the kill: $out"
[ "$(fingerprint node-c big)" = "$(fingerprint node-a big)" ] || fail "big restored differs"

# Another user cannot read root's store (heapd works in it as the caller).
if command -v setpriv >/dev/null && getent passwd nobody >/dev/null; then
  out=$(HEAPD_SOCKET="$DIR/node-a/run/heapd.sock" setpriv --reuid=nobody --regid=nogroup \
    --clear-groups "$HEAPCTL" snapshot ls --store="$STORE" 2>&1) && fail "nobody listed root's store"
  expect_in "PERMISSION_DENIED" "$out"
fi

# A block of job-7 changed in the store: verify names it, a restore
# refuses it. (Not any block: the store holds other versions' too.)
block=$(echo "$JOB7_BLOCKS" | head -1)
[ -f "$block" ] || fail "job-7's block $block is gone"
printf 'x' | dd of="$block" bs=1 seek=40 conv=notrunc status=none
out=$(on node-b "$HEAPCTL" snapshot verify job-7 --store="$STORE" 2>&1) &&
  fail "verify passed a damaged block"
expect_in "DATA_LOSS" "$out"
out=$(on node-b "$HEAPCTL" snapshot restore job-7 --store="$STORE" --from_node=node-b \
  --heap=damaged 2>&1)
# b's cache may hold the block (b restored its part): then the restore is
# right without the store's copy; else it must refuse.
if [ $? -eq 0 ]; then
  [ "$(fingerprint node-b damaged)" = "$B_GRAPH" ] || fail "a restore used a damaged block"
else
  expect_in "DATA_LOSS" "$out"
fi

# The same RPCs through grpcurl and server reflection.
if [ -n "$GRPCURL" ]; then
  out=$("$GRPCURL" -plaintext -unix -d "{\"store_dir\": \"$STORE\"}" "$DIR/node-a/run/heapd.sock" \
    heapd.v1.Heapd/StoreUsage 2>&1) || fail "grpcurl StoreUsage: $out"
  expect_in '"logical_bytes"' "$out"
  out=$("$GRPCURL" -plaintext -unix -d '{"store_dir": "relative"}' "$DIR/node-a/run/heapd.sock" \
    heapd.v1.Heapd/GcStore 2>&1) && fail "grpcurl GcStore took a relative store"
  expect_in "InvalidArgument" "$out"
else
  echo "grpcurl not found: its part skipped"
fi

if [ "$FAILURES" -ne 0 ]; then
  for node in node-a node-b node-c; do echo "--- $node.log"; tail -20 "$DIR/$node.log"; done
  exit 1
fi
echo "PASSED"
