#!/bin/bash
# What a new user and a node admin tripped over, tried again as they would,
# with real heapds, real heapctl and the examples, as root and as an
# unprivileged user: one section per item of the report (see each heading).
set -u
HEAPD=$PWD/daemon/heapd
HEAPCTL=$PWD/client/heapctl
INGEST=$PWD/client/examples/graph_ingest
QUERY=$PWD/client/examples/graph_query
WORKER=$PWD/tests/heap_worker
GRPCURL=$(command -v grpcurl || ls /usr/local/bin/grpcurl "$HOME/go/bin/grpcurl" 2>/dev/null | head -1)

DIR=$(mktemp -d /tmp/heapd-newuser-XXXXXX)
chmod 755 "$DIR"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
expect_in() {  # expect_in WHAT TEXT: TEXT contains WHAT
  case "$2" in *"$1"*) ;; *) fail "expected '$1' in: $2" ;; esac
}
expect_rc() {  # expect_rc CODE WHAT: the last command's status was CODE
  [ "$RC" -eq "$1" ] || fail "$2: exit status $RC, expected $1"
}
# Until a heapd answers in RUNTIME_DIR (a socket file alone may be a stale
# one that a killed heapd left).
wait_for_socket() {  # wait_for_socket RUNTIME_DIR
  for _ in $(seq 600); do
    HEAPD_SOCKET="$1/heapd.sock" "$HEAPCTL" heap ls >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}
# Unprivileged checks need root, setpriv and the user nobody.
AS_NOBODY=
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && getent passwd nobody >/dev/null; then
  AS_NOBODY="setpriv --reuid=nobody --regid=nogroup --init-groups --"
else
  echo "SKIPPED the unprivileged checks: they need root, setpriv and the user nobody"
fi

"$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run" --default_max_size=1G \
  2>"$DIR/heapd.log" &
MAIN=$!
PIDS+=($MAIN)
export HEAPD_SOCKET=$DIR/run/heapd.sock
wait_for_socket "$DIR/run" || { cat "$DIR/heapd.log"; exit 1; }

echo "--- 1. a second heapd on the same runtime or state directory"
out=$("$HEAPD" --state_dir="$DIR/state2" --runtime_dir="$DIR/run" 2>&1); RC=$?
expect_rc 1 "a second heapd on the same runtime directory"
expect_in "another heapd (pid $MAIN) runs on $DIR/run" "$out"
out=$("$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run2" 2>&1); RC=$?
expect_rc 1 "a second heapd on the same state directory"
expect_in "another heapd (pid $MAIN) runs on $DIR/state" "$out"
[ -S "$DIR/run/heapd.sock" ] || fail "the first heapd's socket is gone"
"$HEAPCTL" heap ls >/dev/null || fail "the first heapd no longer answers"
[ -e "$DIR/run2/heapd.sock" ] && fail "the refused heapd made a socket"
# A socket some other process answers on is never replaced; a stale one is.
if ! command -v python3 >/dev/null; then
  echo "SKIPPED the foreign socket check: it needs python3 (tools/setup.sh installs it)"
else
mkdir -p "$DIR/other"
python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); time.sleep(600)' \
  "$DIR/other/heapd.sock" &
PY=$!
PIDS+=($PY)
for _ in $(seq 200); do [ -S "$DIR/other/heapd.sock" ] && break; sleep 0.05; done
out=$("$HEAPD" --state_dir="$DIR/state3" --runtime_dir="$DIR/other" 2>&1); RC=$?
expect_rc 1 "heapd over a socket another process serves"
expect_in "a process answers on $DIR/other/heapd.sock" "$out"
kill -9 "$PY"; wait "$PY" 2>/dev/null
[ -S "$DIR/other/heapd.sock" ] || fail "heapd removed a socket in use"
"$HEAPD" --state_dir="$DIR/state3" --runtime_dir="$DIR/other" 2>"$DIR/other.log" &  # stale now
OTHER=$!
PIDS+=($OTHER)
wait_for_socket "$DIR/other" || fail "heapd did not replace a stale socket: $(cat "$DIR/other.log")"
kill -TERM "$OTHER"; wait "$OTHER"
[ -e "$DIR/other/heapd.sock" ] && fail "heapd left its socket behind"
fi

echo "--- 2. a full heap: RESOURCE_EXHAUSTED, nothing bound; names rm repairs"
"$HEAPCTL" heap create tiny --max_size=16M >/dev/null || fail "heap create tiny"
out=$("$INGEST" --heap=tiny --scale=12 --edges=2000000 2>&1); RC=$?   # 16 MB of edges
expect_rc 1 "an ingest into a full heap"
expect_in "RESOURCE_EXHAUSTED: heap tiny" "$out"
expect_in "nothing bound to 'graph'" "$out"
case "$out" in *terminate*|*Aborted*) fail "the ingest aborted: $out" ;; esac
out=$("$HEAPCTL" names ls tiny)
case "$out" in *graph*) fail "a half-built graph is bound: $out" ;; esac
out=$("$QUERY" --heap=tiny 2>&1); RC=$?
expect_rc 1 "a query of a graph never bound"
expect_in "NOT_FOUND" "$out"
out=$("$INGEST" --heap=g --scale=10 --edges=2000 2>&1) || fail "ingest: $out"
out=$("$INGEST" --heap=g --scale=10 --edges=2000 2>&1); RC=$?
expect_rc 1 "a second ingest under a taken name"
expect_in "names rm g graph" "$out"
out=$("$HEAPCTL" names ls g)
expect_in "heapd::examples::Graph/v1" "$out"
out=$("$HEAPCTL" names rm g graph) || fail "names rm: $out"
expect_in "unbound 'graph' of heap g" "$out"
out=$("$HEAPCTL" names rm g graph 2>&1); RC=$?
expect_rc 1 "names rm of a name no longer bound"
expect_in "NOT_FOUND" "$out"
out=$("$INGEST" --heap=g --scale=10 --edges=2000 2>&1) || fail "ingest after names rm: $out"

echo "--- 3. permission problems are PERMISSION_DENIED"
if [ -n "$AS_NOBODY" ]; then
  $AS_NOBODY "$HEAPCTL" heap create ugraph --max_size=64M >/dev/null || fail "nobody's heap"
  # A store nobody may open but whose versions only root may read: the
  # check for an existing part is what meets the permission problem.
  mkdir -p "$DIR/rootstore/versions" && chmod 755 "$DIR/rootstore" &&
    chmod 700 "$DIR/rootstore/versions"
  out=$($AS_NOBODY "$HEAPCTL" snapshot create ugraph zz9 --store="$DIR/rootstore" 2>&1); RC=$?
  expect_rc 1 "a store the user may not write"
  expect_in "PERMISSION_DENIED" "$out"
  case "$out" in *ALREADY_EXISTS*) fail "said ALREADY_EXISTS: $out" ;; esac
  # names rm needs write access to the heap.
  out=$($AS_NOBODY "$HEAPCTL" names rm g graph 2>&1); RC=$?
  expect_rc 1 "names rm by a user who may not write the heap"
  expect_in "PERMISSION_DENIED" "$out"
  "$HEAPCTL" names ls g | grep -q graph || fail "names rm by another user unbound the name"
fi

echo "--- 4. an unknown log level is refused; levels are case-insensitive"
out=$("$HEAPD" --log_level=verbose --state_dir="$DIR/s4" --runtime_dir="$DIR/r4" 2>&1); RC=$?
expect_rc 2 "--log_level=verbose"
expect_in "trace, debug, info, warn, error, critical, off" "$out"
"$HEAPD" --log_level=INFO --state_dir="$DIR/s4" --runtime_dir="$DIR/r4" 2>"$DIR/r4.log" &
P4=$!
PIDS+=($P4)
wait_for_socket "$DIR/r4" || fail "heapd --log_level=INFO did not start"
kill -TERM "$P4"; wait "$P4"
expect_in "heapd serving 0 heaps" "$(cat "$DIR/r4.log")"

echo "--- 5. sizes with units; 0 and modes without owner access refused"
out=$("$HEAPCTL" heap create one --max_size=1G) || fail "--max_size=1G: $out"
expect_in "maximum 1.0 GiB" "$out"
out=$("$HEAPCTL" heap create defaulted) || fail "heap create: $out"
expect_in "maximum 1.0 GiB" "$out"   # heapd --default_max_size=1G
out=$("$HEAPCTL" heap create two --max_size=1GB 2>&1); RC=$?
expect_rc 2 "--max_size=1GB"
expect_in "1GiB" "$out"
expect_in "usage: heapctl" "$out"
out=$("$HEAPCTL" heap create two --max_size=0 2>&1); RC=$?
expect_rc 2 "--max_size=0"
out=$("$HEAPCTL" heap create two --mode=0000 2>&1); RC=$?
expect_rc 2 "--mode=0000"
expect_in "no one may read or write" "$out"
out=$("$HEAPD" --default_max_size=0 --state_dir="$DIR/s5" --runtime_dir="$DIR/r5" 2>&1); RC=$?
expect_rc 2 "heapd --default_max_size=0"
if [ -n "$GRPCURL" ]; then  # modes are numbers in JSON: 416 is 0640
  out=$("$GRPCURL" -plaintext -unix -d '{"name":"m","mode":416}' "$HEAPD_SOCKET" \
    heapd.v1.Heapd/CreateHeap 2>&1)
  expect_in '"mode": 416' "$out"
  "$HEAPCTL" heap rm m >/dev/null
fi

echo "--- 6. the CLI refuses what it would have to guess"
"$WORKER" "$HEAPD_SOCKET" g hold 6 >"$DIR/hold-g" &
HOLD=$!
PIDS+=($HOLD)
"$WORKER" "$HEAPD_SOCKET" one hold 7 >"$DIR/hold-one" &
PIDS+=($!)
for _ in $(seq 600); do grep -q synced "$DIR/hold-g" && grep -q synced "$DIR/hold-one" && break; sleep 0.05; done
out=$("$HEAPCTL" clients ls g)
expect_in " g " "$out"
case "$out" in *" one "*) fail "clients ls g listed another heap's client: $out" ;; esac
for args in "heap ls extra" "heap ls --to=/tmp" "heap rm s5 s8" "snapshot gc" "heap frob"; do
  out=$("$HEAPCTL" $args 2>&1); RC=$?
  expect_rc 2 "heapctl $args"
  expect_in "usage:" "$out"
done
out=$("$HEAPCTL" heap rm s5 s8 2>&1)
expect_in "heap rm takes NAME; got 2: s5 s8" "$out"
out=$("$HEAPCTL" snapshot gc 2>&1)
expect_in "snapshot gc needs --store=DIR" "$out"
out=$("$HEAPCTL" clients ls --heap=nosuch 2>&1); RC=$?
expect_rc 1 "clients ls --heap=nosuch"
expect_in "NOT_FOUND" "$out"
out=$("$QUERY" --heap=g --snapshot_dir="$DIR" 2>&1); RC=$?
expect_rc 2 "graph_query --snapshot_dir without --snapshot"
expect_in "--snapshot=NAME" "$out"
kill "$HOLD"; wait "$HOLD" 2>/dev/null
mkdir -p "$DIR/store"
"$HEAPCTL" snapshot create g v2 --store="$DIR/store" >/dev/null || fail "store g"
"$HEAPCTL" snapshot create defaulted v2 --store="$DIR/store" >/dev/null || fail "store defaulted"
out=$("$HEAPCTL" snapshot restore v2 --store="$DIR/store" --heap=x 2>&1); RC=$?
expect_rc 1 "an ambiguous restore"
expect_in "--from_heap=HEAP" "$out"

echo "--- 7. snapshot rm of a store part says what it removed"
out=$("$HEAPCTL" snapshot rm v2 --store="$DIR/store" --from_heap=nosuch 2>&1); RC=$?
expect_rc 1 "snapshot rm of a part that does not exist"
expect_in "NOT_FOUND" "$out"
out=$("$HEAPCTL" snapshot rm v2 --store="$DIR/store" --from_heap=defaulted) || fail "rm part: $out"
expect_in "removed part v2/" "$out"
expect_in "/defaulted" "$out"
expect_in "version v2 keeps 1 part" "$out"
[ "$("$HEAPCTL" snapshot ls --store="$DIR/store" --quiet | wc -l)" -eq 1 ] || fail "parts left"

echo "--- 8. one name, one meaning: checked against the metrics in tests/metrics_test.sh"

echo "--- 9. --version and --help"
expect_in "heapd 0." "$("$HEAPD" --version)"
expect_in "heapctl 0." "$("$HEAPCTL" --version)"
out=$("$HEAPD" --help); RC=$?
expect_rc 0 "heapd --help"
expect_in "--state_dir" "$out"
case "$out" in *"/tmp/heapd-"*) fail "heapd --help promises a /tmp socket: $out" ;; esac
out=$("$HEAPCTL" --help); RC=$?
expect_rc 0 "heapctl --help"
expect_in "names rm HEAP NAME" "$out"

echo "--- 10. snapshots a user may not read are named, not silently left out"
if [ -n "$AS_NOBODY" ]; then
  mkdir -p "$DIR/pfs" && chmod 777 "$DIR/pfs"
  $AS_NOBODY "$HEAPCTL" snapshot create ugraph mine --to="$DIR/pfs" >/dev/null || fail "nobody's snapshot"
  "$HEAPCTL" snapshot create g roots --to="$DIR/pfs" >/dev/null || fail "root's snapshot"
  chmod 700 "$DIR/pfs/roots"
  out=$($AS_NOBODY "$HEAPCTL" snapshot ls --to="$DIR/pfs" 2>&1) || fail "snapshot ls: $out"
  expect_in "mine" "$out"
  expect_in "not listed: roots" "$out"
  out=$($AS_NOBODY "$HEAPCTL" --json snapshot ls --to="$DIR/pfs" 2>&1)
  expect_in '"skipped": [' "$out"
fi

echo "--- 11. JSON says every field; LAST SYNC survives a restart; bad addresses fail at start"
out=$("$HEAPCTL" --json heap stat g)
expect_in '"owner_uid": 0' "$out"
expect_in '"capacity_bytes":' "$out"
out=$("$HEAPCTL" --json clients ls g)
expect_in '"clients": []' "$out"
out=$("$HEAPD" --metrics_address=nohost:9464 --state_dir="$DIR/s11" --runtime_dir="$DIR/r11" 2>&1); RC=$?
expect_rc 2 "--metrics_address=nohost:9464"
expect_in "does not resolve" "$out"
out=$("$HEAPD" --store_threads=0 --state_dir="$DIR/s11" --runtime_dir="$DIR/r11" 2>&1); RC=$?
expect_rc 2 "--store_threads=0"
expect_in "from 1 to 16 threads" "$out"
out=$("$HEAPD" --store_zstd_level=99 --state_dir="$DIR/s11" --runtime_dir="$DIR/r11" 2>&1); RC=$?
expect_rc 2 "--store_zstd_level=99"
expect_in "zstd levels are" "$out"
# names rm is persisted when it answers: heapd killed right after, the
# name stays unbound.
out=$("$INGEST" --heap=r --scale=8 --edges=100 2>&1) || fail "ingest into r: $out"
"$HEAPCTL" names rm r graph >/dev/null || fail "names rm r graph"
kill -9 "$MAIN"; wait "$MAIN" 2>/dev/null
"$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run" 2>>"$DIR/heapd.log" &
MAIN=$!
PIDS+=($MAIN)
wait_for_socket "$DIR/run" || fail "heapd did not restart"
out=$("$HEAPCTL" names ls r)
case "$out" in *graph*) fail "names rm was lost in a crash: $out" ;; esac
line=$("$HEAPCTL" heap ls | grep '^g ')
case "$line" in *" -") fail "LAST SYNC is '-' after a restart: $line" ;; esac
out=$("$HEAPCTL" heap rm one 2>&1) || fail "heap rm one: $out"
out=$("$HEAPCTL" heap rm g 2>&1) || fail "heap rm g: $out"   # nothing attached
"$WORKER" "$HEAPD_SOCKET" defaulted hold 8 >"$DIR/hold-8" &
HOLD=$!
PIDS+=($HOLD)
for _ in $(seq 600); do grep -q synced "$DIR/hold-8" && break; sleep 0.05; done
out=$("$HEAPCTL" heap rm defaulted 2>&1)
expect_in "has 1 client attached; detach it first" "$out"
kill "$HOLD"; wait "$HOLD" 2>/dev/null

kill -TERM "$MAIN"; wait "$MAIN"
if [ $FAILURES -ne 0 ]; then
  echo "--- heapd log"; cat "$DIR/heapd.log"
  exit 1
fi
echo "PASS"
