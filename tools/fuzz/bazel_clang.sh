#!/usr/bin/env bash
# Runs Bazel with Debian's clang in an output base of its own, e.g.
#   tools/fuzz/bazel_clang.sh build --config=fuzz //heap:metadata_format_fuzz
#   tools/fuzz/bazel_clang.sh test --config=asan //...
# Why a separate output base: the C++ toolchain is auto-configured once per
# output base from CC (--config=clang sets it), so sharing the default one
# would re-configure it on every switch and throw away the gcc build's cache.
# --symlink_prefix=/ (in --config=clang) keeps the bazel-* links in the work
# tree pointing at the gcc build.
#
# This output base does not know those links for Bazel's own, so `//...`
# would walk into the gcc build's execroot through them. Each argument that
# is `//...` becomes one pattern per top-level directory holding a BUILD
# file, and `//...` inside a query expression their union.
set -euo pipefail
cd "$(dirname "$0")/../.."
output_base=${HEAPD_CLANG_OUTPUT_BASE:-${HOME:-/tmp}/.cache/heapd-clang}

patterns=()
for dir in */; do
  dir=${dir%/}
  [[ $dir == bazel-* ]] && continue
  [[ -n $(find "$dir" -name BUILD -print -quit) ]] && patterns+=("//${dir}/...")
done
union=$(printf ' + %s' "${patterns[@]}")
union="(${union:3})"

args=()
for arg in "$@"; do
  if [[ $arg == "//..." ]]; then
    args+=("${patterns[@]}")
  else
    args+=("${arg//\/\/.../${union}}")
  fi
done

# A second server costs memory on a small machine: let it go when idle.
exec bazel --output_base="${output_base}" --max_idle_secs=900 "${args[@]}"
