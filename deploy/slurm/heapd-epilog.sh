#!/bin/bash
# Slurm epilog: snapshot the heaps of the job's user to the shared file
# system before the node is reused or wiped.
#
# Policy: every heap on this node owned by SLURM_JOB_UID is snapshotted to
# $HEAPD_SNAPSHOT_DIR/USER/HEAP-JOBID with the label slurm_job_id=JOBID;
# once that succeeds, that heap's older epilog snapshots (HEAP-OTHERJOBID)
# are removed (the newest one is kept, so a failed epilog never loses the
# last good snapshot). heapd-restore.sh brings the newest back. With
# HEAPD_SNAPSHOT_STORE=1 each heap is also added, as this node's part, to
# version job-JOBID of the user's snapshot store USER/store (every node's
# epilog adds its own: one job snapshot); versions there are kept (gc is
# the user's).
#
# It runs as root, for a user who may be hostile: listing the user's heaps
# (heapd only, no path) runs as root; everything in the user's directory
# runs as the user (see heapd-slurm-lib.sh). Names read back from heapd
# are validated before use. Every heapctl call is bounded
# (HEAPD_SLURM_TIMEOUT).
#
# It logs every action, failure and skip to HEAPD_EPILOG_LOG and always
# exits 0: a failing epilog would drain the node.
set -u
HEAPD_LOG_TAG="heapd-epilog job ${SLURM_JOB_ID:-?}"
lib="$(dirname -- "${BASH_SOURCE[0]}")/heapd-slurm-lib.sh"
# shellcheck source-path=SCRIPTDIR source=heapd-slurm-lib.sh
if ! . "$lib"; then
  echo "heapd-epilog: cannot read $lib; nothing done" >&2
  exit 0
fi
heapd_load_settings

log() { heapd_log "$HEAPD_EPILOG_LOG" "$@"; }
heapd_skip() { log "skipped: $*"; }

# make_user_dir DIR: DIR ($SNAPSHOT_BASE/USER) exists and belongs to the
# job's user. The user makes it where the shared parent lets users create
# their own directories; else root makes it, and only in a parent no user
# can write to or swap (then chowns it, still in that parent, to the user).
make_user_dir() {
  local dir=$1 out
  # Root's own jobs: root acts in the directory itself, so all of it must
  # be root's.
  if [ "$JOB_UID" = 0 ] && ! heapd_root_safe_dir "$SNAPSHOT_BASE"; then
    log "not snapshotting root's heaps: $HEAPD_WHY"; return 1
  fi
  if [ ! -e "$dir" ] && [ ! -L "$dir" ]; then
    if out=$(heapd_as_user mkdir -m 0700 -- "$dir" 2>&1); then
      log "created $dir as $JOB_USER"
    elif [ "$JOB_UID" = 0 ]; then
      log "cannot create $dir: $out"; return 1
    elif ! heapd_root_safe_dir "$SNAPSHOT_BASE"; then
      log "cannot create $dir as $JOB_USER ($out), and root will not: $HEAPD_WHY"; return 1
    elif ! out=$(heapd_bounded mkdir -m 0700 -- "$dir" 2>&1 &&
      heapd_bounded chown -- "$JOB_UID:$JOB_GID" "$dir" 2>&1); then
      log "cannot create $dir as root: $out"; return 1
    else
      log "created $dir for $JOB_USER (as root: $SNAPSHOT_BASE is root's)"
    fi
  fi
  heapd_user_dir_ok "$dir" || { log "not snapshotting into $dir: $HEAPD_WHY"; return 1; }
}

main() {
  cd / || return
  local job=${SLURM_JOB_ID:-}
  # The job id becomes part of snapshot names.
  [[ $job =~ ^[0-9]{1,18}$ ]] || { log "job id '$job' is not a number; nothing to do"; return; }
  [ -n "${SLURM_JOB_UID:-}" ] || { log "no SLURM_JOB_UID; nothing to do"; return; }
  heapd_set_user "$SLURM_JOB_UID" "${SLURM_JOB_USER:-}" "${SLURM_JOB_GID:-}" ||
    { log "nothing to do: $HEAPD_WHY"; return; }
  [ -S "$HEAPD_SOCKET" ] || { log "no heapd socket at $HEAPD_SOCKET; nothing to do"; return; }

  # The user's heaps: heapd's answer only, as root.
  local out status
  out=$(heapd_ctl_root heap ls --owner="$JOB_UID" --quiet 2>&1)
  status=$?
  if [ $status -ne 0 ]; then
    log "cannot list the heaps of $JOB_USER ($(heapd_failure $status)): $out"; return
  fi
  local -a heaps=()
  local heap
  while IFS= read -r heap; do
    [ -n "$heap" ] || continue
    if heapd_valid_name "$heap"; then
      heaps+=("$heap")
    else
      heapd_skip "$(printf 'heap %q: not a name the scripts accept' "$heap")"
    fi
  done <<<"$out"
  [ ${#heaps[@]} -gt 0 ] || { log "user $JOB_USER has no heaps here"; return; }

  heapd_snapshot_base || { log "nothing snapshotted: $HEAPD_WHY"; return; }
  local dir="$SNAPSHOT_BASE/$JOB_USER"
  make_user_dir "$dir" || return

  # The user's snapshot store, made by the user in the user's directory;
  # the job's version there (a requeued job, same id, makes another).
  local store= version="job-$job"
  local restarts=${SLURM_RESTART_COUNT:-0}
  [[ $restarts =~ ^[0-9]{1,6}$ ]] || restarts=0
  [ "$restarts" -eq 0 ] || version="job-$job-r$restarts"
  if [ "$HEAPD_SNAPSHOT_STORE" = 1 ]; then
    store="$dir/store"
    if [ ! -e "$store" ] && [ ! -L "$store" ] &&
      ! out=$(heapd_as_user mkdir -m 0700 -- "$store" 2>&1); then
      log "no store: cannot create $store as $JOB_USER: $out"; store=
    elif ! heapd_user_dir_ok "$store"; then
      log "no store: $HEAPD_WHY"; store=
    fi
  fi

  # One snapshot per heap, as the user.
  local -A made=()
  local snapshot
  for heap in "${heaps[@]}"; do
    # The whole epilog is bounded too: a node does not sit in COMPLETING
    # for hours however many heaps a user made.
    if [ "$SECONDS" -ge "$HEAPD_EPILOG_TOTAL_TIMEOUT" ]; then
      log "heap $heap not snapshotted: the epilog ran out of its ${HEAPD_EPILOG_TOTAL_TIMEOUT} s"
      continue
    fi
    snapshot="$heap-$job"
    if ! heapd_valid_name "$snapshot"; then
      heapd_skip "heap $heap: the snapshot name $snapshot would be longer than 64 bytes"
      continue
    fi
    out=$(heapd_ctl_user snapshot create --to="$dir" --label="slurm_job_id=$job" \
      --wait_ms="$HEAPD_SNAPSHOT_WAIT_MS" -- "$heap" "$snapshot" 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
      log "$out"
      made[$heap]=$snapshot
    else
      log "snapshot of heap $heap FAILED ($(heapd_failure $status)): $out"
    fi
    [ -n "$store" ] || continue
    if [ "$SECONDS" -ge "$HEAPD_EPILOG_TOTAL_TIMEOUT" ]; then
      log "heap $heap not stored: the epilog ran out of its ${HEAPD_EPILOG_TOTAL_TIMEOUT} s"
      continue
    fi
    out=$(heapd_ctl_user snapshot create --store="$store" --label="slurm_job_id=$job" \
      --wait_ms="$HEAPD_SNAPSHOT_WAIT_MS" -- "$heap" "$version" 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
      log "$out"
    else
      log "store part of heap $heap FAILED ($(heapd_failure $status)): $out"
    fi
  done
  [ ${#made[@]} -gt 0 ] || return

  # Older epilog snapshots of the heaps just snapshotted, as the user.
  heapd_list_snapshots "$dir"
  status=$?
  if [ $status -ne 0 ]; then
    log "older snapshots kept: cannot list $dir ($(heapd_failure $status)): $LIST_NOTES"; return
  fi
  [ -z "$LIST_NOTES" ] || log "listing $dir: $LIST_NOTES"
  heapd_read_pairs "$LISTED"
  local i name of
  for i in "${!PAIR_NAMES[@]}"; do
    name=${PAIR_NAMES[i]} of=${PAIR_HEAPS[i]}
    [ -n "${made[$of]+set}" ] || continue
    [ "$name" != "${made[$of]}" ] || continue
    # Only the epilog's own names: a snapshot the user named otherwise is
    # the user's to keep.
    heapd_job_of "$name" "$of" >/dev/null || continue
    out=$(heapd_ctl_user snapshot rm --to="$dir" -- "$name" 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
      log "removed older snapshot $name of heap $of"
    else
      log "cannot remove older snapshot $name ($(heapd_failure $status)): $out"
    fi
  done
}

main
exit 0
