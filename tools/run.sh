#!/usr/bin/env bash
# Installs what heapd needs, builds it and runs it on its embedded defaults.
# Until the daemon lands (issue 3) this runs the persistent heap core's
# end-to-end demo: create a heap, build a graph in it, sync, reopen, find it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //heap:heap_demo
exec bazel-bin/heap/heap_demo "$@"
