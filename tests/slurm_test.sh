#!/bin/bash
# Journey 5 with a real Slurm: single-node Slurm on localhost (munge,
# slurmctld, slurmd) with heapd's epilog installed. Job 1 ingests a graph
# into a heap through the client library and ends; the epilog snapshots it
# into a directory standing for the shared file system. A second heapd with
# its own state directory, standing for another node, restores it at the
# start of job 2, which finds the graph by name and checks it. Everything
# started here is stopped by PID at the end. Needs root and Debian's
# slurm-wlm and munge (tools/setup.sh); skips with the reason otherwise.
set -u
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: needs root to run slurmd"; exit 0; fi
for tool in slurmctld slurmd srun munged; do
  command -v "$tool" >/dev/null || { echo "SKIPPED: $tool is not installed"; exit 0; }
done
HEAPD=$PWD/daemon/heapd
HEAPCTL=$PWD/client/heapctl
INGEST=$PWD/client/examples/graph_ingest
QUERY=$PWD/client/examples/graph_query
EPILOG=$PWD/deploy/slurm/heapd-epilog.sh
RESTORE=$PWD/deploy/slurm/heapd-restore.sh
DIR=$(mktemp -d /tmp/heapd-slurm-XXXXXX)
chmod 0755 "$DIR"
PIDFILES=()
PIDS=()
cleanup() {
  for f in "${PIDFILES[@]}"; do [ -s "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  sleep 0.2
  rm -rf "$DIR"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
wait_for() {  # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 0.1; done
}

# Two heapds: node A (the job's node) and node B (where the next job lands).
for node in a b; do
  "$HEAPD" --state_dir="$DIR/$node/state" --runtime_dir="$DIR/$node/run" 2>"$DIR/$node.log" &
  PIDS+=($!)
done
wait_for 10 test -S "$DIR/a/run/heapd.fd.sock" -a -S "$DIR/b/run/heapd.fd.sock" ||
  { echo "heapd did not start"; exit 1; }
mkdir -p "$DIR/pfs"

# munge and Slurm, on ports of their own.
mkdir -p "$DIR/munge" "$DIR/spool" "$DIR/state" "$DIR/log"
chown munge:munge "$DIR/munge"
runuser -u munge -- munged --socket="$DIR/munge/munge.sock" --pid-file="$DIR/munge/munged.pid" \
  --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/seed" ||
  { echo "SKIPPED: munged does not start"; exit 0; }
PIDFILES+=("$DIR/munge/munged.pid")
cat >"$DIR/epilog" <<EOS
#!/bin/sh
HEAPD_SOCKET=$DIR/a/run/heapd.sock HEAPD_SNAPSHOT_DIR=$DIR/pfs HEAPCTL=$HEAPCTL \
HEAPD_EPILOG_LOG=$DIR/epilog.log exec $EPILOG
EOS
chmod +x "$DIR/epilog"
PORT=$((20000 + RANDOM % 20000))
HOST=$(hostname)
cat >"$DIR/slurm.conf" <<EOS
ClusterName=heapdtest
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.sock
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmdSpoolDir=$DIR/spool
StateSaveLocation=$DIR/state
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
Epilog=$DIR/epilog
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOS
export SLURM_CONF=$DIR/slurm.conf
slurmctld -f "$SLURM_CONF" && PIDFILES+=("$DIR/slurmctld.pid")
slurmd -f "$SLURM_CONF" && PIDFILES+=("$DIR/slurmd.pid")
wait_for 20 sh -c 'sinfo -h -o %t 2>/dev/null | grep -q idle' ||
  { echo "SKIPPED: Slurm did not come up"; tail "$DIR/log/"*; exit 0; }

# Job 1 on node A: ingest the graph into heap "graph".
out=$(srun -N1 -J ingest env HEAPD_SOCKET="$DIR/a/run/heapd.sock" \
  "$INGEST" --heap=graph --scale=14 --edges=200000 2>&1) || fail "job 1: $out"
case "$out" in *"ingested 200000 edges"*) ;; *) fail "job 1 said: $out" ;; esac
# Its epilog snapshots the heap to the "shared file system".
wait_for 30 sh -c "ls '$DIR/pfs/'*/graph-* >/dev/null 2>&1" || fail "no snapshot after job 1"
# The epilog logs after the snapshot is renamed into place: wait for it.
wait_for 10 grep -q "snapshot graph-" "$DIR/epilog.log" || fail "the epilog logged no snapshot"

# Job 2 on "node B": restore first (the helper), then query by name.
out=$(srun -N1 -J query env HEAPD_SOCKET="$DIR/b/run/heapd.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" \
  HEAPCTL="$HEAPCTL" sh -c "$RESTORE && $QUERY --heap=graph" 2>&1) || fail "job 2: $out"
echo "$out"
case "$out" in *"200000 edges (recorded 200000)"*) ;; *) fail "job 2 did not find the graph" ;; esac
"$HEAPCTL" --socket="$DIR/b/run/heapd.sock" names ls graph | grep -q "heapd::examples::Graph" ||
  fail "node B has no graph name"

# A second run of job 1's epilog keeps one snapshot per heap (the newest).
out=$(srun -N1 -J touch env HEAPD_SOCKET="$DIR/a/run/heapd.sock" "$QUERY" --heap=graph 2>&1) ||
  fail "job 3: $out"
wait_for 30 sh -c "[ \$(ls -d '$DIR/pfs/'*/graph-* | wc -l) -eq 1 ] && ! ls -d '$DIR/pfs/'*/graph-2 >/dev/null 2>&1" ||
  fail "older snapshots were not replaced: $(ls "$DIR/pfs/"*)"

if [ $FAILURES -ne 0 ]; then
  echo "--- slurmd log"; tail -20 "$DIR/log/slurmd.log"
  echo "--- epilog log"; cat "$DIR/epilog.log" 2>/dev/null
  exit 1
fi
echo PASS
