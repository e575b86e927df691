#!/usr/bin/env bash
# Installs what gradzip needs on a fresh Debian 12 machine (with the CUDA
# toolkit, when there is one) and builds it. Sourced by run.sh and test.sh;
# each step skips itself when its work is already done.
#
#   GZ_BUILD_DIR   build directory (default: build)
#   GZ_WERROR      ON to make warnings errors (test.sh sets it)
set -euo pipefail

GZ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GZ_BUILD_DIR="${GZ_BUILD_DIR:-$GZ_ROOT/build}"
GZ_WERROR="${GZ_WERROR:-OFF}"
GZ_JOBS="${GZ_JOBS:-$(nproc)}"

gz_log() { printf '\n==> %s\n' "$*"; }

# Debian packages: compilers and build tools, GoogleTest, Google Benchmark,
# UCX, iproute2 (emulated cluster), clang + libFuzzer runtime (fuzzing).
gz_apt_deps() {
  local pkgs=(build-essential cmake ninja-build git pkg-config libgtest-dev libgmock-dev libbenchmark-dev
              libucx-dev ucx-utils iproute2 clang libclang-rt-14-dev)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    gz_log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
  # nvcc is on PATH on CUDA machines only sometimes; look in the usual place too.
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

# Configures and builds the C++ project (CUDA/NCCL/UCX: AUTO).
gz_build() {
  gz_log "building gradzip in $GZ_BUILD_DIR"
  cmake -S "$GZ_ROOT" -B "$GZ_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADZIP_WERROR="$GZ_WERROR" \
        ${GZ_CMAKE_ARGS:-}
  cmake --build "$GZ_BUILD_DIR" -j "$GZ_JOBS"
}
