#!/usr/bin/env bash
# Installs every Debian package that heapd's build and tests need.
# Idempotent and non-interactive: packages already present are left alone.
set -euo pipefail

packages=(
  bazel-bootstrap g++ git
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libboost-dev
  zlib1g-dev util-linux xfsprogs
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
