#!/usr/bin/env bash
# Installs every Debian package that heapd's build and tests need (clang-14,
# its libFuzzer and sanitizer runtimes and llvm-14's symbolizer for the
# fuzzers and sanitizer builds, docs/testing.md), and
# grpcurl (built with Go) for the grpcurl test. Idempotent and
# non-interactive: what is already present is left alone.
set -euo pipefail

packages=(
  bazel-bootstrap g++ git
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libboost1.81-dev
  zlib1g-dev libzstd-dev libssl-dev libxxhash-dev util-linux xfsprogs e2fsprogs prometheus python3 slurm-wlm munge
  clang-14 libclang-rt-14-dev llvm-14 clang-format-14
  # Programs outside the Bazel tree (tools/install.sh, tests/consumers):
  # C, CMake, pkg-config, Fortran, Python with numpy, Open MPI.
  cmake pkg-config gfortran python3-dev python3-venv python3-numpy python3-pytest
  python3-setuptools python3-pip openmpi-bin libopenmpi-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# grpcurl, pinned, into /usr/local/bin. Go comes from the machine, else from
# Debian. A failure here only skips the grpcurl checks (they say so).
GRPCURL_VERSION=v1.9.4
if ! command -v grpcurl >/dev/null && [[ ! -x /usr/local/bin/grpcurl ]] && [[ $(id -u) -eq 0 ]]; then
  if ! command -v go >/dev/null && [[ ! -x /usr/local/go/bin/go ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends golang-go ca-certificates
  fi
  GO=$(command -v go || echo /usr/local/go/bin/go)
  echo "setup: building grpcurl ${GRPCURL_VERSION} with $("$GO" version)"
  GOBIN=/usr/local/bin "$GO" install "github.com/fullstorydev/grpcurl/cmd/grpcurl@${GRPCURL_VERSION}" ||
    echo "setup: grpcurl could not be built; the grpcurl checks will be skipped" >&2
fi
