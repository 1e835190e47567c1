#!/usr/bin/env bash
# clang-format (Debian's clang-format-14, .clang-format) over heapd's C++.
#   tools/format.sh --check          fails listing every file that differs
#   tools/format.sh --fix [FILE...]  formats FILEs (default: every checked file)
# Checked: every tracked *.h and *.cc except those in tools/format_pending.txt,
# files not yet formatted because someone else is editing them (each owner
# runs --fix on them and removes them from the list). Ends with a line
# "format: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$clang_format" >/dev/null; then
  echo "format: $clang_format not found (tools/setup.sh installs clang-format-14)" >&2
  exit 1
fi
mode=${1:-}
[[ $mode == --check || $mode == --fix ]] || {
  echo "usage: tools/format.sh --check | --fix [FILE...]" >&2
  exit 2
}
shift

pending=$(grep -v '^#' tools/format_pending.txt | sed '/^$/d' || true)
checked=()
while IFS= read -r f; do
  grep -qxF "$f" <<<"$pending" || checked+=("$f")
done < <(git ls-files '*.h' '*.cc')

if [[ $mode == --fix ]]; then
  files=("$@")
  ((${#files[@]})) || files=("${checked[@]}")
  "$clang_format" -i --style=file "${files[@]}"
  exit 0
fi

failed=()
for f in "${checked[@]}"; do
  "$clang_format" --style=file --dry-run -Werror "$f" >/dev/null 2>&1 || failed+=("$f")
done
for f in "${failed[@]}"; do
  echo "format: $f differs from clang-format; run: tools/format.sh --fix $f"
  "$clang_format" --style=file "$f" | diff -u "$f" - | head -20 || true
done
# Pending files that conform already can leave the list.
while IFS= read -r f; do
  [[ -f $f ]] && "$clang_format" --style=file --dry-run -Werror "$f" >/dev/null 2>&1 &&
    echo "format: note: $f is formatted; remove it from tools/format_pending.txt"
done <<<"$pending"
echo "format: $((${#checked[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
((${#failed[@]} == 0))
