#!/usr/bin/env bash
# One command that proves the CUDA path on a GPU machine (docs/gpu-check.md).
#
#   scripts/gpu-check.sh --prepare          CPU machine with apt and PyPI: fill .gpu/
#   scripts/gpu-check.sh [--quick] OUTDIR   GPU machine (no apt, no internet), from the
#                                           repository root, .gpu/ beside it
#   scripts/gpu-check.sh --dry-run [OUTDIR] machine without a GPU (CI): the same
#                                           targets built for sm_90, .gpu/ complete,
#                                           every step's command present
#
# The GPU machine has CUDA (nvcc, compute-sanitizer), cmake, ninja, a C++
# compiler and python3 with torch and the nvidia-nccl wheel, and nothing of
# Debian's: .gpu/ carries GoogleTest/GMock, Google Benchmark, UCX, iproute2
# (extracted Debian packages, with their libraries) and Python wheels for
# CPython 3.12 that the image may lack (nanobind for the extension; pytest).
#
# A check: build for the GPU found (native arch, all cores), then steps, each
# bounded in time and none stopping the others: GPU tests; compute-sanitizer
# memcheck and racecheck on a bounded subset; GPU kernel benchmarks against
# device copy; 2 ranks with device buffers over UCX and NCCL on 1 rank; the
# Python DDP hook, FSDP2, BlockMomentum, CompressedAdamW and the backend on
# CUDA tensors; time to accuracy (fp32 DDP against CompressedAdamW, each at
# its best of a small learning-rate grid, 2 ranks on the GPU) on an emulated
# 1 Gbit/s link and the 2-rank headline on emulated 1 and 10 Gbit/s links,
# where network namespaces work, else over loopback. The whole check is held
# under GZ_GPU_BUDGET_S (default 510 s, so that with the machine's start it
# fits 10 minutes of device time; --quick: 225 s, build + GPU tests +
# memcheck): a step that would start past it is reported as not run. OUTDIR
# gets at most 8 files: report.md (one page) and the raw logs/JSON. Exit
# status 0: every step passed.
#
# Environment: GZ_GPU_DIR (default .gpu), GZ_GPU_BUILD_DIR (default
# build-gpu), GZ_GPU_BUDGET_S, GZ_JOBS (default nproc), GZ_GPU_SKIP (step
# names to leave out, e.g. "kernel-bench headline" for a re-check of a
# change that touches no kernel when little device time is left), GZ_TTA_ARGS
# (the tta step's model and schedule).
set -uo pipefail
GZ_GPU_SKIP="${GZ_GPU_SKIP:-}"

GZ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_DIR="${GZ_GPU_DIR:-$GZ_ROOT/.gpu}"
JOBS="${GZ_JOBS:-$(nproc)}"
TRIPLET=x86_64-linux-gnu
L=root/usr/lib/x86_64-linux-gnu

# What the prepared folder holds. Debian packages: the build's and tests'
# libraries (their -dev parts and runtime libraries) and iproute2 with what it
# links beyond libc. UCX's InfiniBand modules are left out (no libibverbs).
DEBS=(libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libucx-dev libucx0 libnuma1
      iproute2 libbpf1 libelf1 libmnl0 libbsd0 libmd0 libcap2 libxtables12)
# Python wheels (CPython 3.12, manylinux or pure): nanobind builds gradzip._core;
# pytest and its two needs run the Python checks. Installed there only when
# the image's python3 lacks them.
WHEELS=(nanobind pytest pluggy iniconfig)
# Libraries any Linux image with CUDA and a C++ compiler has: a carried ELF may
# need these and nothing outside .gpu/.
BASE_LIBS="linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1
           libstdc++.so.6 libgcc_s.so.1 libz.so.1"
# Files the build and the steps need from .gpu/ (relative to it).
REQUIRED=("$L/cmake/GTest/GTestConfig.cmake" "$L/libgtest.a" "$L/libgtest_main.a" "$L/libgmock.a"
          root/usr/include/gtest/gtest.h "$L/cmake/benchmark/benchmarkConfig.cmake" "$L/libbenchmark.so"
          root/usr/include/benchmark/benchmark.h "$L/cmake/ucx/ucx-config.cmake" "$L/libucp.so" "$L/libucs.so"
          "$L/libuct.so" "$L/libucm.so" "$L/libnuma.so.1" root/usr/include/ucp/api/ucp.h iproute2/ip iproute2/tc
          bin/ip bin/tc MANIFEST)
# The binaries a check builds and runs (targets of the CMake project).
TARGETS=(gradzip-gpu-tests gradzip-kernels-bench gradzip-comm-gpu-check gradzip-run gradzip-bench)
QUICK_TARGETS=(gradzip-gpu-tests)

log() { printf '\n==> %s\n' "$*"; }
die() { echo "gpu-check: $*" >&2; exit 2; }
usage() { sed -n '2,35p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# --- prepare (CPU machine) ----------------------------------------------------
prepare() {
  command -v apt-get >/dev/null || die "--prepare needs apt-get (Debian)"
  local tmp
  tmp="$(mktemp -d)"
  rm -rf "$GPU_DIR"
  mkdir -p "$GPU_DIR/root" "$GPU_DIR/wheels" "$GPU_DIR/bin" "$tmp/debs"
  log "downloading Debian packages: ${DEBS[*]}"
  local list="$tmp/lists"
  mkdir -p "$list/partial"
  # Package lists of our own, so that the machine's are left as they are.
  local o=(-o Dir::State::Lists="$list" -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
  apt-get "${o[@]}" update -qq || die "apt-get update failed"
  (cd "$tmp/debs" && apt-get "${o[@]}" download -qq "${DEBS[@]}") || die "apt-get download failed"
  local deb
  for deb in "$tmp"/debs/*.deb; do
    dpkg-deb -x "$deb" "$GPU_DIR/root"
    dpkg-deb -f "$deb" Package Version | paste -sd' ' >>"$tmp/manifest"
  done
  # Keep what the build and the steps use: no docs, no static UCX, no IB modules.
  rm -rf "$GPU_DIR/root/usr/share" "$GPU_DIR/root/etc" "$GPU_DIR/root/usr/lib/$TRIPLET/ucx/"*ib* \
         "$GPU_DIR/root/usr/lib/$TRIPLET/ucx/"*rdmacm* "$GPU_DIR/root/usr/lib/$TRIPLET/ucx/"*.a \
         "$GPU_DIR/root/usr/lib/$TRIPLET/"libuc[mpst]*.a "$GPU_DIR/root/usr/lib/$TRIPLET/libucs_signal"* \
         "$GPU_DIR/root/usr/bin" "$GPU_DIR/root/usr/lib/$TRIPLET/pkgconfig"
  # Debian's UCX CMake package names /usr; make it relative to where it lies.
  local ucx_cmake="$GPU_DIR/root/usr/lib/$TRIPLET/cmake/ucx/ucx-targets.cmake"
  sed -i 's|^set(prefix "/usr")|get_filename_component(prefix "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)|' \
    "$ucx_cmake"
  grep -q CMAKE_CURRENT_LIST_DIR "$ucx_cmake" || die "UCX's CMake package did not have the expected prefix line"
  # ip and tc alone, with the libraries only they use in a folder of their
  # own (the build and the ranks never see those), behind wrappers that
  # gradzip-run finds on PATH.
  local ipr="$GPU_DIR/iproute2" tool lib
  mkdir -p "$ipr"
  for tool in ip tc; do
    # Debian's /sbin/ip is a link to /bin/ip: an absolute link the GPU
    # machine would resolve against its own root, so carry the file itself.
    cp -L "$GPU_DIR/root/bin/$tool" "$ipr/$tool" 2>/dev/null || cp -L "$GPU_DIR/root/sbin/$tool" "$ipr/$tool" ||
      die "iproute2 has no /bin/$tool or /sbin/$tool"
    cat >"$GPU_DIR/bin/$tool" <<EOF
#!/bin/sh
# iproute2's $tool from Debian, with its libraries (scripts/gpu-check.sh --prepare).
here=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$here/iproute2\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/iproute2/$tool" "\$@"
EOF
    chmod +x "$GPU_DIR/bin/$tool"
  done
  for lib in libbpf libbsd libelf libmd libmnl libxtables libcap libpsx; do
    mv "$GPU_DIR/root/usr/lib/$TRIPLET/${lib}"[.-]*so* "$GPU_DIR/root/lib/$TRIPLET/${lib}"[.-]*so* "$ipr/" 2>/dev/null
  done
  rm -rf "$GPU_DIR/root/bin" "$GPU_DIR/root/sbin" "$GPU_DIR/root/usr/sbin" "$GPU_DIR/root/lib" \
         "$GPU_DIR/root/usr/lib/$TRIPLET/tc"
  log "downloading Python wheels for CPython 3.12: ${WHEELS[*]}"
  local platforms=() n
  for n in 17 27 28 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$GPU_DIR/wheels" "${WHEELS[@]}" \
    || die "pip download failed"
  ls "$GPU_DIR/wheels" >>"$tmp/manifest"
  { echo "# scripts/gpu-check.sh --prepare, $(date -u +%FT%TZ), on $(. /etc/os-release && echo "$PRETTY_NAME")"
    cat "$tmp/manifest"; } >"$GPU_DIR/MANIFEST"
  rm -rf "$tmp"
  check_prepared || die "the prepared folder is incomplete (above)"
  local mib
  mib=$(du -sm "$GPU_DIR" | cut -f1)
  echo "gpu-check: $GPU_DIR is ready: $(du -sh "$GPU_DIR" | cut -f1) in $(find "$GPU_DIR" -type f | wc -l) files" \
       "(a GPU machine takes at most 64 MiB of untracked files with the tree)"
  ((mib <= 64)) || die "$GPU_DIR is over 64 MiB"
}

# --- checks of the prepared folder (dry run, and before a real check) ---------
# Every required file is there; every carried ELF finds each library it needs
# in .gpu/ or among BASE_LIBS; the wheels are for CPython 3.12 on x86-64 and
# hold the packages they are named for.
check_prepared() {
  local bad=0 f
  [[ -d "$GPU_DIR" ]] || { echo "missing: $GPU_DIR (run scripts/gpu-check.sh --prepare)"; return 1; }
  for f in "${REQUIRED[@]}"; do
    [[ -e "$GPU_DIR/$f" ]] || { echo "missing: $GPU_DIR/$f"; bad=1; }
  done
  # A link out of .gpu/ works here and dangles on the GPU machine.
  local root_real link
  root_real="$(realpath "$GPU_DIR")"
  while IFS= read -r link; do
    [[ "$(realpath -m "$link")" == "$root_real"/* ]] && continue
    echo "link out of $GPU_DIR: ${link#"$GPU_DIR/"} -> $(readlink "$link")"
    bad=1
  done < <(find "$GPU_DIR" -type l)
  local have needed elf lib
  have="$(find "$GPU_DIR/root" "$GPU_DIR/iproute2" \( -type f -o -type l \) -name '*.so*' -printf '%f\n' | sort -u)"
  while IFS= read -r elf; do
    needed="$(readelf -d "$elf" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
    for lib in $needed; do
      grep -qxF "$lib" <<<"$have" && continue
      [[ " $(echo $BASE_LIBS) " == *" $lib "* ]] && continue
      echo "unresolved: ${elf#"$GPU_DIR/"} needs $lib"
      bad=1
    done
  done < <(find "$GPU_DIR/root" "$GPU_DIR/iproute2" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c \
             'head -c4 "$1" | grep -q "ELF" && echo "$1"' _ {} \;)
  # Debian 12's libraries need a glibc at least as new as theirs: the highest
  # GLIBC_x.y any carried ELF names, against this machine's.
  local need_glibc have_glibc
  need_glibc="$(find "$GPU_DIR/root" "$GPU_DIR/iproute2" -type f \( -name '*.so*' -o -perm -u+x \) \
    -exec readelf -V {} + 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
  have_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  if [[ -n "$need_glibc" && -n "$have_glibc" ]]; then
    if [[ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | tail -1)" != "$have_glibc" ]]; then
      echo "the carried libraries need glibc $need_glibc; this machine has $have_glibc"
      bad=1
    else
      echo "glibc: the carried libraries need $need_glibc, this machine has $have_glibc"
    fi
  fi
  local w name
  for name in "${WHEELS[@]}"; do
    w=("$GPU_DIR"/wheels/"$name"-*.whl)
    if [[ ! -f "${w[0]}" ]]; then
      echo "missing: the $name wheel in $GPU_DIR/wheels"
      bad=1
      continue
    fi
    "$PYTHON" - "${w[0]}" "$name" <<'EOF' || bad=1
import sys, zipfile
path, name = sys.argv[1], sys.argv[2]
tags = path.rsplit("/", 1)[-1][:-4].split("-")[-3:]
ok_py = tags[0] in ("py3", "cp312") or tags[0].startswith("py3")
ok_plat = tags[2] == "any" or ("x86_64" in tags[2] and "manylinux" in tags[2])
files = zipfile.ZipFile(path).namelist()
pkg = name.replace("-", "_")
ok_files = any(f.startswith((pkg + "/", pkg + ".py", "_" + pkg)) for f in files)
if not (ok_py and ok_plat and ok_files):
    print(f"wheel {path}: tags {tags} or contents do not fit CPython 3.12 on x86-64 ({pkg}/ in it: {ok_files})")
    sys.exit(1)
EOF
  done
  return $bad
}

# --- the environment both the build and the steps use -------------------------
setup_env() {
  export PATH="$GPU_DIR/bin:$PATH"
  command -v nvcc >/dev/null || [[ ! -x /usr/local/cuda/bin/nvcc ]] || export PATH="/usr/local/cuda/bin:$PATH"
  export LD_LIBRARY_PATH="$GPU_DIR/root/usr/lib/$TRIPLET${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export UCX_MODULE_DIR="$GPU_DIR/root/usr/lib/$TRIPLET/ucx"
  export CMAKE_PREFIX_PATH="$GPU_DIR/root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
  PYTHON="${GZ_GPU_PYTHON:-${GZ_PYTHON:-$(command -v python3)}}"
}

# Installs the carried wheels the interpreter lacks into $BUILD/pysite.
python_deps() {
  local site="$BUILD/pysite" need=() name
  for name in nanobind pytest; do
    [[ -z "${GZ_GPU_FORCE_WHEELS:-}" ]] && "$PYTHON" -c "import $name" 2>/dev/null || need+=("$name")
  done
  ((${#need[@]})) || return 0
  [[ " ${need[*]} " == *" pytest "* ]] && need+=(pluggy iniconfig)
  local files=()
  for name in "${need[@]}"; do files+=("$GPU_DIR"/wheels/"$name"-*.whl); done
  echo "installing carried wheels into $site: ${need[*]}"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${files[@]}" || return 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}

# NCCL from the nvidia-nccl wheel beside torch (headers and libnccl.so.2).
nccl_args() {
  local dir
  dir="$("$PYTHON" -c 'import nvidia.nccl as n, os; print(list(n.__path__)[0])' 2>/dev/null)" || return 0
  [[ -f "$dir/include/nccl.h" && -f "$dir/lib/libnccl.so.2" ]] || return 0
  echo "-DNCCL_INCLUDE_DIR=$dir/include -DNCCL_LIBRARY=$dir/lib/libnccl.so.2"
}

configure() {  # $1: CUDA architectures
  local args=(-S "$GZ_ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADZIP_NATIVE=ON
              -DCMAKE_CUDA_ARCHITECTURES="$1" -DGRADZIP_CUDA=ON -DGRADZIP_UCX=ON -DGRADZIP_BUILD_PYTHON="${PY_BUILD:-OFF}"
              -DPython_EXECUTABLE="$PYTHON" -DPython3_EXECUTABLE="$PYTHON")
  if command -v ccache >/dev/null; then
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # shellcheck disable=SC2206,SC2207  # words, split on purpose
  args+=($(nccl_args) ${GZ_GPU_CMAKE_ARGS:-})
  cmake "${args[@]}"
}

# --- steps: each bounded, none stopping the others ----------------------------
# Each step appends "name|verdict|seconds|note" to $STEPS_FILE (steps that run
# side by side in subshells too).
T0=$SECONDS

# step NAME CAP_S NOTE -- command...: runs the command (a function of this
# script or a program) under `timeout`, for at most CAP_S seconds and never
# past the budget; its output goes to $LOG.
step() {
  local name=$1 cap=$2 note=$3
  shift 4
  local left=$((BUDGET - (SECONDS - T0)))
  if [[ " ${GZ_GPU_SKIP//,/ } " == *" $name "* ]]; then
    note_step "$name" "SKIPPED" "left out by GZ_GPU_SKIP"
    return
  fi
  if ((left < 15)); then
    note_step "$name" "NOT RUN" "out of time (budget ${BUDGET} s)"
    return
  fi
  ((cap > left)) && cap=$left
  echo "--- $name (at most ${cap} s): $*" | tee -a "$LOG"
  local start=$SECONDS rc
  timeout -k 10 "$cap" bash -c '"$@"' step "$@" >>"$LOG" 2>&1
  rc=$?
  local took=$((SECONDS - start)) verdict=PASS
  if ((rc == 124 || rc == 137)); then
    verdict="FAIL"
    note="timed out after ${cap} s; $note"
  elif ((rc != 0)); then
    verdict="FAIL"
    note="exit $rc; $note"
  fi
  echo "$name|$verdict|$took|$note" >>"$STEPS_FILE"
  printf -- '--- %s: %s in %d s (%d s so far)\n' "$name" "$verdict" "$took" "$((SECONDS - T0))" | tee -a "$LOG"
}

# A step whose verdict is settled already: note_step NAME VERDICT NOTE [SECONDS].
note_step() { echo "$1|$2|${4:-0}|$3" >>"$STEPS_FILE"; echo "--- $1: $2 ($3)" | tee -a "$LOG"; }

SAN_MEMCHECK='-CudaCodec.TopkIsDeterministic:CudaCodec.SampledTopkRespectsTheBound:CudaCodec.ErrorFeedbackInvariant:CudaCodec.TopkIsTheKLargestBySort:PayloadHeaderCheck.*'
SAN_RACECHECK='Codecs/CudaCodecVsCpu.*topk*65537*:Codecs/CudaCodecVsCpu.*onebit_65537*:Codecs/CudaPayloadValidation.*topk*'

gpu_tests() { "$BUILD/bin/gradzip-gpu-tests" --gtest_brief=1 --gtest_output="json:$BUILD/gpu-tests.json"; }
memcheck() {
  GZ_TEST_MAX_N=5000 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/bin/gradzip-gpu-tests" --gtest_brief=1 --gtest_filter="$SAN_MEMCHECK"
}
racecheck() {
  GZ_TEST_MAX_N=70001 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BUILD/bin/gradzip-gpu-tests" --gtest_brief=1 --gtest_filter="$SAN_RACECHECK"
}
kernel_bench() {  # Debian's Google Benchmark 1.7 takes a plain number of seconds
  "$BUILD/bin/gradzip-kernels-bench" --benchmark_filter='_cuda/' --benchmark_min_time=0.1 \
    --benchmark_out="$OUT/kernels-bench.json" --benchmark_out_format=json || return 1
  # Top-k with error feedback against torch.topk and the same update in torch,
  # in the same run (issue 33's target); its table goes into the report.
  "$PYTHON" "$GZ_ROOT/bench/topk_torch.py" --bench-json "$OUT/kernels-bench.json" \
    --json "$BUILD/topk-torch.json" >"$BUILD/topk-torch.txt" && cat "$BUILD/topk-torch.txt"
}
ucx_2ranks() { "$BUILD/bin/gradzip-run" -n 2 -- "$BUILD/bin/gradzip-comm-gpu-check" ucx; }
nccl_1rank() { "$BUILD/bin/gradzip-run" -n 1 -- "$BUILD/bin/gradzip-comm-gpu-check" nccl; }
torch_checks() {
  PYTHONPATH="$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$GZ_ROOT/tests/python/gpu_torch_check.py" \
    --json "$OUT/torch-checks.json" &&
  PYTHONPATH="$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m pytest -q -p no:cacheprovider \
    "$GZ_ROOT/tests/python/test_codec.py" "$GZ_ROOT/tests/python/test_hook_state.py" -k "cuda or gpu"
}
headline() {  # $1: "--link" or "" (loopback); every codec, one JSON file
  local link=$1 rate rc=0 files=()
  for rate in 1gbit 10gbit; do
    [[ -z "$link" && "$rate" == 10gbit ]] && continue  # loopback: one run
    local json="$BUILD/headline-${link:+$rate}${link:-loopback}.json"
    rm -f "$json"
    "$BUILD/bin/gradzip-run" -n 2 ${link:+--link $rate} -- "$BUILD/bin/gradzip-bench" --device cuda \
      --sizes 100M --iters 2 --warmup 1 --timeout 120 --json "$json" || rc=1
    [[ -f "$json" ]] && files+=("${link:+$rate}${link:-loopback}=$json")
  done
  # One file, each row tagged with the link it ran on (the table's first column).
  ((${#files[@]})) && "$PYTHON" -c 'import json, sys
rows = [dict(r, link=arg.split("=", 1)[0]) for arg in sys.argv[2:] for r in json.load(open(arg.split("=", 1)[1]))]
json.dump(rows, open(sys.argv[1], "w"), indent=1)' "$OUT/headline.json" "${files[@]}"
  return $rc
}

# Time to accuracy against a tuned fp32 (issue 33 item 4, issue 40 item 6):
# 2 ranks share the GPU (a gloo group; gloo's CUDA all-reduce for DDP,
# gradzip's staged exchange for the optimizer) on the LM experiment at 10.7M
# parameters (width 384, 6 layers). First fp32 DDP and
# CompressedAdamW(codec="onebit") over a small learning-rate grid (GZ_TTA_LRS,
# 3 points a factor 2 apart, widened once where a best is at an edge; local
# ranks, one seed), then, per link, the exchange fraction and each method's
# time to the tuned fp32's final loss, each at its own best rate.
# GZ_TTA_ARGS replaces the model and schedule (the dry run's tiny one).
TTA_ARGS_DEFAULT="--width 384 --layers 6 --heads 6 --steps 150 --batch 16 --eval-every 10 --exchange-steps 10"
tta() {  # $1: "--link" (1 Gbit/s) or "" (gradzip-run without emulated links)
  local links=(--link 1gbit) plot=() env=(PYTHONPATH="$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}" GRADZIP_BIN_DIR="$BUILD/bin")
  [[ -z "$1" ]] && links=(--link local)
  "$PYTHON" -c 'import matplotlib' 2>/dev/null && plot=(--plot "$OUT/tta.png")
  # shellcheck disable=SC2086  # the arguments' words, split on purpose
  env "${env[@]}" "$PYTHON" -m gradzip.experiments.lm --tune --ranks 2 --device "${TTA_DEVICE:-cuda}" \
    --methods fp32,onebit@cm --lr "${GZ_TTA_LRS:-5e-4,1e-3,2e-3}" --seeds 0 --max-widen 1 \
    ${GZ_TTA_ARGS:-$TTA_ARGS_DEFAULT} --timeout 120 --json "$BUILD/tune.json" --markdown "$BUILD/tune.md" || return
  # shellcheck disable=SC2086
  env "${env[@]}" "$PYTHON" -m gradzip.experiments.lm "${links[@]}" --ranks 2 --device "${TTA_DEVICE:-cuda}" \
    --methods fp32,onebit@cm --tuned "$BUILD/tune.json" ${GZ_TTA_ARGS:-$TTA_ARGS_DEFAULT} \
    --timeout 120 --json "$OUT/tta.json" --markdown "$BUILD/tta.md" "${plot[@]}"
}

# Why no emulated link can be made here ("" when one can).
why_no_netns() {
  [[ $(id -u) -eq 0 ]] || { echo "not root"; return; }
  command -v ip >/dev/null || { echo "no ip (iproute2)"; return; }
  local probe="gzgpu-probe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "this machine does not let us make network namespaces"
    return
  fi
  if ! ip -n "$probe" link add gzp0 type veth peer name gzp1 2>/dev/null ||
     ! ip -n "$probe" link set gzp0 up 2>/dev/null ||
     ! tc -n "$probe" qdisc add dev gzp0 root tbf rate 1gbit burst 512kb latency 50ms 2>/dev/null; then
    echo "network namespaces work but veth links or tc's tbf do not"
  fi
  ip netns del "$probe" 2>/dev/null || true
}

# The Python package for the steps: the sources with the extension built here.
stage_package() {
  rm -rf "$BUILD/pkg" && mkdir -p "$BUILD/pkg" && cp -r "$GZ_ROOT/python/gradzip" "$BUILD/pkg/" &&
  cp "$BUILD"/python/_core*.so "$BUILD/pkg/gradzip/"
}

# --- the report -----------------------------------------------------------------
report() {
  local r="$OUT/report.md" all=PASS name verdict took note
  [[ -z "$(cut -d'|' -f2 "$STEPS_FILE" | grep -v -e '^PASS$' -e '^SKIPPED$')" ]] || all=FAIL
  local skipped
  skipped=$(cut -d'|' -f2 "$STEPS_FILE" | grep -c '^SKIPPED$')
  ((skipped)) && all="$all ($skipped steps skipped: GZ_GPU_SKIP)"
  {
    echo "# gradzip GPU check: $all"
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| commit | \`$(git -C "$GZ_ROOT" rev-parse --short HEAD 2>/dev/null)\`$(git -C "$GZ_ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)') |"
    echo "| date | $(date -u '+%F %H:%M UTC') |"
    echo "| mode | $MODE_TEXT |"
    echo "| GPU | $(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1) |"
    echo "| driver | $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1) |"
    echo "| CUDA | $(nvcc --version 2>/dev/null | sed -n 's/.*release \([^,]*\),.*/\1/p') (nvcc), arch $ARCH |"
    echo "| host | $(nproc) cores, $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), python $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>/dev/null) |"
    echo "| total | $((SECONDS - T0)) s of a ${BUDGET} s budget |"
    echo
    echo "| step | verdict | seconds | notes |"
    echo "|---|---|---:|---|"
    while IFS='|' read -r name verdict took note; do
      echo "| $name | **$verdict** | $took | $note |"
    done <"$STEPS_FILE"
    if [[ -f "$BUILD/gpu-tests.json" ]]; then
      echo
      "$PYTHON" - "$BUILD/gpu-tests.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
fails = [f"{s['name']}.{t['name']}" for s in d.get("testsuites", []) for t in s.get("testsuite", [])
         if t.get("failures")]
skipped = sum(1 for s in d.get("testsuites", []) for t in s.get("testsuite", []) if t.get("result") == "SKIPPED")
print(f"GPU tests: {d.get('tests', 0) - d.get('failures', 0) - skipped} of {d.get('tests', 0)} passed, "
      f"{d.get('failures', 0)} failed, {skipped} skipped" + (": " + ", ".join(fails[:20]) if fails else "."))
EOF
    fi
    local s
    for s in memcheck racecheck; do
      [[ -f "$BUILD/$s.log" ]] && echo && echo "$s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$BUILD/$s.log" | tail -1)"
    done
    if [[ -f "$OUT/kernels-bench.json" ]]; then
      echo
      echo "## Kernels vs device copy (BENCHMARKS.md section 2)"
      echo
      "$PYTHON" "$GZ_ROOT/scripts/kernels_bench_table.py" --cuda "$OUT/kernels-bench.json" 2>&1
    fi
    if [[ -f "${BUILD:-}/topk-torch.txt" ]]; then
      echo
      echo "## Top-k encode with error feedback vs torch.topk (bench/topk_torch.py)"
      echo
      echo '```'
      cat "$BUILD/topk-torch.txt"
      echo '```'
    fi
    if [[ -f "$OUT/headline.json" ]]; then
      echo
      echo "## 2 ranks on the GPU, 100M floats ($LINK_TEXT)"
      echo
      "$PYTHON" "$GZ_ROOT/scripts/bench_json_table.py" "$OUT/headline.json"
    fi
    if [[ -f "$OUT/torch-checks.json" ]]; then
      echo
      echo "## gradzip.torch on CUDA tensors"
      echo
      "$PYTHON" - "$OUT/torch-checks.json" <<'EOF'
import json, sys
for name, r in json.load(open(sys.argv[1])).items():
    print(f"- {name}: **{r['verdict']}** ({r['seconds']} s) {r['detail'][:300]}")
EOF
    fi
    if [[ -f "${BUILD:-}/tune.md" ]]; then
      echo
      echo "## Learning rates of the time-to-accuracy runs, 2 ranks on the GPU (local, one seed)"
      echo
      cat "$BUILD/tune.md"
    fi
    if [[ -f "${BUILD:-}/tta.md" ]]; then
      echo
      echo "## Time to accuracy against the tuned fp32, 2 ranks on the GPU ($TTA_TEXT)"
      echo
      cat "$BUILD/tta.md"
    fi
    echo
    echo "Raw output: check.log (every step's output), sanitizers.log, the JSON files (and tta.png) beside this report."
  } >"$r"
  [[ $all == PASS ]]
}

# --- a check on the GPU machine -------------------------------------------------
run_check() {
  OUT=$1
  mkdir -p "$OUT" || die "cannot make $OUT"
  OUT="$(cd "$OUT" && pwd)"
  LOG="$OUT/check.log"
  STEPS_FILE="$OUT/.steps"
  : >"$LOG"
  : >"$STEPS_FILE"
  BUILD="${GZ_GPU_BUILD_DIR:-$GZ_ROOT/build-gpu}"
  mkdir -p "$BUILD"
  setup_env
  export OUT BUILD PYTHON GZ_ROOT SAN_MEMCHECK SAN_RACECHECK
  export TTA_ARGS_DEFAULT
  export -f gpu_tests memcheck racecheck kernel_bench ucx_2ranks nccl_1rank torch_checks headline tta configure nccl_args
  if ((QUICK)); then BUDGET=${GZ_GPU_BUDGET_S:-225}; MODE_TEXT="--quick"; else BUDGET=${GZ_GPU_BUDGET_S:-510}; MODE_TEXT=full; fi
  command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$LOG"
  ARCH=native
  local cap
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)"
  [[ -n "$cap" ]] && ARCH="$cap"
  log "gpu-check $MODE_TEXT: building for sm_$ARCH with $JOBS jobs into $BUILD; log in $LOG"
  if check_prepared >>"$LOG" 2>&1; then note_step prepared PASS "$GPU_DIR complete"
  else note_step prepared FAIL "$GPU_DIR incomplete: see check.log"; fi
  local start=$SECONDS
  if python_deps >>"$LOG" 2>&1; then note_step python-deps PASS "carried wheels the image lacks" $((SECONDS - start))
  else note_step python-deps FAIL "installing the carried wheels failed: see check.log"; fi
  # The extension needs the interpreter's headers; without them the Python step says so.
  PY_BUILD=ON
  "$PYTHON" -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' \
    2>/dev/null || PY_BUILD=OFF
  export PY_BUILD
  local targets=("${TARGETS[@]}")
  [[ $PY_BUILD == ON ]] && targets+=(gz_python)
  ((QUICK)) && targets=("${QUICK_TARGETS[@]}")
  step configure 90 "CMake, sm_$ARCH" -- configure "$ARCH"
  step build 240 "${targets[*]}" -- cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
  ((QUICK)) || [[ $PY_BUILD == OFF ]] || stage_package >>"$LOG" 2>&1
  # The tests and the sanitizers share the GPU (nothing here is timed).
  step gpu-tests 150 "every GPU test (GPU = CPU bits)" -- gpu_tests &
  local p1=$!
  ( LOG="$BUILD/memcheck.log"; : >"$LOG"
    step memcheck 150 "compute-sanitizer memcheck, n <= 5000, 5 slow tests left out" -- memcheck ) &
  local p2=$!
  local p3=""
  if ((!QUICK)); then
    ( LOG="$BUILD/racecheck.log"; : >"$LOG"
      step racecheck 150 "compute-sanitizer racecheck, top-k and onebit at n = 65537" -- racecheck ) &
    p3=$!
  fi
  wait $p1 $p2 $p3
  cat "$BUILD/memcheck.log" "$BUILD/racecheck.log" >"$OUT/sanitizers.log" 2>/dev/null
  if ((!QUICK)); then
    step kernel-bench 150 "codecs vs cudaMemcpy D2D, 1M/16M/64M; top-k vs torch.topk" -- kernel_bench
    step ucx-2ranks 90 "2 ranks share the GPU, device buffers over UCX = host bits" -- ucx_2ranks
    step nccl-1rank 60 "NCCL transport, 1 rank = host bits" -- nccl_1rank
    if [[ $PY_BUILD == ON ]]; then
      step torch-cuda 200 "DDP hook (fp32, bf16), FSDP2, BlockMomentum, CompressedAdamW, the backend (cuda:gradzip) on CUDA tensors" -- torch_checks
    else
      note_step torch-cuda FAIL "not run: $PYTHON has no Python.h, so gradzip._core could not be built"
    fi
    local why
    why="$(why_no_netns)"
    # Time to accuracy before the headline: the headline's codec rows were
    # measured on an H200 before; a tight window spends its end on them.
    local tta_note="fp32 DDP vs CompressedAdamW(onebit) at their tuned learning rates, LM of 10.7M parameters"
    if [[ -z "$why" ]]; then
      TTA_TEXT="an emulated 1 Gbit/s link"
      step tta 220 "$tta_note, $TTA_TEXT" -- tta --link
      LINK_TEXT="emulated links (network namespaces + tc), 1 and 10 Gbit/s"
      step headline 150 "$LINK_TEXT" -- headline --link
    else
      TTA_TEXT="loopback, no emulated link ($why)"
      step tta 160 "$tta_note, $TTA_TEXT" -- tta ""
      LINK_TEXT="loopback: no emulated link here ($why)"
      step headline 90 "$LINK_TEXT" -- headline ""
    fi
  fi
  report
  local rc=$?
  rm -f "$STEPS_FILE"
  echo
  cat "$OUT/report.md"
  echo
  echo "gpu-check: $(ls "$OUT" | wc -l) files in $OUT, $((SECONDS - T0)) s"
  return $rc
}

# --- dry run (no GPU; CI) ---------------------------------------------------------
# The same targets for sm_90 (from the main build when it has them), the
# prepared folder, and every command the steps call.
dry_run() {
  local out=${1:-}
  setup_env
  local bad=0 build="${GZ_BUILD_DIR:-$GZ_ROOT/build}"
  if [[ ! -e "$GPU_DIR" ]]; then
    echo "gpu-check --dry-run: $GPU_DIR was never prepared (scripts/gpu-check.sh --prepare): skipped"
    return 77
  fi
  log "gpu-check --dry-run: the prepared folder $GPU_DIR"
  if ! check_prepared; then bad=1; fi
  log "gpu-check --dry-run: the GPU run's configure, against $GPU_DIR alone, with its wheels"
  # The carried wheels installed (nanobind's CMake package then comes from
  # its wheel), then CMake as the GPU run calls it, for sm_90, with /usr
  # ignored as a prefix so that GTest, benchmark and UCX can only come from
  # .gpu/ (the tools are named, since /usr is where they are here).
  BUILD="$(mktemp -d)"
  # The compilers' detection from the main build when it has one (same CMake,
  # same compilers): the CUDA compiler's alone takes tens of seconds.
  local detected
  detected="$(find "$build/CMakeFiles" -maxdepth 1 -name "$(cmake --version | sed -n '1s/.* //p')" 2>/dev/null)"
  [[ -n "$detected" ]] && mkdir -p "$BUILD/CMakeFiles" && cp -r "$detected" "$BUILD/CMakeFiles/"
  PY_BUILD=OFF
  if GZ_GPU_FORCE_WHEELS=1 python_deps && "$PYTHON" -c 'import nanobind, pytest' &&
     [[ "$("$PYTHON" -c 'import nanobind; print(nanobind.__file__)')" == "$BUILD/pysite/"* ]]; then
    echo "the carried wheels install and import"
    PY_BUILD=ON
  else
    echo "the carried wheels do not install or import"
    bad=1
  fi
  GZ_GPU_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_MAKE_PROGRAM=$(command -v ninja)
    -DCMAKE_CXX_COMPILER=$(command -v c++) -DCMAKE_CUDA_COMPILER=$(command -v nvcc)
    -DCMAKE_CUDA_HOST_COMPILER=$(command -v c++)"
  if configure 90 >"$BUILD/configure.log" 2>&1; then
    local f v
    for f in GTest_DIR benchmark_DIR ucx_DIR; do
      v="$(sed -n "s/^$f:PATH=//p" "$BUILD/CMakeCache.txt")"
      if [[ "$v" != "$GPU_DIR"/* ]]; then echo "$f is $v, not in $GPU_DIR"; bad=1; fi
    done
    grep -q "^GRADZIP_BUILD_PYTHON:BOOL=ON" "$BUILD/CMakeCache.txt" || { echo "the configure left Python out"; bad=1; }
    echo "configured for sm_90: GTest, benchmark and UCX from $GPU_DIR, the Python extension with its nanobind"
  else
    tail -20 "$BUILD/configure.log"
    echo "the GPU run's configure failed against $GPU_DIR"
    bad=1
  fi
  unset GZ_GPU_CMAKE_ARGS
  rm -rf "$BUILD"
  # A program linked against the carried UCX and benchmark, run with them.
  log "gpu-check --dry-run: link and run against the carried libraries"
  local t
  t="$(mktemp -d)"
  cat >"$t/probe.cc" <<'EOF'
#include <benchmark/benchmark.h>
#include <ucp/api/ucp.h>
#include <cstdio>
int main() {
  unsigned major, minor, release;
  ucp_get_version(&major, &minor, &release);
  std::printf("UCX %u.%u.%u, Google Benchmark linked\n", major, minor, release);
  benchmark::Initialize(nullptr, nullptr);
  return major == 0;
}
EOF
  local inc="$GPU_DIR/root/usr/include" lib="$GPU_DIR/root/usr/lib/$TRIPLET"
  if c++ -std=c++17 -I"$inc" "$t/probe.cc" -o "$t/probe" -L"$lib" -lucp -lucs -lbenchmark -pthread \
       -Wl,--disable-new-dtags 2>"$t/err" && ldd "$t/probe" >"$t/ldd" && grep -q "$lib/libucp.so" "$t/ldd" &&
     ! grep -q "not found" "$t/ldd" && "$t/probe"; then
    :
  else
    cat "$t/err" "$t/ldd" 2>/dev/null
    echo "the probe did not link or run against $GPU_DIR's libraries"
    bad=1
  fi
  if "$GPU_DIR/bin/ip" -V >/dev/null && "$GPU_DIR/bin/tc" -V >/dev/null; then
    echo "iproute2's ip and tc run from $GPU_DIR"
  else
    echo "$GPU_DIR/bin/ip or tc does not run"
    bad=1
  fi
  rm -rf "$t"
  log "gpu-check --dry-run: the targets, built for sm_90, in $build"
  local target
  for target in "${TARGETS[@]}"; do
    if [[ ! -x "$build/bin/$target" ]]; then echo "missing: $build/bin/$target (build the main project first)"; bad=1; fi
  done
  if [[ -x "$build/bin/gradzip-gpu-tests" ]]; then
    # cuobjdump where the toolkit has it, else the names in the fat binary.
    local fat="$build/gpu-check-fatbin"
    if { command -v cuobjdump >/dev/null &&
         [[ "$(cuobjdump --list-elf "$build/bin/gradzip-gpu-tests" 2>/dev/null)" == *sm_90* ]]; } ||
       { objcopy -O binary --only-section=.nv_fatbin "$build/bin/gradzip-gpu-tests" "$fat" 2>/dev/null &&
         grep -aq sm_90 "$fat"; }; then
      echo "gradzip-gpu-tests holds sm_90 code"
    else
      echo "no sm_90 code in $build/bin/gradzip-gpu-tests (CMAKE_CUDA_ARCHITECTURES must include 90)"
      bad=1
    fi
    rm -f "$fat"
    local n
    n="$("$build/bin/gradzip-gpu-tests" --gtest_list_tests --gtest_filter="$SAN_RACECHECK" | grep -c '^  ')"
    ((n > 0)) || { echo "the racecheck filter selects no test"; bad=1; }
    n="$("$build/bin/gradzip-gpu-tests" --gtest_list_tests --gtest_filter="$SAN_MEMCHECK" | grep -c '^  ')"
    ((n > 0)) || { echo "the memcheck filter selects no test"; bad=1; }
  fi
  # (Output captured first: grep -q leaves early, and with pipefail the
  # writer's SIGPIPE would read as a failure.)
  local listed
  if [[ -x "$build/bin/gradzip-kernels-bench" ]]; then
    listed="$("$build/bin/gradzip-kernels-bench" --benchmark_list_tests --benchmark_filter='_cuda/')"
    grep -q '^copy_cuda/' <<<"$listed" || { echo "gradzip-kernels-bench lists no copy_cuda benchmark"; bad=1; }
    grep -q '^encode_bf16_cuda/' <<<"$listed" || { echo "gradzip-kernels-bench lists no bfloat16 GPU rows"; bad=1; }
  fi
  if [[ -x "$build/bin/gradzip-bench" ]]; then
    listed="$("$build/bin/gradzip-bench" --help 2>&1)"
    grep -q -- '--device' <<<"$listed" || { echo "gradzip-bench has no --device option"; bad=1; }
  fi
  log "gpu-check --dry-run: the commands the steps call"
  local cmd
  for cmd in cmake ninja nvcc compute-sanitizer nvidia-smi timeout readelf git "$PYTHON"; do
    if command -v "$cmd" >/dev/null; then echo "found: $cmd"
    elif [[ $cmd == nvidia-smi || $cmd == compute-sanitizer ]]; then
      echo "not here: $cmd (the GPU machine's driver and CUDA have it)"
    else echo "missing: $cmd"; bad=1; fi
  done
  for f in tests/python/gpu_torch_check.py tests/python/test_codec.py tests/python/test_hook_state.py \
           scripts/kernels_bench_table.py scripts/bench_json_table.py bench/topk_torch.py; do
    [[ -f "$GZ_ROOT/$f" ]] || { echo "missing: $f"; bad=1; }
  done
  "$PYTHON" "$GZ_ROOT/tests/python/gpu_torch_check.py" --list >/dev/null || { echo "gpu_torch_check.py --list failed"; bad=1; }
  "$PYTHON" "$GZ_ROOT/bench/topk_torch.py" --help >/dev/null || { echo "bench/topk_torch.py --help failed"; bad=1; }
  # The time-to-accuracy step as the GPU run calls it, on host tensors with a
  # tiny model and without emulated links: its command, the package, the
  # launcher, the JSON and the table.
  log "gpu-check --dry-run: the time-to-accuracy step, tiny and on host tensors"
  local tta_out
  tta_out="$(mktemp -d)"
  ln -s "$build/bin" "$tta_out/bin"  # the step runs $BUILD/bin/gradzip-run
  if (BUILD="$tta_out" OUT="$tta_out" TTA_DEVICE=cpu \
      GZ_TTA_ARGS="--width 16 --layers 1 --heads 2 --context 16 --steps 4 --batch 2 --eval-every 2 --exchange-steps 1" \
      tta "" >"$tta_out/log" 2>&1) && [[ -s "$tta_out/tta.json" && -s "$tta_out/tta.md" && -s "$tta_out/tune.md" ]]; then
    echo "the tta step ran: $(grep -c '^| ' "$tta_out/tta.md") table rows"
  else
    tail -20 "$tta_out/log"
    echo "the tta step failed on host tensors"
    bad=1
  fi
  rm -rf "$tta_out"
  # The report from the steps' outputs, with what a CPU machine gives.
  if [[ -n "$out" ]]; then
    OUT="$out"; mkdir -p "$OUT"; LOG="$OUT/check.log"; STEPS_FILE="$OUT/.steps"; : >"$LOG"; : >"$STEPS_FILE"
    ARCH=90; BUDGET=510; MODE_TEXT="--dry-run"; LINK_TEXT="not run"
    note_step dry-run "$( ((bad)) && echo FAIL || echo PASS)" "no GPU: builds, folder and commands only"
    report || true
    rm -f "$STEPS_FILE"
    echo "report: $OUT/report.md ($(ls "$OUT" | wc -l) files)"
  fi
  if ((bad)); then echo "gpu-check --dry-run: FAILED"; return 1; fi
  echo "gpu-check --dry-run: OK"
}

MODE=run QUICK=0 ARG=""
while (($#)); do
  case $1 in
    --prepare) MODE=prepare ;;
    --dry-run) MODE=dry ;;
    --quick) QUICK=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) [[ -z "$ARG" ]] || die "one OUTDIR only"; ARG=$1 ;;
  esac
  shift
done
# The interpreter: GZ_GPU_PYTHON, else the project's own (GZ_PYTHON, which
# scripts/setup.sh exports: a CI machine's python3 has no torch), else the
# image's python3 (the GPU machine's, which has torch).
PYTHON="${GZ_GPU_PYTHON:-${GZ_PYTHON:-$(command -v python3)}}"
case $MODE in
  prepare) prepare ;;
  dry) dry_run "$ARG" ;;
  run)
    [[ -n "$ARG" ]] || { usage >&2; die "OUTDIR is missing"; }
    run_check "$ARG"
    ;;
esac
