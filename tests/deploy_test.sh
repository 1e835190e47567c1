#!/bin/bash
# deploy/ files are well-formed and do what they claim:
#  - the systemd unit passes `systemd-analyze verify` (with ExecStart
#    pointing at the built heapd) and carries its hardening (checked
#    directive by directive); the exposure score of
#    `systemd-analyze security --offline=yes` is printed when it can run;
#  - the Slurm scripts parse, and, against a fake heapctl that records how
#    it was called and answers with hostile names: every per-user call runs
#    as the job's user with a clean environment, only `heap ls` runs as
#    root, hostile names are skipped and logged and never executed or
#    passed on, older epilog snapshots are removed and others kept, the
#    newest snapshot is restored, squatted or symlinked user directories
#    are refused, root creates a user directory only in a root-owned
#    parent, a hung heapctl is cut off by HEAPD_SLURM_TIMEOUT, and the
#    epilog and the prolog exit 0 throughout.
# The parts that switch users need root; as another user they are skipped
# with a printed reason.
set -u
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
DIR=$(mktemp -d /tmp/heapd-deploy-XXXXXX)
chmod 0755 "$DIR"  # the job's user runs the fake heapctl from here
trap 'rm -rf "$DIR"' EXIT
# Killed (Bazel's timeout sends SIGTERM): clean up all the same.
trap 'exit 1' TERM INT HUP
UNIT=deploy/systemd/heapd.service
# The scripts as installed: root's, in a directory every user can read
# (Bazel's runfiles are under /root, which the job's user cannot reach).
mkdir -m 0755 "$DIR/libexec"
cp deploy/slurm/heapd-epilog.sh deploy/slurm/heapd-restore.sh deploy/slurm/heapd-slurm-lib.sh \
  "$DIR/libexec/"
chmod 0755 "$DIR/libexec/"*
EPILOG=$DIR/libexec/heapd-epilog.sh
RESTORE=$DIR/libexec/heapd-restore.sh

# --- systemd unit
if command -v systemd-analyze >/dev/null; then
  sed "s|/usr/local/bin/heapd|$PWD/daemon/heapd|" "$UNIT" >"$DIR/heapd.service"
  out=$(systemd-analyze verify "$DIR/heapd.service" 2>&1) || fail "systemd-analyze verify: $out"
  [ -z "$out" ] || fail "systemd-analyze warns: $out"
  if out=$(systemd-analyze security --offline=yes "$DIR/heapd.service" 2>&1); then
    echo "systemd-analyze security: $(grep -i 'overall exposure' <<<"$out")"
  else
    echo "NOTE: systemd-analyze security --offline=yes cannot run here: $(tail -1 <<<"$out")"
  fi
else
  echo "SKIPPED systemd-analyze verify: systemd-analyze is not installed"
fi
# Each directive exactly once, with this value.
for line in Type=notify Before=slurmd.service RuntimeDirectory=heapd StateDirectory=heapd \
  StateDirectoryMode=0700 NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes \
  PrivateTmp=yes 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6' ProtectKernelTunables=yes \
  ProtectKernelModules=yes ProtectControlGroups=yes RestrictSUIDSGID=yes LockPersonality=yes \
  RestrictRealtime=yes MemoryDenyWriteExecute=yes SystemCallArchitectures=native UMask=0077 \
  KillMode=mixed IPAddressDeny=any IPAddressAllow=localhost; do
  [ "$(grep -cxF -- "$line" "$UNIT")" -eq 1 ] || fail "the unit does not say $line (once)"
done
# The capabilities: exactly these four, on one line (several lines add up).
caps=$(grep '^CapabilityBoundingSet=' "$UNIT")
[ "$(grep -c '^CapabilityBoundingSet=' "$UNIT")" -eq 1 ] || fail "CapabilityBoundingSet= is not one line"
caps=$(tr ' ' '\n' <<<"${caps#*=}" | sort | tr '\n' ' ')
[ "$caps" = "CAP_KILL CAP_SETGID CAP_SETUID CAP_SYS_RESOURCE " ] ||
  fail "CapabilityBoundingSet is '$caps', not CAP_KILL CAP_SETGID CAP_SETUID CAP_SYS_RESOURCE"
grep -q '^AmbientCapabilities=.' "$UNIT" && fail "the unit grants ambient capabilities"
grep -Eq '^OOMScoreAdjust=-[0-9]+$' "$UNIT" || fail "no negative OOMScoreAdjust"
grep -Eq '^LimitNOFILE=[0-9]+$' "$UNIT" || fail "no LimitNOFILE"
for path in /var/lib/heapd /run/heapd; do
  grep -Eq "^ReadWritePaths=(.* )?$path( |\$)" "$UNIT" || fail "ReadWritePaths does not name $path"
done
grep -Eq '^ExecStart=.* --metrics_address=127\.0\.0\.1:9464( |$)' "$UNIT" ||
  fail "metrics do not listen on 127.0.0.1:9464"
grep -E '^ExecStart=' "$UNIT" | grep -q '0\.0\.0\.0\|\[::\]' && fail "ExecStart listens on every address"

# --- Slurm scripts: they parse.
for script in deploy/slurm/*.sh; do
  bash -n "$script" || fail "$script does not parse"
done

# The epilog with no heapd and a log it may write: logs, exits 0.
out=$(SLURM_JOB_ID=7 SLURM_JOB_UID=0 HEAPD_SOCKET="$DIR/none.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" \
  HEAPCTL=/bin/false HEAPD_EPILOG_LOG="$DIR/epilog0.log" HEAPD_SLURM_CONF=/nonexistent \
  bash "$EPILOG" 2>&1) || fail "the epilog exited non-zero: $out"
grep -q "no heapd socket" "$DIR/epilog0.log" || fail "the epilog did not log why it did nothing"
# Nor does a missing HEAPD_SNAPSHOT_DIR or a broken setting make it fail.
out=$(SLURM_JOB_ID=7 SLURM_JOB_UID=0 HEAPD_SOCKET="$DIR/none.sock" HEAPD_SLURM_TIMEOUT=soon \
  HEAPD_EPILOG_LOG="$DIR/epilog0.log" HEAPD_SLURM_CONF=/nonexistent bash "$EPILOG" 2>&1) ||
  fail "the epilog exited non-zero without HEAPD_SNAPSHOT_DIR: $out"
out=$(SLURM_SCRIPT_CONTEXT=prolog_slurmd SLURM_JOB_ID=7 SLURM_JOB_UID=0 \
  HEAPD_SOCKET="$DIR/none.sock" HEAPD_PROLOG_LOG="$DIR/prolog0.log" HEAPD_SLURM_CONF=/nonexistent \
  bash "$RESTORE" 2>&1) || fail "the prolog exited non-zero: $out"

# The settings file: sourced when root alone can write it, else ignored.
if [ "$(id -u)" -eq 0 ]; then
  printf 'HEAPD_SOCKET=%s\nHEAPD_EPILOG_LOG=%s\n' "$DIR/conf.sock" "$DIR/conf.log" >"$DIR/heapd-slurm"
  chmod 0644 "$DIR/heapd-slurm"
  SLURM_JOB_ID=7 SLURM_JOB_UID=0 HEAPD_SLURM_CONF="$DIR/heapd-slurm" bash "$EPILOG" >/dev/null 2>&1 ||
    fail "the epilog exited non-zero with a settings file"
  grep -q "no heapd socket at $DIR/conf.sock" "$DIR/conf.log" 2>/dev/null ||
    fail "the epilog did not read its settings file"
  chmod 0666 "$DIR/heapd-slurm"
  out=$(SLURM_JOB_ID=7 SLURM_JOB_UID=0 HEAPD_SLURM_CONF="$DIR/heapd-slurm" \
    HEAPD_EPILOG_LOG="$DIR/epilog0.log" bash "$EPILOG" 2>&1) || fail "the epilog exited non-zero"
  case "$out" in *"$DIR/heapd-slurm ignored: not root's or writable by others"*) ;;
    *) fail "the epilog sourced a settings file others can write: $out" ;;
  esac
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED the scripts against a fake heapctl: they switch users, which needs root"
  [ $FAILURES -eq 0 ] && echo PASS
  exit $((FAILURES != 0))
fi
if ! getent passwd nobody >/dev/null; then
  echo "SKIPPED the scripts against a fake heapctl: no user nobody"
  [ $FAILURES -eq 0 ] && echo PASS
  exit $((FAILURES != 0))
fi
if ! out=$(setpriv --reuid=nobody --regid=nogroup --init-groups true 2>&1); then
  # Bazel's sandbox may map no uid but root (tests/BUILD: tags no-sandbox).
  echo "SKIPPED the scripts against a fake heapctl: cannot switch to the user nobody: $out"
  echo "  uid_map: $(tr -s ' ' <"/proc/self/uid_map" 2>/dev/null | tr '\n' ';')"
  [ $FAILURES -eq 0 ] && echo PASS
  exit $((FAILURES != 0))
fi

# --- The scripts against a fake heapctl. It appends one line per call to
# calls ("uid gid : environment names : arguments, shell-quoted"), and
# answers from the mode file: "hostile" (names that would run commands or
# read as options if anything expanded, split or passed them on), or
# "hang" (never answers). A marker file is made if any hostile name ran.
JOB_UID=$(id -u nobody)
JOB_GID=$(id -g nobody)
MARK=$DIR/marker
mkdir "$DIR/fake"
: >"$DIR/fake/calls"
chmod 0666 "$DIR/fake/calls"
echo hostile >"$DIR/fake/mode"
cat >"$DIR/fake/heapctl" <<EOF
#!/bin/bash
{
  printf '%s %s : ' "\$(id -u)" "\$(id -g)"
  env | sed 's/=.*//' | sort | tr '\n' ' '
  printf ': '
  printf '%q ' "\$@"
  echo
} >>"$DIR/fake/calls"
[ "\$(cat "$DIR/fake/mode")" = hang ] && exec sleep 1000
args=" \$* "
case "\$args" in
  *" heap ls "*--owner=*)
    printf '%s\n' graph data.v1 'x; touch $MARK' '\$(touch $MARK)' '-rf' '.hidden' 'a b' '\`touch $MARK\`'
    ;;
  *" heap ls "*)
    printf '%s\n' other '\$(touch $MARK)' ;;
  *" snapshot create "*)
    echo "snapshot \${@: -1} of heap \${@: -2:1} at epoch 1 (sparse, 0 B copied)" ;;
  *" snapshot ls "*)
    printf '%s\n' 'graph-3 graph' 'graph-5 graph' 'graph-9 graph' 'graph-manual graph' \
      'data.v1-4 data.v1' 'data.v1-9 data.v1' 'graph-3 graph' \
      'x; touch $MARK graph' '\$(touch $MARK) graph' '-rf graph' '--help graph' \
      'graph-1 \$(touch $MARK)' 'graph-2  graph' 'graph-6 graph extra' \$'graph-7\tgraph' \
      'graph-8 graph;touch\${IFS}$MARK' ' graph-4 graph' '.graph-5 graph'
    # What heapctl says on stderr (a snapshot it could not list, quoting a
    # manifest's name) is never taken for a pair.
    echo 'graph-1 graph' >&2 ;;
  *" snapshot rm "* | *" snapshot restore "*)
    echo "done \${@: -1}" ;;
  *) echo "fake heapctl: unexpected call" >&2; exit 2 ;;
esac
EOF
chmod 0755 "$DIR/fake" "$DIR/fake/heapctl"
# A socket stands for heapd's (the scripts check that it is one).
python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$DIR/heapd.sock" ||
  fail "cannot make a socket"
mkdir -m 0755 "$DIR/pfs"
run_epilog() {  # run_epilog JOBID UID [VAR=VALUE...]: the epilog as slurmd runs it
  local job=$1 uid=$2; shift 2
  env -i PATH=/usr/bin:/bin SECRET_FROM_SLURMD=1 SLURM_JOB_ID="$job" SLURM_JOB_UID="$uid" \
    HEAPD_SOCKET="$DIR/heapd.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" HEAPCTL="$DIR/fake/heapctl" \
    HEAPD_EPILOG_LOG="$DIR/epilog.log" HEAPD_SLURM_CONF=/nonexistent "$@" bash "$EPILOG" >/dev/null 2>&1
}
run_prolog() {  # run_prolog UID [VAR=VALUE...]
  local uid=$1; shift
  env -i PATH=/usr/bin:/bin SECRET_FROM_SLURMD=1 SLURM_SCRIPT_CONTEXT=prolog_slurmd \
    SLURM_JOB_ID=10 SLURM_JOB_UID="$uid" HEAPD_SOCKET="$DIR/heapd.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" \
    HEAPCTL="$DIR/fake/heapctl" HEAPD_PROLOG_LOG="$DIR/prolog.log" HEAPD_SLURM_CONF=/nonexistent "$@" \
    bash "$RESTORE" >/dev/null 2>&1
}
calls() { grep -F -- "$1" "$DIR/fake/calls"; }  # the recorded calls containing $1

# 1. The epilog of job 9 of nobody: heaps listed as root, the directory
#    made (root's parent: by root, then given to nobody), snapshots made,
#    listed and pruned as nobody; hostile names skipped.
run_epilog 9 "$JOB_UID" SLURM_JOB_USER=nobody || fail "the epilog exited non-zero"
[ ! -e "$MARK" ] || fail "a hostile name ran a command (the marker exists)"
[ "$(stat -c '%u %g %a' "$DIR/pfs/nobody" 2>/dev/null)" = "$JOB_UID $JOB_GID 700" ] ||
  fail "pfs/nobody is not nobody's, mode 0700: $(stat -c '%u %g %a' "$DIR/pfs/nobody" 2>&1)"
calls 'heap ls --owner' | grep -q "^0 0 : " || fail "heap ls did not run as root"
[ "$(grep -c . "$DIR/fake/calls")" -eq "$(grep -c "^$JOB_UID $JOB_GID : \|^0 0 : .*heap ls" "$DIR/fake/calls")" ] ||
  fail "a call other than heap ls ran as someone other than nobody: $(cat "$DIR/fake/calls")"
grep -q 'SECRET_FROM_SLURMD' "$DIR/fake/calls" && fail "heapctl inherited the script's environment"
for heap in graph data.v1; do
  calls "snapshot create --to=$DIR/pfs/nobody --label=slurm_job_id=9 --wait_ms=10000 -- $heap $heap-9" |
    grep -q . || fail "no snapshot of $heap as $heap-9: $(cat "$DIR/fake/calls")"
done
[ "$(calls 'snapshot create' | wc -l)" -eq 2 ] || fail "snapshots of other names: $(calls 'snapshot create')"
removed=$(calls 'snapshot rm' | sed 's/.* -- //; s/ *$//' | sort | tr '\n' ' ')
[ "$removed" = "data.v1-4 graph-3 graph-5 " ] ||
  fail "removed '$removed', not 'data.v1-4 graph-3 graph-5 ' (the older epilog snapshots)"
# Nothing hostile reached heapctl's arguments: every name after "--" is one
# the scripts accept.
sed -n 's/.* -- //p' "$DIR/fake/calls" | tr ' ' '\n' | grep -v '^$' |
  grep -Ev '^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$' && fail "a hostile name reached heapctl"
for bad in 'x\;\ touch' '\$\(touch' '-rf' '\`touch' 'graph-1\ ' 'graph-8\ graph\;'; do
  grep -F -- "skipped: " "$DIR/epilog.log" | grep -qF -- "$bad" ||
    fail "the epilog did not log skipping $bad"
done

# 2. The prolog (heapd-restore.sh as root for nobody): the newest epilog
#    snapshot of each heap restored as nobody; hostile names skipped.
: >"$DIR/fake/calls"
run_prolog "$JOB_UID" SLURM_JOB_USER=nobody || fail "the prolog exited non-zero"
[ ! -e "$MARK" ] || fail "a hostile name ran a command in the prolog"
calls 'snapshot restore' | grep -v "^$JOB_UID $JOB_GID : " && fail "a restore did not run as nobody"
restored=$(calls 'snapshot restore' | sed 's/.*--heap=\([^ ]*\) -- \(.*\) $/\1:\2/' | sort | tr '\n' ' ')
[ "$restored" = "data.v1:data.v1-9 graph:graph-9 " ] ||
  fail "restored '$restored', not 'data.v1:data.v1-9 graph:graph-9 '"
calls 'heap ls' | grep -q '^0 0 : ' || fail "the prolog's heap ls did not run as root"
grep -q 'skipped: snapshot listed as x' "$DIR/prolog.log" || fail "the prolog did not log skipping"
# The tier restores go onto (HEAPD_RESTORE_STORAGE): passed to every
# restore; a value that is not a tier name restores nothing, said why.
: >"$DIR/fake/calls"
run_prolog "$JOB_UID" SLURM_JOB_USER=nobody HEAPD_RESTORE_STORAGE=nvme || fail "the prolog exited non-zero"
[ "$(calls 'snapshot restore' | grep -c -- ' --storage=nvme ')" -eq 2 ] ||
  fail "restores without --storage=nvme: $(calls 'snapshot restore')"
: >"$DIR/fake/calls"
run_prolog "$JOB_UID" SLURM_JOB_USER=nobody 'HEAPD_RESTORE_STORAGE=-x;touch' || fail "the prolog exited non-zero"
calls 'snapshot restore' && fail "a restore ran with a bad HEAPD_RESTORE_STORAGE"
grep -q 'HEAPD_RESTORE_STORAGE .* is not a tier name' "$DIR/prolog.log" ||
  fail "the prolog did not say why it restored nothing"

# 3. A hung heapctl: every call is cut off after HEAPD_SLURM_TIMEOUT; the
#    epilog goes on and still exits 0.
echo hang >"$DIR/fake/mode"
start=$SECONDS
run_epilog 11 "$JOB_UID" HEAPD_SLURM_TIMEOUT=1 || fail "the epilog exited non-zero on a hung heapctl"
[ $((SECONDS - start)) -lt 30 ] || fail "the epilog took $((SECONDS - start)) s on a hung heapctl"
grep -q 'job 11: cannot list the heaps of nobody (timed out after 1s)' "$DIR/epilog.log" ||
  fail "the epilog did not log the timeout: $(tail -3 "$DIR/epilog.log")"
start=$SECONDS
run_prolog "$JOB_UID" HEAPD_SLURM_TIMEOUT=1 || fail "the prolog exited non-zero on a hung heapctl"
[ $((SECONDS - start)) -lt 30 ] || fail "the prolog took $((SECONDS - start)) s on a hung heapctl"
echo hostile >"$DIR/fake/mode"

# 4. A user directory that is not the user's: squatted by another user, or
#    a symlink. Nothing is created in it nor restored from it.
: >"$DIR/fake/calls"
chown daemon "$DIR/pfs/nobody"
run_epilog 12 "$JOB_UID" || fail "the epilog exited non-zero"
grep -q "job 12: not snapshotting into $DIR/pfs/nobody: .* owned by uid $(id -u daemon)" "$DIR/epilog.log" ||
  fail "the epilog did not refuse a squatted directory: $(tail -2 "$DIR/epilog.log")"
run_prolog "$JOB_UID" || fail "the prolog exited non-zero"
grep -q "not restoring from $DIR/pfs/nobody" "$DIR/prolog.log" || fail "the prolog used a squatted directory"
rm -rf "$DIR/pfs/nobody"
chmod 1777 "$DIR/pfs"
setpriv --reuid=nobody --regid=nogroup --init-groups ln -s /etc "$DIR/pfs/nobody"
run_epilog 13 "$JOB_UID" || fail "the epilog exited non-zero"
grep -q "job 13: not snapshotting into $DIR/pfs/nobody: .* symbolic link" "$DIR/epilog.log" ||
  fail "the epilog did not refuse a symlink: $(tail -2 "$DIR/epilog.log")"
calls 'snapshot' && fail "snapshot calls into a squatted or symlinked directory"
rm -f "$DIR/pfs/nobody"

# 5. A parent users may write to (1777): nobody makes its own directory.
run_epilog 14 "$JOB_UID" || fail "the epilog exited non-zero"
grep -q "job 14: created $DIR/pfs/nobody as nobody" "$DIR/epilog.log" ||
  fail "nobody did not make its own directory: $(tail -2 "$DIR/epilog.log")"
[ "$(stat -c %u "$DIR/pfs/nobody")" = "$JOB_UID" ] || fail "pfs/nobody is not nobody's"
rm -rf "$DIR/pfs/nobody"
# A parent that is neither writable by nobody nor root's: root will not
# make the directory there.
chmod 0755 "$DIR/pfs"
chown daemon "$DIR/pfs"
run_epilog 15 "$JOB_UID" || fail "the epilog exited non-zero"
grep -q "job 15: cannot create $DIR/pfs/nobody as nobody .*root will not: $DIR/pfs is owned by uid" \
  "$DIR/epilog.log" || fail "root made a directory in a parent it does not own: $(tail -2 "$DIR/epilog.log")"
[ ! -e "$DIR/pfs/nobody" ] || fail "pfs/nobody was made"
chown root "$DIR/pfs"

# 6. Root's own job: only where the whole path is root's. A 1777 parent is
#    not; then root's heaps are not snapshotted.
chmod 1777 "$DIR/pfs"
: >"$DIR/fake/calls"
run_epilog 16 0 || fail "the epilog exited non-zero for root"
grep -q "job 16: not snapshotting root's heaps: $DIR/pfs (mode 1777) is writable" "$DIR/epilog.log" ||
  fail "root's job used a directory users can write: $(tail -2 "$DIR/epilog.log")"
calls 'snapshot' && fail "snapshot calls for root in a user-writable directory"
chmod 0755 "$DIR/pfs"
run_epilog 17 0 || fail "the epilog exited non-zero for root"
calls 'snapshot create' | grep -q '^0 0 : .*-- graph graph-17' || fail "root's heaps were not snapshotted"

# 7. A job user unknown to the system, or a name that disagrees with the uid.
run_epilog 18 4000000000 || fail "the epilog exited non-zero for an unknown uid"
grep -q 'job 18: nothing to do: uid 4000000000 has no passwd entry' "$DIR/epilog.log" ||
  fail "the epilog did not log an unknown uid: $(tail -1 "$DIR/epilog.log")"
run_epilog 19 "$JOB_UID" SLURM_JOB_USER=root || fail "the epilog exited non-zero"
grep -q "job 19: nothing to do: job user 'root' is not uid $JOB_UID's name" "$DIR/epilog.log" ||
  fail "the epilog trusted a user name that is not the uid's: $(tail -1 "$DIR/epilog.log")"

# 8. Exit status: run by a user, heapd-restore.sh says when a restore asked
#    for failed; run by root for a job, it never fails, even when Slurm sets
#    no SLURM_SCRIPT_CONTEXT.
out=$(setpriv --reuid=nobody --regid=nogroup --init-groups env -i PATH=/usr/bin:/bin \
  HEAPD_SOCKET="$DIR/heapd.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" HEAPCTL="$DIR/fake/heapctl" \
  HEAPD_SLURM_CONF=/nonexistent bash "$RESTORE" 'bad name' 2>&1) &&
  fail "heapd-restore.sh with a bad heap name exited 0: $out"
env -i PATH=/usr/bin:/bin SLURM_JOB_ID=20 SLURM_JOB_UID="$JOB_UID" HEAPD_SOCKET="$DIR/none.sock" \
  HEAPD_SNAPSHOT_DIR="$DIR/pfs" HEAPCTL="$DIR/fake/heapctl" HEAPD_PROLOG_LOG="$DIR/prolog.log" \
  HEAPD_SLURM_CONF=/nonexistent bash "$RESTORE" >/dev/null 2>&1 ||
  fail "heapd-restore.sh run by root for a job exited non-zero"

[ ! -e "$MARK" ] || fail "a hostile name ran a command (the marker exists)"
if [ $FAILURES -ne 0 ]; then
  echo "--- epilog log"; cat "$DIR/epilog.log"
  echo "--- prolog log"; cat "$DIR/prolog.log"
  exit 1
fi
echo PASS
