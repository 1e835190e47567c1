#!/usr/bin/env bash
# Installs what heapd needs, builds it and runs the daemon on its embedded
# defaults (as root: /var/lib/heapd and /run/heapd; otherwise
# ~/.local/state/heapd and $XDG_RUNTIME_DIR/heapd; without XDG_RUNTIME_DIR,
# pass --runtime_dir=DIR).
# Extra arguments go to heapd, e.g. --state_dir=/dev/shm/heapd.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build -c opt //daemon:heapd //client:heapctl //client/examples:all
exec bazel-bin/daemon/heapd "$@"
