#!/bin/bash
# Journey 5 with a real Slurm: single-node Slurm on localhost (munge,
# slurmctld, slurmd) with heapd's epilog and prolog installed, and jobs
# that run as an unprivileged user (nobody: root submits with
# `srun --uid=nobody --gid=nogroup`, which Slurm 22.05 allows root). Two
# heapds with their own state directories stand for two nodes: A, where the
# jobs run and the epilog snapshots, and B, where the prolog restores.
#
#   job 1 (on A) ingests a graph into heap "graph" through the client
#     library; its epilog snapshots the heap into nobody's directory of a
#     directory standing for the shared file system, as nobody (the
#     directory is made by root in the root-owned parent and given to
#     nobody; the snapshot belongs to nobody).
#   then, as nobody, hostile entries are planted in that directory: names
#     with spaces, ';', '$(...)', backquotes or a leading '-', and copies of
#     the snapshot whose manifests name such things. Nothing may run (marker
#     files must not appear) and every epilog and prolog still succeeds
#     (the node is not drained).
#   job 2's prolog restores the graph on node B as nobody (the heap is
#     nobody's); the job runs heapd-restore.sh itself (the heap is already
#     there: left alone) and finds the graph by name.
#   job 3 on A ends; its epilog keeps only the newest snapshot.
#
# The heapds run with only the capabilities heapd's systemd unit leaves
# (CAP_SETUID CAP_SETGID CAP_KILL CAP_SYS_RESOURCE), no_new_privs and umask
# 077, as under the unit (HEAPD_SLURM_TEST_ALL_CAPS=1 gives them all of
# root's, to tell a capability problem from another). Everything started here is stopped by PID at the
# end. Only loopback addresses are used. Needs root, Debian's slurm-wlm and
# munge (tools/setup.sh), setpriv and the user nobody; skips with the reason
# otherwise.
set -u
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: needs root to run slurmd"; exit 0; fi
for tool in slurmctld slurmd srun sinfo munged setpriv; do
  command -v "$tool" >/dev/null || { echo "SKIPPED: $tool is not installed"; exit 0; }
done
if ! getent passwd nobody >/dev/null || ! getent group nogroup >/dev/null; then
  echo "SKIPPED: no user nobody or group nogroup"; exit 0
fi
JOB_UID=$(id -u nobody)
JOB_GID=$(getent group nogroup | cut -d: -f3)
as_nobody() { setpriv --reuid="$JOB_UID" --regid="$JOB_GID" --init-groups -- "$@"; }

DIR=$(mktemp -d /tmp/heapd-slurm-XXXXXX)
chmod 0755 "$DIR"
# The job's user cannot reach Bazel's output tree (under /root): the
# programs and scripts are copied where it can, as an install would.
mkdir -m 0755 "$DIR/bin" "$DIR/libexec"
cp daemon/heapd client/heapctl client/examples/graph_ingest client/examples/graph_query "$DIR/bin/"
cp deploy/slurm/heapd-epilog.sh deploy/slurm/heapd-restore.sh deploy/slurm/heapd-slurm-lib.sh \
  "$DIR/libexec/"
chmod 0755 "$DIR/bin/"* "$DIR/libexec/"*
HEAPD=$DIR/bin/heapd
HEAPCTL=$DIR/bin/heapctl
INGEST=$DIR/bin/graph_ingest
QUERY=$DIR/bin/graph_query
RESTORE=$DIR/libexec/heapd-restore.sh
# What a hostile name would create, relative to where it ran, if anything
# ever expanded one.
HOSTILE_MARK=heapd-hostile-$$
PIDFILES=()
PIDS=()
cleanup() {
  for f in "${PIDFILES[@]}"; do [ -s "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  sleep 0.2
  rm -rf "$DIR"
  rm -f "/$HOSTILE_MARK"
}
trap cleanup EXIT
# Killed (Bazel's timeout sends SIGTERM): clean up all the same.
trap 'exit 1' TERM INT HUP
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
wait_for() {  # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $deadline ] || return 1; sleep 0.1; done
}
ctl() { local node=$1; shift; "$HEAPCTL" --socket="$DIR/$node/run/heapd.sock" "$@"; }

# Two heapds: node A (the jobs' node) and node B (where the next job lands),
# with the unit's privileges. Their runtime directories' parents are
# reachable by every user, as /run is.
UNIT_CAPS=-all,+setuid,+setgid,+kill,+sys_resource
# Bits 5, 6, 7 and 24, as far as this machine's bounding set has them
# (some containers lack CAP_SYS_RESOURCE).
OWN_CAPS=$(sed -n 's/^CapBnd:\t*//p' /proc/self/status)
UNIT_CAP_MASK=$(printf '%016x' $((0x$OWN_CAPS & 0x10000e0)))
[ "$UNIT_CAP_MASK" = 00000000010000e0 ] ||
  echo "NOTE: this machine's capability bounding set lacks some of the unit's ($UNIT_CAP_MASK)"
if [ "${HEAPD_SLURM_TEST_ALL_CAPS:-0}" = 1 ]; then
  UNIT_CAPS=+all
  echo "NOTE: heapd runs with all of root's capabilities (HEAPD_SLURM_TEST_ALL_CAPS=1)"
fi
for node in a b; do
  mkdir -m 0755 "$DIR/$node"
  (
    umask 077
    exec setpriv --bounding-set="$UNIT_CAPS" --no-new-privs -- \
      "$HEAPD" --state_dir="$DIR/$node/state" --runtime_dir="$DIR/$node/run" 2>"$DIR/$node.log"
  ) &
  PIDS+=($!)
done
wait_for 10 test -S "$DIR/a/run/heapd.fd.sock" -a -S "$DIR/b/run/heapd.fd.sock" ||
  { echo "heapd did not start"; cat "$DIR/a.log" "$DIR/b.log"; exit 1; }
if [ "$UNIT_CAPS" != +all ]; then
  for pid in "${PIDS[@]}"; do
    [ "$(sed -n 's/^CapEff:\t*//p' "/proc/$pid/status")" = "$UNIT_CAP_MASK" ] ||
      fail "heapd $pid does not run with the unit's capabilities: $(grep Cap "/proc/$pid/status")"
  done
fi
# The shared file system: root's, not writable by users, so the epilog
# makes nobody's directory as root and gives it to nobody.
mkdir -m 0755 "$DIR/pfs"
SNAPS=$DIR/pfs/nobody

# munge and Slurm, on ports of their own.
mkdir -p "$DIR/munge" "$DIR/spool" "$DIR/state" "$DIR/log"
chown munge:munge "$DIR/munge"
runuser -u munge -- munged --socket="$DIR/munge/munge.sock" --pid-file="$DIR/munge/munged.pid" \
  --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/seed" ||
  { echo "SKIPPED: munged does not start"; exit 0; }
PIDFILES+=("$DIR/munge/munged.pid")
# The epilog and prolog as slurmd runs them (as root), pointed at this
# test's heapds and snapshot directory.
cat >"$DIR/epilog" <<EOS
#!/bin/sh
HEAPD_SLURM_CONF=/nonexistent HEAPD_SOCKET=$DIR/a/run/heapd.sock HEAPD_SNAPSHOT_DIR=$DIR/pfs \
HEAPD_SNAPSHOT_STORE=1 HEAPCTL=$HEAPCTL HEAPD_EPILOG_LOG=$DIR/epilog.log HEAPD_SLURM_TIMEOUT=60 \
exec $DIR/libexec/heapd-epilog.sh
EOS
cat >"$DIR/prolog" <<EOS
#!/bin/sh
HEAPD_SLURM_CONF=/nonexistent HEAPD_SOCKET=$DIR/b/run/heapd.sock HEAPD_SNAPSHOT_DIR=$DIR/pfs \
HEAPCTL=$HEAPCTL HEAPD_PROLOG_LOG=$DIR/prolog.log HEAPD_SLURM_TIMEOUT=60 \
exec $DIR/libexec/heapd-restore.sh
EOS
chmod 0755 "$DIR/epilog" "$DIR/prolog"
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
Prolog=$DIR/prolog
PrologEpilogTimeout=300
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOS
chmod 0644 "$DIR/slurm.conf"
export SLURM_CONF=$DIR/slurm.conf
slurmctld -f "$SLURM_CONF" && PIDFILES+=("$DIR/slurmctld.pid")
slurmd -f "$SLURM_CONF" && PIDFILES+=("$DIR/slurmd.pid")
wait_for 20 sh -c 'sinfo -h -o %t 2>/dev/null | grep -q idle' ||
  { echo "SKIPPED: Slurm did not come up"; tail "$DIR/log/"*; exit 0; }
node_state() { sinfo -h -N -o %T 2>/dev/null | head -1; }
# job NAME COMMAND...: a job of nobody's; prints its output (the job id
# first). It starts once the node is idle (the last job's epilog done): a
# job that had to queue would be told of its allocation by slurmctld
# calling srun back at the host's name, which may not be loopback.
job() {
  local name=$1; shift
  wait_for 60 sh -c 'sinfo -h -N -o %T 2>/dev/null | grep -qx idle' ||
    echo "the node is not idle: $(node_state)"
  # shellcheck disable=SC2016 # expanded by the job's shell
  srun --uid=nobody --gid=nogroup --chdir=/ -N1 -J "$name" \
    sh -c 'echo "job $SLURM_JOB_ID as $(id -u)"; exec "$@"' sh "$@" 2>&1
}
job_id() { sed -n 's/^job \([0-9]*\) as .*/\1/p' <<<"$1"; }

# Job 1 on node A: ingest the graph into heap "graph", as nobody.
out=$(job ingest env HEAPD_SOCKET="$DIR/a/run/heapd.sock" "$INGEST" --heap=graph --scale=14 \
  --edges=200000) || fail "job 1: $out"
case "$out" in *"job "*" as $JOB_UID"*) ;; *) fail "job 1 did not run as nobody: $out" ;; esac
case "$out" in *"ingested 200000 edges"*) ;; *) fail "job 1 said: $out" ;; esac
JOB1=$(job_id "$out")
ctl a heap ls --owner="$JOB_UID" --quiet | grep -qx graph || fail "heap graph is not nobody's on node A"
# Its epilog snapshots the heap to the "shared file system" as nobody.
wait_for 30 test -d "$SNAPS/graph-$JOB1" || fail "no snapshot graph-$JOB1 after job 1"
# The epilog logs after the snapshot is renamed into place: wait for it.
wait_for 10 grep -q "snapshot graph-$JOB1 of heap graph" "$DIR/epilog.log" ||
  fail "the epilog logged no snapshot"
[ "$(stat -c '%u %a' "$SNAPS" 2>&1)" = "$JOB_UID 700" ] ||
  fail "$SNAPS is not nobody's, mode 0700: $(stat -c '%u %a' "$SNAPS" 2>&1)"
[ "$(stat -c %u "$SNAPS/graph-$JOB1" 2>&1)" = "$JOB_UID" ] ||
  fail "snapshot graph-$JOB1 is not nobody's: $(ls -la "$SNAPS" 2>&1)"
# And added node A's part to the job's version in nobody's store.
wait_for 10 grep -q "part job-$JOB1/" "$DIR/epilog.log" ||
  fail "the epilog logged no store part: $(tail -5 "$DIR/epilog.log")"
out=$(as_nobody env HEAPD_SOCKET="$DIR/b/run/heapd.sock" "$HEAPCTL" snapshot verify "job-$JOB1" \
  --store="$SNAPS/store" 2>&1) || fail "the job's store version does not verify on node B: $out"
[ "$(stat -c %u "$SNAPS/store" 2>&1)" = "$JOB_UID" ] || fail "the store is not nobody's"

# Hostile entries, planted by nobody in its own directory. Should anything
# expand one of these names, it creates a marker file.
MARK=$DIR/hostile-marker
for name in "a b; touch $HOSTILE_MARK" "\$(touch $HOSTILE_MARK)" "\`touch $HOSTILE_MARK\`" \
  "-rf" "--help" "snap-1;touch $HOSTILE_MARK"; do
  as_nobody mkdir -- "$SNAPS/$name" || fail "cannot plant directory $name"
done
as_nobody touch -- "$SNAPS/x; touch $HOSTILE_MARK" "$SNAPS/-graph-9" || fail "cannot plant files"
# Copies of the real snapshot whose manifests name hostile snapshots and
# heaps (one with a newline, to forge a line of `snapshot ls --quiet`).
forged=0
if [ -e "$SNAPS/graph-$JOB1/manifest.json" ]; then
  i=0
  for fields in "x; touch $MARK|graph" "graph-1|\$(touch $MARK)" "-rf|graph" \
    "graph-2|graph\ngraph-3 \`touch $MARK\`"; do
    i=$((i + 1))
    as_nobody cp -a -- "$SNAPS/graph-$JOB1" "$SNAPS/evil-$i" &&
      as_nobody /usr/bin/python3 - "$SNAPS/evil-$i/manifest.json" "${fields%%|*}" "${fields#*|}" <<'EOF' &&
import json, sys
path, name, heap = sys.argv[1], sys.argv[2], sys.argv[3].replace("\\n", "\n")
with open(path) as f:
    manifest = json.load(f)
manifest["name"] = name
manifest["heap"] = heap
if isinstance(manifest.get("source"), dict):
    manifest["source"]["name"] = heap
with open(path, "w") as f:
    json.dump(manifest, f)
EOF
      forged=$((forged + 1))
  done
fi
echo "planted 8 hostile names and $forged forged snapshots in $SNAPS"
listing=$(as_nobody "$HEAPCTL" --socket="$DIR/a/run/heapd.sock" snapshot ls --to="$SNAPS" --quiet 2>/dev/null)
echo "heapd lists, to nobody: $(tr '\n' '|' <<<"$listing")"
# Whether heapd hands any of them to the scripts: then they must log a skip.
hostile_listed=0
while IFS= read -r line; do
  [[ $line =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\ [A-Za-z0-9_][A-Za-z0-9._-]{0,63}$ ]] ||
    hostile_listed=1
done <<<"$listing"
# The epilog run by hand on node A with all of this in place: exits 0.
out=$(env -i PATH=/usr/bin:/bin SLURM_JOB_ID=999999 SLURM_JOB_UID="$JOB_UID" SLURM_JOB_USER=nobody \
  SLURM_JOB_GID="$JOB_GID" "$DIR/epilog" 2>&1) || fail "the epilog exited non-zero: $out"
grep -q "job 999999: snapshot graph-999999 of heap graph" "$DIR/epilog.log" ||
  fail "the epilog run by hand made no snapshot: $(grep 'job 999999' "$DIR/epilog.log")"
# It removed graph-JOB1 (older), keeping graph-999999; the next epilogs
# replace that one in turn.

# Job 2 lands on "node B": its prolog (root, for nobody) restores the graph
# there; the job runs heapd-restore.sh itself, which finds it already there,
# and queries it by name.
out=$(job query env HEAPD_SOCKET="$DIR/b/run/heapd.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" \
  HEAPCTL="$HEAPCTL" HEAPD_SLURM_CONF=/nonexistent sh -c "$RESTORE && $QUERY --heap=graph") ||
  fail "job 2: $out"
echo "$out"
JOB2=$(job_id "$out")
case "$out" in *"200000 edges (recorded 200000)"*) ;; *) fail "job 2 did not find the graph" ;; esac
case "$out" in *"heap graph is already here; left alone"*) ;;
  *) fail "job 2's own restore did not find the prolog's heap" ;; esac
grep -q "job $JOB2: restored heap graph from snapshot graph-999999" "$DIR/prolog.log" ||
  fail "the prolog did not restore the newest snapshot: $(cat "$DIR/prolog.log")"
ctl b heap ls --owner="$JOB_UID" --quiet | grep -qx graph || fail "the restored heap is not nobody's"
ctl b names ls graph | grep -q "heapd::examples::Graph" || fail "node B has no graph name"

# Job 3 on A: its epilog keeps one epilog snapshot of the heap (the newest).
out=$(job touch env HEAPD_SOCKET="$DIR/a/run/heapd.sock" "$QUERY" --heap=graph) || fail "job 3: $out"
JOB3=$(job_id "$out")
wait_for 30 sh -c "[ \"\$(cd '$SNAPS' && ls -d graph-[0-9]* 2>/dev/null)\" = 'graph-$JOB3' ]" ||
  fail "older snapshots were not replaced by graph-$JOB3: $(ls "$SNAPS")"
# The prolog of job 3 (for node B) left the existing heap alone.
wait_for 10 grep -q "job $JOB3: heap graph is already here; left alone" "$DIR/prolog.log" ||
  fail "job 3's prolog did not leave node B's heap alone"

# Nothing hostile ran, nothing failed.
for marker in "$MARK" "/$HOSTILE_MARK" "$DIR/$HOSTILE_MARK" "$SNAPS/$HOSTILE_MARK" \
  "$DIR/spool/$HOSTILE_MARK"; do
  [ ! -e "$marker" ] || fail "a hostile name ran a command: $marker exists"
done
if [ $hostile_listed -eq 1 ]; then
  grep -q 'skipped: snapshot listed as' "$DIR/epilog.log" ||
    fail "heapd listed hostile snapshots but the epilog logged no skip"
  grep -q 'skipped: snapshot listed as' "$DIR/prolog.log" ||
    fail "heapd listed hostile snapshots but the prolog logged no skip"
else
  echo "NOTE: heapd listed none of the forged snapshots (the scripts' own checks are in deploy_test)"
fi
# The scripts remove only their own HEAP-JOBID snapshots.
planted=("a b; touch $HOSTILE_MARK" "-rf" "x; touch $HOSTILE_MARK")
[ $forged -eq 0 ] || planted+=(evil-1 evil-3)
for name in "${planted[@]}"; do
  [ -e "$SNAPS/$name" ] || fail "the planted $name was removed"
done
state=$(node_state)
case "$state" in idle | mixed | allocated | completing) ;;
  *) fail "the node is $state: a prolog or epilog failed" ;;
esac

if [ $FAILURES -ne 0 ]; then
  if [ "$UNIT_CAPS" != +all ] && grep -q 'PERMISSION_DENIED\|Permission denied\|Operation not permitted' \
    "$DIR/epilog.log" "$DIR/prolog.log" "$DIR/a.log" "$DIR/b.log" 2>/dev/null; then
    echo "NOTE: heapd ran with the unit's capabilities only (no CAP_DAC_OVERRIDE, CAP_CHOWN,"
    echo "  CAP_FOWNER): a heapd that works in a user's directory as root, not as the user,"
    echo "  fails here. HEAPD_SLURM_TEST_ALL_CAPS=1 runs it with all of root's."
  fi
  echo "--- slurmd log"; tail -20 "$DIR/log/slurmd.log"
  echo "--- epilog log"; cat "$DIR/epilog.log" 2>/dev/null
  echo "--- prolog log"; cat "$DIR/prolog.log" 2>/dev/null
  echo "--- heapd A"; tail -20 "$DIR/a.log"
  echo "--- heapd B"; tail -20 "$DIR/b.log"
  exit 1
fi
echo "--- epilog log"; cat "$DIR/epilog.log"
echo "--- prolog log"; cat "$DIR/prolog.log"
echo PASS
