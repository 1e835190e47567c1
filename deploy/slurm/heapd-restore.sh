#!/bin/bash
# Restores a user's heaps on this node from the newest snapshots that
# heapd-epilog.sh left on the shared file system — as a Slurm prolog
# (root, SLURM_JOB_USER set) or as the first step of a job (the user's own
# heaps). A heap that already exists on this node is left alone.
#
#   heapd-restore.sh [HEAP ...]     (default: every heap with a snapshot)
#
# Exit status: 0 if every restore asked for worked (or nothing was there);
# always 0 as a Slurm prolog (a failing prolog drains the node), where
# failures are only printed to slurmd's log.
set -u
[ -r /etc/default/heapd-slurm ] && . /etc/default/heapd-slurm
HEAPD_SOCKET=${HEAPD_SOCKET:-/run/heapd/heapd.sock}
HEAPD_SNAPSHOT_DIR=${HEAPD_SNAPSHOT_DIR:?set HEAPD_SNAPSHOT_DIR in /etc/default/heapd-slurm}
HEAPCTL=${HEAPCTL:-/usr/local/bin/heapctl}
USER_NAME=${SLURM_JOB_USER:-$(id -nu)}
DIR="$HEAPD_SNAPSHOT_DIR/$USER_NAME"
ctl() { "$HEAPCTL" --socket="$HEAPD_SOCKET" "$@"; }

[ -d "$DIR" ] || { echo "heapd-restore: no snapshots in $DIR"; exit 0; }
snapshots=$(ctl snapshot ls --to="$DIR" --quiet) || exit 1
present=" $(ctl heap ls --quiet | tr '\n' ' ') "
wanted=" $* "
status=0
# Newest snapshot of each heap: names are HEAP-JOBID; the highest job id wins.
for heap in $(echo "$snapshots" | awk '{print $2}' | sort -u); do
  [ $# -eq 0 ] || [[ "$wanted" == *" $heap "* ]] || continue
  if [[ "$present" == *" $heap "* ]]; then
    echo "heapd-restore: heap $heap is already here; left alone"
    continue
  fi
  newest=$(echo "$snapshots" |
    awk -v h="$heap" '$2 == h {print substr($1, length(h) + 2), $1}' | sort -n | tail -1 |
    cut -d' ' -f2)
  ctl snapshot restore "$newest" --to="$DIR" --heap="$heap" || status=1
done
[ -n "${SLURM_SCRIPT_CONTEXT:-}" ] && exit 0
exit $status
