#!/bin/bash
# Restores a user's heaps on this node from the newest snapshots that
# heapd-epilog.sh left on the shared file system
# ($HEAPD_SNAPSHOT_DIR/USER/HEAP-JOBID: the highest JOBID of each heap wins).
# A heap that already exists on this node is left alone.
#
#   heapd-restore.sh [HEAP ...]     (default: every heap with a snapshot)
#
# Two ways to run it:
#   - as a Slurm Prolog (root, SLURM_JOB_UID set): it acts for the job's
#     user. Listing the node's heaps (heapd only, no path) runs as root;
#     listing the user's snapshot directory and restoring from it run as
#     the user (see heapd-slurm-lib.sh), so the restored heaps belong to
#     the user and root never resolves a path the user controls. It logs to
#     HEAPD_PROLOG_LOG and always exits 0 (a failing prolog drains the
#     node); so it does whenever SLURM_SCRIPT_CONTEXT is set.
#   - as the first step of a job, or by hand: it acts for whoever runs it.
#     Exit status 0 if every restore asked for worked (or nothing was
#     there), else 1.
# Every name read back from heapd is validated before use, and every
# heapctl call is bounded (HEAPD_SLURM_TIMEOUT).
set -u
HEAPD_LOG_TAG=heapd-restore
lib="$(dirname -- "${BASH_SOURCE[0]}")/heapd-slurm-lib.sh"
# shellcheck source-path=SCRIPTDIR source=heapd-slurm-lib.sh
if ! . "$lib"; then
  echo "heapd-restore: cannot read $lib; nothing done" >&2
  [ -n "${SLURM_SCRIPT_CONTEXT:-}" ] && exit 0
  exit 1
fi
heapd_load_settings

LOG_FILE=
if [ "$(id -u)" = 0 ] && [ -n "${SLURM_JOB_UID:-}" ]; then
  FOR_JOB=1
  LOG_FILE=$HEAPD_PROLOG_LOG
  HEAPD_LOG_TAG="heapd-restore job ${SLURM_JOB_ID:-?}"
else
  FOR_JOB=0
fi
log() { heapd_log "$LOG_FILE" "$@"; }
heapd_skip() { log "skipped: $*"; }

# main sets STATUS: 0, or 1 if something asked for was not restored.
STATUS=0
main() {
  cd / || { STATUS=1; return; }
  if ((FOR_JOB)); then
    heapd_set_user "$SLURM_JOB_UID" "${SLURM_JOB_USER:-}" "${SLURM_JOB_GID:-}"
  else
    heapd_set_user "$(id -u)" "" "$(id -g)"
  fi || { log "nothing restored: $HEAPD_WHY"; STATUS=1; return; }
  # The tier to restore onto (HEAPD_RESTORE_STORAGE), spelled as heapd
  # names tiers; empty: heapd's default.
  local -a storage=()
  if [ -n "$HEAPD_RESTORE_STORAGE" ]; then
    if ! heapd_valid_name "$HEAPD_RESTORE_STORAGE"; then
      log "$(printf 'nothing restored: HEAPD_RESTORE_STORAGE %q is not a tier name' "$HEAPD_RESTORE_STORAGE")"
      STATUS=1
      return
    fi
    storage=(--storage="$HEAPD_RESTORE_STORAGE")
  fi

  local -A wanted=()
  local arg
  for arg in "$@"; do
    if heapd_valid_name "$arg"; then
      wanted[$arg]=1
    else
      log "$(printf 'heap %q: not a valid heap name' "$arg")"; STATUS=1
    fi
  done
  if [ $# -gt 0 ] && [ ${#wanted[@]} -eq 0 ]; then return; fi

  [ -S "$HEAPD_SOCKET" ] || { log "no heapd socket at $HEAPD_SOCKET; nothing restored"; STATUS=1; return; }
  heapd_snapshot_base || { log "nothing restored: $HEAPD_WHY"; STATUS=1; return; }
  local dir="$SNAPSHOT_BASE/$JOB_USER"
  if [ ! -e "$dir" ] && [ ! -L "$dir" ]; then
    log "no snapshots in $dir"; return
  fi
  # A directory the user does not own may have been planted (a squatter in
  # a shared parent): its snapshots are not the user's.
  heapd_user_dir_ok "$dir" || { log "not restoring from $dir: $HEAPD_WHY"; STATUS=1; return; }

  local out status
  heapd_list_snapshots "$dir"
  status=$?
  if [ $status -ne 0 ]; then
    log "cannot list $dir ($(heapd_failure $status)): $LIST_NOTES"; STATUS=1; return
  fi
  [ -z "$LIST_NOTES" ] || log "listing $dir: $LIST_NOTES"
  heapd_read_pairs "$LISTED"

  # The newest epilog snapshot (HEAP-JOBID, highest JOBID) of each heap.
  local -A newest=() newest_job=()
  local i name heap job
  for i in "${!PAIR_NAMES[@]}"; do
    name=${PAIR_NAMES[i]} heap=${PAIR_HEAPS[i]}
    if ! job=$(heapd_job_of "$name" "$heap"); then
      log "snapshot $name of heap $heap is not named HEAP-JOBID; ignored"
      continue
    fi
    if [ -z "${newest[$heap]+set}" ] || ((10#$job > 10#${newest_job[$heap]})); then
      newest[$heap]=$name newest_job[$heap]=$job
    fi
  done
  [ ${#newest[@]} -gt 0 ] || { log "no snapshots in $dir"; return; }

  # Heaps already on the node, whoever owns them (names are node-wide).
  if ((FOR_JOB)); then
    out=$(heapd_ctl_root heap ls --quiet 2>&1)
  else
    out=$(heapd_ctl_user heap ls --quiet 2>&1)
  fi
  status=$?
  if [ $status -ne 0 ]; then
    log "nothing restored: cannot list heaps ($(heapd_failure $status)): $out"; STATUS=1; return
  fi
  local -A present=() mine=()
  while IFS= read -r heap; do
    heapd_valid_name "$heap" && present[$heap]=1
  done <<<"$out"
  # Which of them are the user's: one of another user's under the name of
  # the user's heap is worth saying (it may be squatted).
  out=$(heapd_ctl_user heap ls --owner="$JOB_UID" --quiet 2>&1) || out=""
  while IFS= read -r heap; do
    heapd_valid_name "$heap" && mine[$heap]=1
  done <<<"$out"

  local -a heaps=()
  mapfile -t heaps < <(printf '%s\n' "${!newest[@]}" | sort)
  for heap in "${heaps[@]}"; do
    if [ $# -gt 0 ] && [ -z "${wanted[$heap]+set}" ]; then continue; fi
    if [ -n "${present[$heap]+set}" ]; then
      if [ -n "${mine[$heap]+set}" ]; then
        log "heap $heap is already here; left alone"
      else
        log "heap $heap is here but another user's: snapshot ${newest[$heap]} not restored over it"
      fi
      continue
    fi
    out=$(heapd_ctl_user snapshot restore --to="$dir" --heap="$heap" ${storage[@]+"${storage[@]}"} -- "${newest[$heap]}" 2>&1)
    status=$?
    if [ $status -eq 0 ]; then
      log "$out"
    else
      log "restore of heap $heap from ${newest[$heap]} FAILED ($(heapd_failure $status)): $out"
      STATUS=1
    fi
  done
  # Heaps asked for that have no snapshot.
  for heap in "${!wanted[@]}"; do
    if [ -z "${newest[$heap]+set}" ]; then
      log "heap $heap has no snapshot in $dir"
    fi
  done
}

main "$@"
# Root acting for a job's user is a prolog, whatever Slurm calls it.
if ((FOR_JOB)) || [ -n "${SLURM_SCRIPT_CONTEXT:-}" ]; then exit 0; fi
exit $STATUS
