#!/bin/bash
# Slurm epilog: snapshot the heaps of the job's user to the shared file
# system before the node is reused or wiped.
#
# Policy: every heap on this node owned by SLURM_JOB_UID is snapshotted to
# $HEAPD_SNAPSHOT_DIR/$SLURM_JOB_USER/HEAP-JOBID with the label
# slurm_job_id=JOBID; once that succeeds, that heap's older snapshots from
# earlier jobs are removed (the newest one is kept, so a failed epilog never
# loses the last good snapshot). heapd-restore.sh brings the newest back.
#
# It logs every action and failure, and always exits 0: a failing epilog
# would drain the node.
set -u
[ -r /etc/default/heapd-slurm ] && . /etc/default/heapd-slurm
HEAPD_SOCKET=${HEAPD_SOCKET:-/run/heapd/heapd.sock}
HEAPD_SNAPSHOT_DIR=${HEAPD_SNAPSHOT_DIR:?set HEAPD_SNAPSHOT_DIR in /etc/default/heapd-slurm}
HEAPCTL=${HEAPCTL:-/usr/local/bin/heapctl}
HEAPD_EPILOG_LOG=${HEAPD_EPILOG_LOG:-/var/log/heapd-epilog.log}
HEAPD_SNAPSHOT_WAIT_MS=${HEAPD_SNAPSHOT_WAIT_MS:-10000}
JOB=${SLURM_JOB_ID:-unknown}
USER_NAME=${SLURM_JOB_USER:-$(id -nu "${SLURM_JOB_UID:-0}" 2>/dev/null)}

log() { echo "$(date -Is) heapd-epilog job $JOB: $*" >>"$HEAPD_EPILOG_LOG" 2>/dev/null; }
ctl() { "$HEAPCTL" --socket="$HEAPD_SOCKET" "$@"; }

main() {
  [ -n "${SLURM_JOB_UID:-}" ] || { log "no SLURM_JOB_UID; nothing to do"; return; }
  [ -S "$HEAPD_SOCKET" ] || { log "no heapd socket at $HEAPD_SOCKET; nothing to do"; return; }
  local heaps
  if ! heaps=$(ctl heap ls --owner="$SLURM_JOB_UID" --quiet 2>&1); then
    log "cannot list heaps: $heaps"
    return
  fi
  [ -n "$heaps" ] || { log "user $USER_NAME has no heaps here"; return; }
  local dir="$HEAPD_SNAPSHOT_DIR/$USER_NAME"
  if ! install -d -m 0700 -o "$SLURM_JOB_UID" -g "${SLURM_JOB_GID:-$SLURM_JOB_UID}" "$dir" 2>>"$HEAPD_EPILOG_LOG"; then
    log "cannot create $dir"
    return
  fi
  local heap out
  for heap in $heaps; do
    if out=$(ctl snapshot create "$heap" "$heap-$JOB" --to="$dir" --label="slurm_job_id=$JOB" \
        --wait_ms="$HEAPD_SNAPSHOT_WAIT_MS" 2>&1); then
      log "$out"
      local name of
      ctl snapshot ls --to="$dir" --quiet 2>/dev/null | while read -r name of; do
        if [ "$of" = "$heap" ] && [ "$name" != "$heap-$JOB" ]; then
          ctl snapshot rm "$name" --to="$dir" >/dev/null 2>&1 && log "removed older snapshot $name"
        fi
      done
    else
      log "snapshot of heap $heap FAILED: $out"
    fi
  done
}

main
exit 0
