#!/usr/bin/env bash
# Installs what gradzip needs on a fresh Debian 12 machine (with the CUDA
# toolkit, when there is one) and builds it. Sourced by run.sh and test.sh;
# each step skips itself when its work is already done.
#
#   GZ_BUILD_DIR   build directory (default: build)
#   GZ_WERROR      ON to make warnings errors (test.sh sets it); unset: the
#                  build folder's own setting (OFF for a new one)
set -euo pipefail

GZ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GZ_BUILD_DIR="${GZ_BUILD_DIR:-$GZ_ROOT/build}"
GZ_JOBS="${GZ_JOBS:-$(nproc)}"

# Each step's line says how long the script has run so far (phase times).
GZ_T0=${GZ_T0:-$SECONDS}
gz_log() { printf '\n==> [%ds] %s\n' "$((SECONDS - GZ_T0))" "$*"; }

# Debian packages: compilers and build tools, GoogleTest, Google Benchmark,
# UCX, iproute2 (emulated cluster), clang + libFuzzer runtime (fuzzing).
gz_apt_deps() {
  local pkgs=(build-essential cmake ninja-build git pkg-config libgtest-dev libgmock-dev libbenchmark-dev
              libucx-dev ucx-utils iproute2 clang libclang-rt-14-dev ccache)
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

# The main build and the Python package's build (pip install .) compile the
# same sources with the same flags: with ccache the second one is mostly hits.
gz_ccache() {
  if command -v ccache >/dev/null; then
    export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  fi
}

# Configures and builds the C++ project (CUDA/NCCL/UCX: AUTO). A caller that
# does not set GZ_WERROR keeps the build folder's setting: -Werror is on every
# compile command, so changing it rebuilds everything (run.sh after test.sh
# reuses test.sh's build).
gz_build() {
  gz_ccache
  gz_log "building gradzip in $GZ_BUILD_DIR"
  local werror=()
  if [[ -n "${GZ_WERROR:-}" || ! -f "$GZ_BUILD_DIR/CMakeCache.txt" ]]; then
    werror=(-DGRADZIP_WERROR="${GZ_WERROR:-OFF}")
  fi
  cmake -S "$GZ_ROOT" -B "$GZ_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${werror[@]}" \
        ${GZ_PYTHON:+-DPython3_EXECUTABLE="$GZ_PYTHON"} ${GZ_CMAKE_ARGS:-}
  cmake --build "$GZ_BUILD_DIR" -j "$GZ_JOBS"
}

# --- Python package (gradzip, gradzip.torch) ---------------------------------
# The interpreter to test with (gz_python_env): python3 itself when it already
# runs in a virtual environment, else a venv of its own in $GZ_BUILD_DIR/venv
# with the packages the package, its tests and the sweep need, all from PyPI.
# The venv does not see the interpreter's packages: a torch installed on this
# machine by hand must not make the tests pass where a fresh machine fails.
# Exports GZ_PYTHON. Then gz_python builds and installs gradzip's wheel.
# gz_python_env is gz_python_base (the environment, and what configuring
# and building need: pytest, matplotlib, nanobind, scikit-build-core, numpy)
# then gz_python_packages (torch and the rest; test.sh runs it beside the
# C++ build, which needs none of it: the download does not wait for the
# compiler, nor the compiler for the download).
#   GZ_BASE_PYTHON  interpreter to start from (default: python3)
gz_python_env() {
  gz_python_base
  gz_python_packages
}

gz_python_base() {
  local base="${GZ_BASE_PYTHON:-python3}" venv="$GZ_BUILD_DIR/venv"
  if ! "$base" -c 'import ensurepip, os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' \
       2>/dev/null; then  # Debian's python3 ships venv and the headers separately
    gz_log "installing Debian packages: python3-venv python3-dev"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv python3-dev python3-pip
  fi
  if "$base" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    GZ_PYTHON="$(command -v "$base")"  # a venv already: a nested one would not see its packages
  else
    if [[ ! -x "$venv/bin/python" ]]; then
      gz_log "creating the Python environment $venv"
      "$base" -m venv "$venv"
    fi
    GZ_PYTHON="$venv/bin/python"
  fi
  export GZ_PYTHON PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  # Debian 12's venv brings pip 23.0.1, which lacks the wheel step's -C
  # (--config-settings' short form, pip 23.1).
  if ! "$GZ_PYTHON" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (23, 1))' \
       2>/dev/null; then
    gz_log "upgrading pip in $GZ_PYTHON's environment (23.1 or later)"
    "$GZ_PYTHON" -m pip install -q --upgrade "pip>=23.1"
  fi
  _gz_pip_missing numpy:numpy pytest:pytest xdist:pytest-xdist "scikit_build_core:scikit-build-core>=0.10" "nanobind:nanobind>=2.2" \
                  matplotlib:matplotlib
}

gz_python_packages() {
  [[ -n "${GZ_PYTHON:-}" ]] || gz_python_base
  # torch only when it does not import: its wheel is large.
  if ! "$GZ_PYTHON" -c "import torch" 2>/dev/null; then
    gz_log "installing torch (PyPI)"
    "$GZ_PYTHON" -m pip install -q torch
  fi
  # torchft: gradzip.integrations.torchft, tested with 0.2.0 (needs torch >= 2.7)
  _gz_pip_missing sklearn:scikit-learn transformers:transformers accelerate:accelerate lightning:lightning \
                  torchft:torchft==0.2.0
}

# Installs each MODULE:REQUIREMENT whose module does not import, in one pip call.
_gz_pip_missing() {
  local need=() mod
  for mod in "$@"; do
    "$GZ_PYTHON" -c "import ${mod%%:*}" 2>/dev/null || need+=("${mod#*:}")
  done
  if ((${#need[@]})); then
    gz_log "installing Python packages: ${need[*]}"
    "$GZ_PYTHON" -m pip install -q "${need[@]}"
  fi
}

# The gradzip wheel, built into $GZ_BUILD_DIR/dist (what `pip install .` builds;
# incremental in $GZ_BUILD_DIR-wheel), then installed into that environment.
# The file stays for tests/python/test_wheel.py, which installs the same wheel
# into a fresh venv. Exports GZ_WHEEL.
# The wheel's build folder sits beside the main one, at the same depth: ccache
# (base_dir) hashes the source and include paths relative to the build folder,
# so only then does the wheel reuse the main build's objects (same flags)
# instead of compiling the project, CUDA kernels included, a second time.
gz_python() {
  [[ -n "${GZ_PYTHON:-}" ]] || gz_python_env
  gz_ccache
  gz_log "building the gradzip wheel (Python package, gradzip-run, gradzip-bench)"
  local dist="$GZ_BUILD_DIR/dist"
  rm -f "$dist"/gradzip-*.whl
  # The main build's C++ compiler by the same path (scikit-build-core hands
  # CMake Python's g++ where the main build found c++; ccache keys differ).
  local cxx
  cxx="$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' "$GZ_BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)"
  CMAKE_BUILD_PARALLEL_LEVEL="$GZ_JOBS" "$GZ_PYTHON" -m pip wheel -q --no-build-isolation --no-deps -w "$dist" \
    "$GZ_ROOT" -Cbuild-dir="$GZ_BUILD_DIR-wheel" -Ccmake.define.GRADZIP_WERROR="${GZ_WERROR:-OFF}" \
    ${cxx:+-Ccmake.define.CMAKE_CXX_COMPILER="$cxx"}
  local wheels=("$dist"/gradzip-*.whl)
  GZ_WHEEL="${wheels[0]}"
  export GZ_WHEEL
  gz_log "pip install $GZ_WHEEL"
  "$GZ_PYTHON" -m pip install -q --no-deps --force-reinstall "$GZ_WHEEL"
}
