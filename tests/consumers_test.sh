#!/bin/bash
# heapd for every program, tried as a user with only an installed prefix:
# tools/install.sh into a temporary prefix, a heapd from it, and programs
# built outside the Bazel tree — C with pkg-config, Fortran with gfortran
# (each reads the other's arrays), a CMake project in C and C++, the Python
# package in a fresh venv (its pytest suite), an MPI job, a Python process
# that also loads its own copy of gRPC — each checking data across
# processes; then the uninstall. Run by tools/test.sh (part "consumers").
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
WORK=$(mktemp -d /tmp/heapd-consumers-XXXXXX)
STATE=$(mktemp -d /dev/shm/heapd-consumers-XXXXXX)  # tmpfs: contents roll back
PREFIX=$WORK/prefix
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$WORK" "$STATE"
}
trap cleanup EXIT
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
expect_in() { case "$2" in *"$1"*) ;; *) fail "expected '$1' in: $2" ;; esac; }
step() { echo "--- $*"; }

step "install into $PREFIX"
bash tools/install.sh --prefix="$PREFIX" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; echo "FAIL: tools/install.sh"; exit 1; }
tail -1 "$WORK/install.log"
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
export PATH=$PREFIX/bin:$PATH
cd "$WORK"

"$PREFIX/bin/heapd" --state_dir="$STATE/state" --runtime_dir="$WORK/run" 2>"$WORK/heapd.log" &
PID=$!
export HEAPD_SOCKET=$WORK/run/heapd.sock
for _ in $(seq 600); do [ -S "$WORK/run/heapd.fd.sock" ] && break; sleep 0.05; done
[ -S "$WORK/run/heapd.fd.sock" ] || { cat "$WORK/heapd.log"; exit 1; }
expect_in "heapctl 0." "$(heapctl --version)"

step "C with pkg-config, Fortran with gfortran: each reads the other's arrays"
cc -Wall -Werror -o c_fields "$SRC/examples/c/fields.c" $(pkg-config --cflags --libs heapd) ||
  fail "cc with pkg-config heapd"
gfortran -Wall -o f_fields "$SRC/examples/fortran/fields.f90" \
  $(pkg-config --cflags --libs heapd-fortran heapd) || fail "gfortran with pkg-config heapd-fortran"
out=$(./c_fields write 2>&1) || fail "C write: $out"
out=$(./f_fields write 2>&1) || fail "Fortran write: $out"
out=$(./c_fields check 2>&1) || fail "C check: $out"
expect_in "f_u (from Fortran) checked" "$out"
out=$(./f_fields check 2>&1) || fail "Fortran check: $out"
expect_in "c_u (from C) checked" "$out"
# The module builds from its installed source too (other compilers do this).
gfortran -c -J "$WORK" "$PREFIX/share/heapd/fortran/heapd.f90" -o "$WORK/heapd_src.o" ||
  fail "the installed Fortran source does not compile"

step "CMake: find_package(heapd), C and C++"
cmake -S "$SRC/examples/cmake" -B cmake-build -DCMAKE_PREFIX_PATH="$PREFIX" >cmake.log 2>&1 &&
  cmake --build cmake-build >>cmake.log 2>&1 || { cat cmake.log; fail "the CMake project"; }
out=$(./cmake-build/c_counter && ./cmake-build/c_counter) || fail "c_counter: $out"
expect_in "runs 2" "$out"
out=$(./cmake-build/cxx_squares 5000 && ./cmake-build/cxx_squares) || fail "cxx_squares: $out"
expect_in "made 5000 squares" "$out"
expect_in "checked 5000 squares" "$out"
readelf -d cmake-build/c_counter | grep -q 'libheapd.so.0' || fail "c_counter does not need libheapd.so.0"

step "Python: pip install of the installed package into a fresh venv; its tests"
# Debian's Python (tools/setup.sh installs its numpy, setuptools, pytest).
/usr/bin/python3 -m venv --system-site-packages venv >/dev/null || fail "python3 -m venv"
# Debian's setuptools and numpy (system site packages): nothing downloaded.
sdist=$(ls "$PREFIX"/share/heapd/python/heapd-*.tar.gz)
venv/bin/pip install --no-build-isolation --no-index -q "$sdist" >pip.log 2>&1 ||
  { cat pip.log; fail "pip install $sdist"; }
out=$(venv/bin/python -m pytest -q -p no:cacheprovider "$PREFIX/share/heapd/python/tests" 2>&1)
echo "$out" | tail -3
echo "$out" | grep -qE '^[0-9]+ passed' && ! echo "$out" | grep -qE 'failed|error' ||
  fail "the Python package's tests: $out"
out=$(venv/bin/python "$SRC/examples/python/fields.py" 2>&1) || fail "fields.py: $out"
expect_in "f_u float64(3, 4), sum 270" "$out"

step "MPI: 4 ranks fill one array, 2 other ranks check every element"
mpi=()
[ "$(id -u)" -eq 0 ] && mpi=(--allow-run-as-root)
mpicc -o mpi_slices "$SRC/examples/mpi/mpi_slices.c" $(pkg-config --cflags --libs heapd) ||
  fail "mpicc"
out=$(mpirun "${mpi[@]}" --oversubscribe -np 4 ./mpi_slices write 50000 2>&1) ||
  fail "mpirun write: $out"
out=$(mpirun "${mpi[@]}" --oversubscribe -np 2 ./mpi_slices check 2>&1) || fail "mpirun check: $out"
expect_in "200000 elements of 4 ranks checked, 0 wrong" "$out"

step "A process that loads its own gRPC, abseil and protobuf beside libheapd"
# grpcio's wheel from PyPI (Debian's python3-grpcio, which would share
# Debian's libraries, is not installed): the one download of this suite.
if venv/bin/pip install -q grpcio >grpcio.log 2>&1 &&
  venv/bin/python -c "import grpc, os; assert 'dist-packages' not in grpc.__file__" 2>/dev/null; then
  out=$(venv/bin/python - <<'PY' 2>&1
import grpc, numpy as np, heapd   # grpcio's wheel carries its own gRPC and abseil
channel = grpc.insecure_channel("localhost:1")
with heapd.attach("fields") as heap:
    v = heap.array("grpc_too", 4, np.int64)
    v[:] = 3
    heap.sync()
    print("both", grpc.__version__, int(v.sum()))
channel.close()
PY
  ) || fail "heapd beside grpcio: $out"
  expect_in "both" "$out"
else
  echo "SKIPPED the second-copies check: grpcio could not be installed from PyPI ($(tail -1 grpcio.log))"
fi

step "uninstall (a manifest naming files outside the prefix removes none of them)"
echo keep >"$WORK/outside"
printf '%s\n' "$PREFIX/../outside" "$WORK/outside" >>"$PREFIX/share/heapd/install_manifest.txt"
bash "$SRC/tools/install.sh" --uninstall --prefix="$PREFIX" >/dev/null || fail "uninstall"
left=$(find "$PREFIX" -type f 2>/dev/null)
[ -z "$left" ] || fail "uninstall left: $left"
[ -f "$WORK/outside" ] || fail "uninstall removed a file outside the prefix"
if [ "$(id -u)" -eq 0 ] && getent passwd nobody >/dev/null; then
  # As root, never into a directory another user could change.
  mkdir -p "$WORK/users" && chown nobody "$WORK/users"
  out=$(bash "$SRC/tools/install.sh" --prefix="$WORK/users/prefix" 2>&1) &&
    fail "root installed into a prefix under a directory of nobody's"
  expect_in "as root, install only where root alone writes" "$out"
fi

kill -TERM "$PID"; wait "$PID"; PID=
if [ $FAILURES -ne 0 ]; then
  echo "--- heapd log"; tail -30 "$WORK/heapd.log"
  exit 1
fi
echo "PASS"
