#!/usr/bin/env bash
# Installs heapd for programs outside this tree, into a prefix:
#
#   bash tools/install.sh [--prefix=DIR]              # default /usr/local
#   bash tools/install.sh --uninstall [--prefix=DIR]  # removes what it installed
#
# As root, or into a prefix the user owns (the Debian packages the build
# needs must be there: tools/setup.sh as root installs them). Builds with
# Bazel (-c opt) and installs:
#   bin/heapd, bin/heapctl
#   lib/libheapd.so.VERSION (soname libheapd.so.MAJOR) and its links
#   include/heapd/heapd.h (C), heapd.hpp and the C++ headers
#   lib/pkgconfig/heapd.pc, heapd-cxx.pc, heapd-fortran.pc
#   lib/cmake/heapd/heapdConfig.cmake, heapdConfigVersion.cmake
#   share/heapd/fortran/heapd.f90; with gfortran: include/heapd/gfortran/
#     heapd.mod and lib/libheapd_fortran.a
#   share/heapd/python/ (pip install PREFIX/share/heapd/python)
#   lib/systemd/system/heapd.service, libexec/heapd/ (Slurm scripts),
#   share/heapd/slurm/ (their settings and slurm.conf lines), share/doc/heapd/
#   share/heapd/install_manifest.txt: what --uninstall removes.
# Idempotent: installing again replaces the files.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
action=install
for arg in "$@"; do
  case $arg in
    --prefix=*) prefix=${arg#--prefix=} ;;
    --uninstall) action=uninstall ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (--prefix=DIR, --uninstall)" >&2; exit 2 ;;
  esac
done
[[ $prefix == /* ]] || { echo "install.sh: --prefix must be absolute: $prefix" >&2; exit 2; }
case /$prefix/ in */../* | */./*) echo "install.sh: --prefix has . or .. in it: $prefix" >&2; exit 2 ;; esac
prefix=${prefix%/}
manifest=$prefix/share/heapd/install_manifest.txt
fail() { echo "install.sh: $*" >&2; exit 1; }

# As root, every directory from / to the prefix must be root's and writable
# by no one else (a sticky one like /tmp aside): heapd, its unit and the
# Slurm scripts run as root, and a user who could change them, or swap a
# directory on the way for a link, would run code as root.
if [[ $(id -u) -eq 0 ]]; then
  dir=$prefix
  while :; do
    if [[ -e $dir || -L $dir ]]; then
      [[ ! -L $dir && -d $dir ]] || fail "$dir is not a directory (a link?): refusing to install as root"
      read -r owner mode < <(stat -c '%u %a' -- "$dir")
      if [[ $owner != 0 ]] || { ((8#$mode & 022)) && ! ((8#$mode & 01000)); }; then
        fail "$dir belongs to uid $owner, mode $mode: as root, install only where root alone writes"
      fi
    fi
    [[ $dir == / || -z $dir ]] && break
    dir=$(dirname -- "$dir")
  done
fi

# Removes what the manifest lists: only files under the prefix, named
# without . or .., whose directory is the prefix's own (no link on the way).
remove_installed() {
  [[ -f $manifest ]] || return 0
  [[ $(stat -c %u -- "$manifest") == "$(id -u)" ]] ||
    fail "$manifest is not this user's: not trusted for removal"
  local real_prefix file parent
  real_prefix=$(realpath -- "$prefix")
  while IFS= read -r file; do
    case $file in "$prefix"/*) ;; *) continue ;; esac
    case /$file/ in */../* | */./*) continue ;; esac
    parent=$(realpath -m -- "$(dirname -- "$file")")
    case $parent/ in "$real_prefix"/*) rm -f -- "$file" ;; esac
  done <"$manifest"
  rm -f -- "$manifest"
}

if [[ $action == uninstall ]]; then
  [[ -f $manifest ]] || fail "nothing installed in $prefix ($manifest missing)"
  remove_installed
  # Directories heapd alone used, if empty now.
  for dir in share/heapd/python/heapd share/heapd/python share/heapd/fortran share/heapd/slurm \
    share/heapd share/doc/heapd include/heapd/gfortran include/heapd lib/cmake/heapd \
    libexec/heapd; do
    rmdir -- "$prefix/$dir" 2>/dev/null || true
  done
  echo "heapd uninstalled from $prefix"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then bash tools/setup.sh; fi
opts=(-c opt)
bazel build "${opts[@]}" //daemon:heapd //client:heapctl //client:libheapd.so
bin=$(bazel info "${opts[@]}" bazel-bin 2>/dev/null)
version=$(sed -n 's/.*kHeapdVersion\[\] = "\(.*\)";/\1/p' protocol/version.h)
IFS=. read -r major minor _ <<<"$version"

# An earlier install goes first (another version's files must not stay);
# each file is recorded as soon as it is written, so that a failed install
# can be uninstalled too.
remove_installed
mkdir -p -- "$(dirname -- "$manifest")"
: >"$manifest"
count=0
record() {
  printf '%s\n' "$1" >>"$manifest"
  count=$((count + 1))
}
# put MODE SOURCE DESTINATION
put() {
  install -D -m "$1" -- "$2" "$3"
  record "$3"
}
# fill TEMPLATE DESTINATION: @PREFIX@, @VERSION@, @MAJOR@, @MINOR@ filled in.
prefix_sed=$(printf '%s' "$prefix" | sed 's/[|&\\]/\\&/g')
fill() {
  local filled
  filled=$(mktemp)
  sed -e "s|@PREFIX@|$prefix_sed|g" -e "s|@VERSION@|$version|g" -e "s|@MAJOR@|$major|g" \
    -e "s|@MINOR@|$minor|g" -e "s|/usr/local|$prefix_sed|g" "$1" >"$filled"
  put 0644 "$filled" "$2"
  rm -f "$filled"
}
link() {
  ln -sfn -- "$1" "$2"
  record "$2"
}

put 0755 "$bin/daemon/heapd" "$prefix/bin/heapd"
put 0755 "$bin/client/heapctl" "$prefix/bin/heapctl"
put 0755 "$bin/client/libheapd.so" "$prefix/lib/libheapd.so.$version"
link "libheapd.so.$version" "$prefix/lib/libheapd.so.$major"
link "libheapd.so.$major" "$prefix/lib/libheapd.so"
for header in include/heapd/*; do put 0644 "$header" "$prefix/$header"; done
for template in heapd.pc heapd-cxx.pc heapd-fortran.pc; do
  fill "tools/install/$template.in" "$prefix/lib/pkgconfig/$template"
done
fill tools/install/heapdConfig.cmake.in "$prefix/lib/cmake/heapd/heapdConfig.cmake"
fill tools/install/heapdConfigVersion.cmake.in "$prefix/lib/cmake/heapd/heapdConfigVersion.cmake"

put 0644 fortran/heapd.f90 "$prefix/share/heapd/fortran/heapd.f90"
if command -v gfortran >/dev/null; then
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  gfortran -O2 -fPIC -J "$build" -c fortran/heapd.f90 -o "$build/heapd.o"
  ar rcs "$build/libheapd_fortran.a" "$build/heapd.o"
  put 0644 "$build/libheapd_fortran.a" "$prefix/lib/libheapd_fortran.a"
  put 0644 "$build/heapd.mod" "$prefix/include/heapd/gfortran/heapd.mod"
else
  echo "install.sh: no gfortran: the Fortran module is installed as source only" >&2
fi

# The Python package: its source to read and test, and as an sdist that pip
# installs from anywhere (pip builds in a directory of its own; the prefix
# may not be writable), knowing this prefix (heapd_prefix.txt).
sdist=$(mktemp -d)
while IFS= read -r file; do
  put 0644 "$file" "$prefix/share/heapd/$file"
  install -D -m 0644 -- "$file" "$sdist/heapd-$version/${file#python/}"
done < <(find python -type f ! -path '*/build/*' ! -path '*.egg-info*' ! -path '*__pycache__*' \
  ! -name '*.so' | sort)
echo "$prefix" >"$sdist/heapd-$version/heapd_prefix.txt"
tar -C "$sdist" -czf "$sdist/heapd-$version.tar.gz" "heapd-$version"
put 0644 "$sdist/heapd-$version.tar.gz" "$prefix/share/heapd/python/heapd-$version.tar.gz"
rm -rf "$sdist"

fill deploy/systemd/heapd.service "$prefix/lib/systemd/system/heapd.service"
for script in heapd-epilog.sh heapd-restore.sh; do
  put 0755 "deploy/slurm/$script" "$prefix/libexec/heapd/$script"
done
put 0644 deploy/slurm/heapd-slurm-lib.sh "$prefix/libexec/heapd/heapd-slurm-lib.sh"
put 0644 deploy/slurm/heapd-slurm.conf "$prefix/share/heapd/slurm/heapd-slurm.conf"
put 0644 deploy/slurm/slurm.conf.example "$prefix/share/heapd/slurm/slurm.conf.example"
for doc in README.md docs/*.md; do put 0644 "$doc" "$prefix/share/doc/heapd/${doc#docs/}"; done

if [[ $(id -u) -eq 0 ]] && command -v ldconfig >/dev/null; then ldconfig; fi
echo "heapd $version installed in $prefix ($count files; uninstall: bash tools/install.sh --uninstall --prefix=$prefix)"
