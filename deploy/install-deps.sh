#!/usr/bin/env bash
# Installs what packsched's C++ build, tests and tools need from Debian 12 packages; the Python
# stack (torch, transformers, numpy, grpcio, pytest, ...) comes pinned from PyPI into the project's
# venv instead (deploy/venv.sh, on Debian's python3 with python3-venv and python3-dev).
# Idempotent: packages already present are left alone, and apt-get runs only when something is
# missing. CUDA and NCCL are not installed here (they come with a GPU image); the build
# switches the CUDA/NCCL parts off when they are absent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libdlpack-dev pybind11-dev python3-dev nlohmann-json3-dev
  python3-venv python3-pip
  black flake8 clang-tidy
  libgoogle-perftools-dev
  prometheus-cpp-dev prometheus
  iproute2 nftables
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
