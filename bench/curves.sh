#!/usr/bin/env bash
# B12, B13 and B3 over raw pointers (issue 25), measured and drawn:
# reservation_bench (reserved against allocated bytes per workload),
# scale_bench (costs against heap size, names per heap, heaps per node,
# clients per heap and versions in a snapshot store)
# and raw_pointer_bench (std containers in DRAM and in a fixed-address
# heap) write CSV to DIR, and
# plot_curves.py draws them as PNGs into docs/images (Debian's
# python3-matplotlib; fixed metadata, so the same figures draw the same
# files). Runs on tmpfs (/dev/shm); about 10 minutes on 2 cores.
# Usage: bash bench/curves.sh [DIR]
#   MAX_NAMES=1000000 MAX_HEAPS=10000 MAX_HEAP_GIB=1024 bound the curves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
dir=${1:-/tmp/heapd-curves}
mkdir -p "$dir"
opts=(-c opt --copt=-O3)
bazel build "${opts[@]}" //bench:reservation_bench //bench:scale_bench //bench:raw_pointer_bench \
  //daemon:heapd
bin=$(bazel info "${opts[@]}" bazel-bin 2>/dev/null)
"$bin/bench/reservation_bench" --heapd="$bin/daemon/heapd" --csv="$dir/reservations.csv"
"$bin/bench/scale_bench" --heapd="$bin/daemon/heapd" --out_dir="$dir" \
  --max_names="${MAX_NAMES:-1000000}" --max_heaps="${MAX_HEAPS:-10000}" \
  --max_heap_gib="${MAX_HEAP_GIB:-1024}"
"$bin/bench/raw_pointer_bench" --heapd="$bin/daemon/heapd" --csv="$dir/raw_pointers.csv"
mkdir -p docs/images/data && cp "$dir"/*.csv docs/images/data/
/usr/bin/python3 bench/plot_curves.py "$dir" docs/images
