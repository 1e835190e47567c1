# shellcheck shell=bash
# shellcheck disable=SC2034 # JOB_USER, HEAPD_WHY, ... are for the scripts
# Shared by heapd-epilog.sh and heapd-restore.sh (sourced, not run).
#
# These scripts run as root on a shared node, on behalf of a job whose user
# may be hostile. Rules kept here:
#   - Everything done in the user's snapshot directory (create, list,
#     remove, restore) runs as the job's user (uid, gid and groups, clean
#     environment), so the kernel applies exactly that user's rights: root
#     never resolves a path the user controls. Only `heap ls`, which reads
#     from heapd and touches no path, runs as root.
#   - Every name read from heapctl's output (it may come from a manifest the
#     user wrote) must pass heapd_valid_name before it is used; anything else
#     is skipped and logged, never expanded, split or passed as an option.
#   - Every heapctl call is bounded by `timeout` (HEAPD_SLURM_TIMEOUT).
#   - Every expansion is quoted; no eval.

# Bracket ranges in regular expressions mean ASCII; messages are plain.
export LC_ALL=C
# The tools below come from the system, not from an inherited PATH.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

# Settings: /etc/default/heapd-slurm (a copy of heapd-slurm.conf), where the
# environment does not set them already (Slurm gives its prolog and epilog
# an environment of its own, not the job's).
HEAPD_SLURM_SETTINGS=(HEAPD_SOCKET HEAPD_SNAPSHOT_DIR HEAPD_SNAPSHOT_STORE HEAPCTL HEAPD_EPILOG_LOG
  HEAPD_PROLOG_LOG HEAPD_SNAPSHOT_WAIT_MS HEAPD_SLURM_TIMEOUT HEAPD_EPILOG_TOTAL_TIMEOUT
  HEAPD_RESTORE_STORAGE)
heapd_load_settings() {
  local -A from_env=()
  local var
  for var in "${HEAPD_SLURM_SETTINGS[@]}"; do
    [ -n "${!var+set}" ] && from_env[$var]=${!var}
  done
  local conf=${HEAPD_SLURM_CONF:-/etc/default/heapd-slurm} info
  # Sourced as root: only a file root alone can write.
  if [ -r "$conf" ]; then
    info=$(stat -L -c '%u %a' -- "$conf" 2>/dev/null)
    if [[ $info =~ ^0\ [0-7]*[0145][0145]$ ]]; then
      # shellcheck disable=SC1090
      . "$conf"
    else
      echo "heapd-slurm: $conf ignored: not root's or writable by others ($info)" >&2
    fi
  fi
  for var in "${!from_env[@]}"; do
    printf -v "$var" '%s' "${from_env[$var]}"
  done
  HEAPD_SOCKET=${HEAPD_SOCKET:-/run/heapd/heapd.sock}
  HEAPD_SNAPSHOT_DIR=${HEAPD_SNAPSHOT_DIR:-}
  HEAPD_SNAPSHOT_STORE=${HEAPD_SNAPSHOT_STORE:-0}
  HEAPCTL=${HEAPCTL:-/usr/local/bin/heapctl}
  HEAPD_EPILOG_LOG=${HEAPD_EPILOG_LOG:-/var/log/heapd-epilog.log}
  HEAPD_PROLOG_LOG=${HEAPD_PROLOG_LOG:-/var/log/heapd-prolog.log}
  HEAPD_SNAPSHOT_WAIT_MS=${HEAPD_SNAPSHOT_WAIT_MS:-10000}
  HEAPD_SLURM_TIMEOUT=${HEAPD_SLURM_TIMEOUT:-300}
  HEAPD_EPILOG_TOTAL_TIMEOUT=${HEAPD_EPILOG_TOTAL_TIMEOUT:-1800}
  HEAPD_RESTORE_STORAGE=${HEAPD_RESTORE_STORAGE:-}
  [[ $HEAPD_EPILOG_TOTAL_TIMEOUT =~ ^[0-9]{1,6}$ ]] || HEAPD_EPILOG_TOTAL_TIMEOUT=1800
  # A malformed number would make `timeout` or heapctl fail every call.
  [[ $HEAPD_SNAPSHOT_WAIT_MS =~ ^[0-9]{1,9}$ ]] || HEAPD_SNAPSHOT_WAIT_MS=10000
  [[ $HEAPD_SLURM_TIMEOUT =~ ^[0-9]{1,6}$ ]] && [ "$HEAPD_SLURM_TIMEOUT" -gt 0 ] ||
    HEAPD_SLURM_TIMEOUT=300
}

# heapd's rule for heap and snapshot names (heap/heap_name.cc): 1 to 64 of
# [A-Za-z0-9._-], not starting with '.'. Stricter here: not starting with
# '-' either, so that no name can ever be read as an option by a tool.
HEAPD_NAME_RE='^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$'
heapd_valid_name() { [[ $1 =~ $HEAPD_NAME_RE ]]; }

# A user name used as a directory name under HEAPD_SNAPSHOT_DIR: portable
# user names only (no '/', no '.' or '..', no leading '-').
heapd_valid_user() { [[ $1 =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$ ]]; }

# One line, printable ASCII only: text from heapctl may carry what a user
# wrote (a manifest's fields), which must not forge log lines.
heapd_printable() { printf '%s' "$*" | tr -c '[:print:]' ' '; }

# heapd_log FILE MESSAGE...: appends "TIME TAG: MESSAGE" to FILE (root's log)
# when FILE is set and writable, and always prints it on stdout (the job's
# output for a job step; slurmd's debug log for a prolog or epilog).
heapd_log() {
  local file=$1; shift
  local line
  line="$(date -Is) $HEAPD_LOG_TAG: $(heapd_printable "$*")"
  printf '%s\n' "$line"
  if [ -n "$file" ]; then printf '%s\n' "$line" >>"$file"; fi 2>/dev/null
  return 0
}

# The job's user. heapd_set_user UID [NAME] [GID] sets JOB_UID, JOB_USER,
# JOB_GID from the passwd database (a NAME or GID given by Slurm must agree
# with it); fails with a reason in HEAPD_WHY.
heapd_set_user() {
  local uid=$1 name=${2:-} gid=${3:-}
  if ! [[ $uid =~ ^[0-9]{1,10}$ ]]; then HEAPD_WHY="job uid '$uid' is not a number"; return 1; fi
  local entry
  if ! entry=$(getent passwd "$uid"); then HEAPD_WHY="uid $uid has no passwd entry"; return 1; fi
  local pw_name pw_gid
  IFS=: read -r pw_name _ _ pw_gid _ <<<"$entry"
  if [ -n "$name" ] && [ "$name" != "$pw_name" ]; then
    HEAPD_WHY="job user '$name' is not uid $uid's name ($pw_name)"; return 1
  fi
  if ! heapd_valid_user "$pw_name"; then HEAPD_WHY="user name '$pw_name' is not usable as a directory name"; return 1; fi
  [ -n "$gid" ] || gid=$pw_gid
  if ! [[ $gid =~ ^[0-9]{1,10}$ ]]; then HEAPD_WHY="job gid '$gid' is not a number"; return 1; fi
  JOB_UID=$uid JOB_USER=$pw_name JOB_GID=$gid
}

# heapd_ctl_root ARGS...: heapctl as root, bounded. Only for calls that
# touch no path a user controls (heap ls).
heapd_ctl_root() {
  timeout --kill-after=5 "$HEAPD_SLURM_TIMEOUT" \
    env -i PATH="$PATH" LC_ALL=C "$HEAPCTL" --socket="$HEAPD_SOCKET" "$@"
}

# heapd_as_user COMMAND ARGS...: COMMAND as the job's user: its uid, gid and
# supplementary groups (initgroups), no capabilities, no way back
# (no_new_privs), a clean environment, bounded by HEAPD_SLURM_TIMEOUT.
# When the scripts already run as that user, only the bound and the clean
# environment apply.
heapd_as_user() {
  if [ "$(id -u)" = "$JOB_UID" ]; then
    timeout --kill-after=5 "$HEAPD_SLURM_TIMEOUT" env -i PATH="$PATH" LC_ALL=C "$@"
  else
    timeout --kill-after=5 "$HEAPD_SLURM_TIMEOUT" \
      setpriv --reuid="$JOB_UID" --regid="$JOB_GID" --init-groups --no-new-privs -- \
      env -i PATH="$PATH" LC_ALL=C HOME=/ "$@"
  fi
}
# heapd_ctl_user ARGS...: heapctl as the job's user.
heapd_ctl_user() { heapd_as_user "$HEAPCTL" --socket="$HEAPD_SOCKET" "$@"; }

# Why a command failed, for the log: timeout's status 124 (137 after the
# kill) says the call was cut short.
heapd_failure() {
  case $1 in
    124 | 137) printf 'timed out after %ss' "$HEAPD_SLURM_TIMEOUT" ;;
    *) printf 'exit status %s' "$1" ;;
  esac
}

# heapd_stat PATH: "UID MODE TYPE" of PATH itself (a symlink is reported as
# one, never followed). Reading metadata as root is harmless; acting on a
# path the user controls is what the rules forbid.
heapd_stat() { heapd_bounded stat -c '%u %a %F' -- "$1" 2>/dev/null; }

# heapd_bounded COMMAND ARGS...: COMMAND, killed after HEAPD_SLURM_TIMEOUT
# (a hung file system must not hang the node either).
heapd_bounded() { timeout --kill-after=5 "$HEAPD_SLURM_TIMEOUT" "$@"; }

# heapd_root_safe_dir DIR: DIR (absolute, canonical) is a directory owned by
# root and writable by root only, and every directory above it is owned by
# root and writable by root only or sticky (like /tmp, where nobody else can
# rename root's entries). Then no user can swap DIR or anything above it,
# so root may act in it. Fails with a reason in HEAPD_WHY.
heapd_root_safe_dir() {
  local dir=$1
  if [[ $dir != /* ]]; then HEAPD_WHY="$dir is not an absolute path"; return 1; fi
  local path="" component info uid mode type last=0
  local -a components
  IFS=/ read -r -a components <<<"${dir#/}"
  local i n=${#components[@]}
  for ((i = -1; i < n; i++)); do
    if ((i >= 0)); then
      component=${components[i]}
      [ -n "$component" ] || continue
      if [ "$component" = . ] || [ "$component" = .. ]; then
        HEAPD_WHY="$dir is not canonical"; return 1
      fi
      path="${path%/}/$component"
    else
      path=/
    fi
    ((i == n - 1)) && last=1
    if ! info=$(heapd_stat "$path"); then HEAPD_WHY="cannot stat $path"; return 1; fi
    read -r uid mode _ <<<"$info"
    type=${info#* * }
    if [ "$type" != directory ]; then HEAPD_WHY="$path is a $type, not a directory"; return 1; fi
    if [ "$uid" != 0 ]; then HEAPD_WHY="$path is owned by uid $uid, not root"; return 1; fi
    if (((8#$mode & 8#022) != 0)) && { ((last)) || (((8#$mode & 8#1000) == 0)); }; then
      HEAPD_WHY="$path (mode $mode) is writable by group or others"; return 1
    fi
  done
}

# heapd_user_dir_ok DIR: DIR is a directory (not a symlink) owned by the
# job's user. Anything else may have been planted by someone else (a
# squatter in a shared parent): neither snapshot into it nor restore from
# it. For root's own jobs, DIR must be root-safe as well.
heapd_user_dir_ok() {
  local dir=$1 info uid type
  if ! info=$(heapd_stat "$dir"); then HEAPD_WHY="$dir does not exist"; return 1; fi
  uid=${info%% *}
  type=${info#* * }
  if [ "$type" != directory ]; then HEAPD_WHY="$dir is a $type, not a directory"; return 1; fi
  if [ "$uid" != "$JOB_UID" ]; then
    HEAPD_WHY="$dir is owned by uid $uid, not by the job's user ($JOB_UID)"; return 1
  fi
  if [ "$JOB_UID" = 0 ]; then heapd_root_safe_dir "$dir" || return 1; fi
  return 0
}

# heapd_snapshot_base: HEAPD_SNAPSHOT_DIR made absolute and canonical
# (symlinks in the site's own path resolved once), in SNAPSHOT_BASE.
heapd_snapshot_base() {
  if [ -z "$HEAPD_SNAPSHOT_DIR" ]; then
    HEAPD_WHY="HEAPD_SNAPSHOT_DIR is not set (see /etc/default/heapd-slurm)"; return 1
  fi
  if [[ $HEAPD_SNAPSHOT_DIR != /* ]]; then
    HEAPD_WHY="HEAPD_SNAPSHOT_DIR ($HEAPD_SNAPSHOT_DIR) is not an absolute path"; return 1
  fi
  if ! SNAPSHOT_BASE=$(heapd_bounded realpath -e -- "$HEAPD_SNAPSHOT_DIR" 2>/dev/null) ||
    [ ! -d "$SNAPSHOT_BASE" ]; then
    HEAPD_WHY="HEAPD_SNAPSHOT_DIR ($HEAPD_SNAPSHOT_DIR) is not a directory"; return 1
  fi
}

# heapd_list_snapshots DIR: `heapctl snapshot ls --to=DIR --quiet` as the
# job's user. Its standard output (SNAPSHOT HEAP pairs) goes to LISTED and
# what it says on stderr (failures; snapshots it could not list, which may
# quote a name from a manifest) to LIST_NOTES, kept apart so that no note
# can read as a pair. Returns heapctl's status.
heapd_list_snapshots() {
  local notes status
  LISTED='' LIST_NOTES=''
  notes=$(mktemp) || { LIST_NOTES="cannot make a temporary file"; return 1; }
  LISTED=$(heapd_ctl_user snapshot ls --to="$1" --quiet 2>"$notes")
  status=$?
  LIST_NOTES=$(head -c 4096 "$notes")
  rm -f "$notes"
  return $status
}

# heapd_read_pairs TEXT: TEXT is `heapctl snapshot ls --quiet` output, one
# "SNAPSHOT HEAP" a line. Sets PAIR_NAMES and PAIR_HEAPS to the valid
# pairs; reports each other line through heapd_skip (defined by the caller)
# and drops it; a name listed twice (a forged manifest can add lines) is
# taken once. Runs in the current shell (no pipeline).
heapd_read_pairs() {
  PAIR_NAMES=() PAIR_HEAPS=()
  local line name heap rest
  local -A seen=()
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    name='' heap='' rest=''
    read -r name heap rest <<<"$line"
    if [ -n "$rest" ] || [ "$line" != "$name $heap" ] || ! heapd_valid_name "$name" ||
      ! heapd_valid_name "$heap"; then
      heapd_skip "$(printf 'snapshot listed as %q: not a valid SNAPSHOT HEAP pair' "$line")"
      continue
    fi
    if [ -n "${seen[$name]+set}" ]; then
      heapd_skip "snapshot $name listed more than once"
      continue
    fi
    seen[$name]=1
    PAIR_NAMES+=("$name") PAIR_HEAPS+=("$heap")
  done <<<"$1"
}

# heapd_job_of SNAPSHOT HEAP: prints JOBID if SNAPSHOT is named HEAP-JOBID
# (the epilog's names), else fails.
heapd_job_of() {
  local name=$1 heap=$2
  [[ $name == "$heap"-* ]] || return 1
  local job=${name#"$heap"-}
  [[ $job =~ ^[0-9]{1,18}$ ]] || return 1
  printf '%s' "$job"
}
