#!/bin/bash
# deploy/ files are well-formed: the systemd unit passes
# `systemd-analyze verify` (with ExecStart pointing at the built heapd), the
# Slurm scripts parse, and the epilog exits 0 even when nothing works.
set -u
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
DIR=$(mktemp -d /tmp/heapd-deploy-XXXXXX)
trap 'rm -rf "$DIR"' EXIT

if command -v systemd-analyze >/dev/null; then
  sed "s|/usr/local/bin/heapd|$PWD/daemon/heapd|" deploy/systemd/heapd.service >"$DIR/heapd.service"
  out=$(systemd-analyze verify "$DIR/heapd.service" 2>&1) || fail "systemd-analyze verify: $out"
  [ -z "$out" ] || fail "systemd-analyze warns: $out"
  grep -q '^Type=notify' deploy/systemd/heapd.service || fail "the unit is not Type=notify"
  grep -q '^Before=slurmd.service' deploy/systemd/heapd.service || fail "not ordered before slurmd"
else
  echo "SKIPPED systemd-analyze verify: systemd-analyze is not installed"
fi

for script in deploy/slurm/*.sh; do
  bash -n "$script" || fail "$script does not parse"
done
# The epilog with no heapd and a log it may write: logs, exits 0.
out=$(SLURM_JOB_ID=7 SLURM_JOB_UID=0 HEAPD_SOCKET="$DIR/none.sock" HEAPD_SNAPSHOT_DIR="$DIR/pfs" \
  HEAPCTL=/bin/false HEAPD_EPILOG_LOG="$DIR/epilog.log" bash deploy/slurm/heapd-epilog.sh 2>&1)
[ $? -eq 0 ] || fail "the epilog exited non-zero: $out"
grep -q "no heapd socket" "$DIR/epilog.log" || fail "the epilog did not log why it did nothing"

[ $FAILURES -eq 0 ] && echo PASS
exit $((FAILURES != 0))
