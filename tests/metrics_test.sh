#!/bin/bash
# heapd's metrics for real: values compared with what the test did and with
# heapctl's stats; `promtool check metrics` on the exposition; the alert
# rules checked and unit-tested with promtool; the Grafana dashboard parsed
# and its metric names found in the exposition; and a real Prometheus server
# on loopback scraping heapd with deploy/prometheus's configuration.
set -u
HEAPD=$PWD/daemon/heapd
HEAPCTL=$PWD/client/heapctl
WORKER=$PWD/tests/heap_worker
DEPLOY=$PWD/deploy
DIR=$(mktemp -d /tmp/heapd-metrics-XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

# Per-heap series for one heap (the one with the most reserved bytes), size
# classes of heap h only: series stay bounded however many heaps there are.
"$HEAPD" --state_dir="$DIR/state" --runtime_dir="$DIR/run" --metrics_address=127.0.0.1:0 \
  --metrics_heaps=1 --size_class_metrics=h 2>"$DIR/heapd.log" &
PIDS+=($!)
S=$DIR/run/heapd.sock
# The sockets and the metrics line come in either order: wait for both.
PORT=
for _ in $(seq 600); do
  PORT=$(grep -o 'port [0-9]*' "$DIR/heapd.log" | head -1 | cut -d' ' -f2)
  [ -S "$DIR/run/heapd.fd.sock" ] && [ -n "$PORT" ] && break
  sleep 0.05
done
[ -n "$PORT" ] || { echo "no metrics port in the log"; cat "$DIR/heapd.log"; exit 1; }

scrape() {  # the exposition, without HTTP headers
  exec 3<>"/dev/tcp/127.0.0.1/$PORT"
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  sed '1,/^\r$/d' <&3
  exec 3<&-
}
value() {  # value METRIC_WITH_LABELS: its value in the last scrape
  grep -v '^#' "$DIR/metrics.txt" | grep -F "$1 " | head -1 | awk '{print $NF}'
}
expect_value() {  # expect_value METRIC EXPECTED
  local got
  got=$(value "$1")
  [ "$got" = "$2" ] || fail "$1 is '$got', expected $2"
}

# Before any call: the store series exist at 0 (alerts and dashboards read
# them), and no name means two things (capacity was the maximum here and
# the reserved bytes in heapctl's JSON).
scrape >"$DIR/metrics.txt"
expect_value 'heapd_store_snapshots_total{outcome="ok"}' 0
expect_value 'heapd_store_restores_total{outcome="failed"}' 0
expect_value 'heapd_store_snapshot_bytes_total{kind="stored"}' 0
grep -q 'heapd_heap_capacity_bytes' "$DIR/metrics.txt" && fail "heapd_heap_capacity_bytes is exposed"

# What the test does, to be seen in the metrics:
"$HEAPCTL" --socket="$S" heap create other --max_size=64M --fixed_address >/dev/null ||
  fail "create heap other"
"$WORKER" "$S" h alloc 1 3000 >/dev/null || fail "alloc worker"                 # attach 1
"$WORKER" "$S" h free-half 1 | grep -q "double free: INVALID_ARGUMENT" ||        # attach 2
  fail "free-half worker"
"$HEAPCTL" --socket="$S" snapshot create h quiet >/dev/null || fail "snapshot without writers"
mkdir "$DIR/store"
"$HEAPCTL" --socket="$S" snapshot create h v1 --store="$DIR/store" >/dev/null ||
  fail "store snapshot without writers"
"$HEAPCTL" --socket="$S" snapshot restore v1 --store="$DIR/store" --heap=h2 >/dev/null ||
  fail "restore from the store"
"$HEAPCTL" --socket="$S" heap rm h2 >/dev/null || fail "remove the restored heap"
"$WORKER" "$S" h alloc-forever 2 >"$DIR/w2" &                                     # attach 3, killed
W2=$!
PIDS+=($W2)
"$WORKER" "$S" h hold 3 >"$DIR/w3" &                                              # attach 4, stays
PIDS+=($!)
for _ in $(seq 600); do grep -q synced "$DIR/w2" && grep -q synced "$DIR/w3" && break; sleep 0.05; done
# A snapshot with writers attached that do not sync again fails at once.
"$HEAPCTL" --socket="$S" snapshot create h held --wait_ms=0 >/dev/null 2>&1 &&
  fail "a snapshot did not wait for the writers" 
kill -9 "$W2"
wait "$W2" 2>/dev/null
for _ in $(seq 400); do
  scrape >"$DIR/metrics.txt"
  # The killed client's end is reaped in the background.
  [ "$(value 'heapd_heap_clients{heap="h"}')" = "1" ] &&
    [ "$(value 'heapd_sessions_reclaimed_total{reason="connection_closed"}')" = "1" ] && break
  sleep 0.05
done

expect_value 'heapd_heap_clients{heap="h"}' 1
expect_value 'heapd_heaps_open' 2  # h and other
expect_value 'heapd_rpc_calls_total{code="OK",method="Attach"}' 4
expect_value 'heapd_rpc_calls_total{code="INVALID_ARGUMENT",method="Free"}' 1
expect_value 'heapd_frees_rejected_total{code="INVALID_ARGUMENT"}' 1
expect_value 'heapd_sessions_reclaimed_total{reason="connection_closed"}' 1
expect_value 'heapd_heap_names{heap="h"}' 3   # worker-1, pre-2, pre-3
version=$("$HEAPCTL" --version | awk '{print $2}')
[ "$("$HEAPD" --version)" = "heapd $version" ] || fail "heapd and heapctl differ in version"
expect_value "heapd_build_info{version=\"$version\"}" 1
expect_value 'heapd_snapshots_total{outcome="ok"}' 1
expect_value 'heapd_snapshots_total{outcome="failed"}' 1
expect_value 'heapd_store_snapshots_total{outcome="ok"}' 1
expect_value 'heapd_store_restores_total{outcome="ok"}' 1
# A growth ahead of demand that the killed client's last lease asked for
# may still be under way: take the stat and the scrape once it is done.
for _ in $(seq 400); do
  stat=$("$HEAPCTL" --socket="$S" --json heap stat h)
  want=$(echo "$stat" | grep -m1 '"capacity_bytes"' | tr -dc '0-9')
  [ "$(value 'heapd_heap_reserved_bytes{heap="h"}')" = "$want" ] && break
  sleep 0.05
  scrape >"$DIR/metrics.txt"
done
for pair in live_objects:heapd_heap_live_objects allocated_bytes:heapd_heap_allocated_bytes \
            capacity_bytes:heapd_heap_reserved_bytes max_size:heapd_heap_max_size_bytes; do
  field=${pair%%:*}
  want=$(echo "$stat" | grep -m1 "\"$field\"" | tr -dc '0-9')
  expect_value "${pair#*:}{heap=\"h\"}" "$want"
done
leased=$(value 'heapd_heap_chunks{heap="h",state="leased"}')
[ "$leased" -gt 0 ] || fail "no leased chunks while a client allocates"
reserve=$(value 'heapd_heap_chunks{heap="h",state="large_reserve"}')
[ -n "$reserve" ] || fail "no large_reserve chunk count"
small=$(value 'heapd_heap_chunks{heap="h",state="small"}')
[ "$small" -ge 0 ] && [ "$small" -lt 4096 ] || fail "unleased small chunks: $small"
[ "$(value 'heapd_leases_reclaimed_total')" -gt 0 ] || fail "the killed client's leases were not counted"
grep -q '^heapd_rpc_duration_seconds_bucket{method="Attach",le="2e-05"}' "$DIR/metrics.txt" ||
  fail "no 20 us latency bucket"
grep -q '^heapd_sync_duration_seconds_count ' "$DIR/metrics.txt" || fail "no sync histogram"
# Bounded series: heap other (nothing reserved) has no per-heap gauges but
# counts in the node totals; h has its size classes.
expect_value 'heapd_heaps_unlisted' 1
grep -q 'heap="other"' "$DIR/metrics.txt" && fail "heap other has series beyond --metrics_heaps=1"
[ "$(value 'heapd_heaps_reserved_bytes')" = "$(value 'heapd_heap_reserved_bytes{heap="h"}')" ] ||
  fail "heapd_heaps_reserved_bytes is not the sum over every heap"
grep -q '^heapd_size_class_live_objects{heap="h",size_class="' "$DIR/metrics.txt" ||
  fail "no size-class series for heap h, which --size_class_metrics names"
# The fixed-address window: other (64 MiB and its 2 MiB guard) holds part of it.
expect_value 'heapd_fixed_address_window_held_bytes' $(((64 + 2) << 20))
expect_value 'heapd_fixed_address_window_bytes' $((0x2a0000000000 - 0x110000000000))

# The exposition lints clean.
lint=$(promtool check metrics <"$DIR/metrics.txt" 2>&1) || fail "promtool check metrics failed: $lint"
[ -z "$lint" ] || fail "promtool check metrics warns: $lint"

# Alert rules and their unit tests.
promtool check rules "$DEPLOY/prometheus/alerts.yml" >/dev/null || fail "promtool check rules"
out=$(cd "$DEPLOY/prometheus" && promtool test rules alerts_test.yml 2>&1) || fail "promtool test rules: $out"

# The dashboard parses, and every metric it queries is exposed.
python3 -m json.tool "$DEPLOY/grafana/heapd-dashboard.json" >/dev/null || fail "dashboard JSON"
for name in $(grep -o 'heapd_[a-z_]*' "$DEPLOY/grafana/heapd-dashboard.json" | sort -u); do
  grep -q "^${name}[{ ]" "$DIR/metrics.txt" || fail "dashboard metric $name is not exposed"
done

# A real Prometheus scrapes heapd.
if ! command -v prometheus >/dev/null; then
  echo "SKIPPED the Prometheus scrape: prometheus is not installed (tools/setup.sh installs it)"
else
  mkdir -p "$DIR/prom"
  sed -e "s/localhost:9464/127.0.0.1:$PORT/" -e 's/scrape_interval: 15s/scrape_interval: 1s/' \
    "$DEPLOY/prometheus/prometheus.yml" >"$DIR/prom/prometheus.yml"
  cp "$DEPLOY/prometheus/alerts.yml" "$DIR/prom/"
  PPORT=$((20000 + RANDOM % 20000))
  prometheus --config.file="$DIR/prom/prometheus.yml" --storage.tsdb.path="$DIR/prom/data" \
    --web.listen-address="127.0.0.1:$PPORT" >"$DIR/prom/log" 2>&1 &
  PIDS+=($!)
  want=$(value 'heapd_heap_live_objects{heap="h"}')
  got=
  for _ in $(seq 150); do
    got=$(promtool query instant "http://127.0.0.1:$PPORT" 'heapd_heap_live_objects{heap="h"}' 2>/dev/null |
      sed -n 's/.*=> \([0-9.e+]*\) @.*/\1/p')
    [ -n "$got" ] && break
    sleep 0.2
  done
  [ "$got" = "$want" ] || {
    fail "Prometheus has heapd_heap_live_objects '$got', heapd says $want"
    promtool query instant "http://127.0.0.1:$PPORT" 'heapd_heap_live_objects{heap="h"}'
    tail "$DIR/prom/log"
  }
  up=$(promtool query instant "http://127.0.0.1:$PPORT" 'up{job="heapd"}' 2>/dev/null | sed -n 's/.*=> \([0-9]*\) @.*/\1/p')
  [ "$up" = "1" ] || fail "Prometheus sees up{job=heapd} = '$up'"
fi

if [ $FAILURES -ne 0 ]; then
  echo "--- heapd log"; cat "$DIR/heapd.log"
  exit 1
fi
echo PASS
