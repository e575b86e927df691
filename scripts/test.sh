#!/usr/bin/env bash
# Every test: set up, build with warnings as errors, run ctest (C++, CUDA
# where a GPU is present, multi-process UCX, the emulated cluster as root),
# install the Python package and run pytest, then fuzz the payload decoders
# for a bounded time with clang's libFuzzer + sanitizers.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
export GZ_WERROR=ON
gz_apt_deps
# Should this script stop early, its background jobs still end before it
# does (a rerun must not meet pip installing into the same environment).
trap 'wait || true' EXIT

# Waits for the background job PID, logged to LOG, and fails this script
# as it failed. The log is shown on failure, and always with "always".
finish_job() {
  local pid=$1 log=$2 what=$3 show=${4:-} ok=0
  wait "$pid" || ok=$?
  if [[ $show == always || $ok != 0 ]]; then cat "$log"; fi
  rm -f "$log"
  ((ok == 0)) || { echo "$what failed (status $ok)" >&2; exit "$ok"; }
}

gz_python_base  # first: the build's configure finds its python3, which the cluster tests that ctest runs use
# torch and the other packages download and install beside the C++ build
# (which needs none of them), into the same environment, logged apart.
pip_log="$(mktemp)"
gz_python_packages >"$pip_log" 2>&1 &
pip_job=$!
gz_build
gz_log "waiting for the Python packages (installed beside the build)"
finish_job "$pip_job" "$pip_log" "installing the Python packages" always
# The Python package before ctest: the cluster tests import it, and an older
# install left in the venv would be tested instead of this tree's.
gz_python
# The GPU check's prepared folder (Debian packages and wheels, about 8 MB),
# for its dry run in ctest (gpu_check.dry_run, docs/gpu-check.md).
if [[ -x "$GZ_BUILD_DIR/bin/gradzip-gpu-tests" ]] &&
   [[ ! -f "$GZ_ROOT/.gpu/MANIFEST" || "$GZ_ROOT/scripts/gpu-check.sh" -nt "$GZ_ROOT/.gpu/MANIFEST" ]]; then
  gz_log "preparing .gpu/ for the GPU check's dry run"
  "$GZ_ROOT/scripts/gpu-check.sh" --prepare
fi
# The fuzzers' build (clang with sanitizers; CPU only, nothing timed) runs
# beside ctest and pytest at the lowest priority: it gets the CPU time they
# leave idle (ctest's multi-process tests wait out timeouts on purpose: it
# keeps about 1.1 of 2 cores busy), not theirs.
fuzz_build() {
  CXX=clang++ cmake -S "$GZ_ROOT" -B "$GZ_ROOT/build-fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADZIP_FUZZ=ON -DGRADZIP_CUDA=OFF -DGRADZIP_UCX=OFF -DGRADZIP_BUILD_BENCH=OFF -DGRADZIP_BUILD_TOOLS=OFF \
    -DGRADZIP_WERROR=ON >/dev/null
  # Only what the fuzz tests run (not the examples), and the fuzzers side by side.
  cmake --build "$GZ_ROOT/build-fuzz" -j "$GZ_JOBS" --target gradzip-decode-fuzzer gradzip-fuzz-seeds \
    gradzip-rendezvous-fuzzer gradzip-state-fuzzer gradzip-rendezvous-seeds
}
gz_log "building the fuzzers (libFuzzer, ASan, UBSan) beside ctest and pytest, at nice 19"
fuzz_log="$(mktemp)"
(renice -n 19 -p "$BASHPID" >/dev/null && fuzz_build) >"$fuzz_log" 2>&1 &
fuzz_job=$!

gz_log "ctest"
ctest --test-dir "$GZ_BUILD_DIR" --output-on-failure -j "$GZ_JOBS" --timeout 600

# pytest (its "no tests collected" exit, 5, fails here too), a file per
# worker at a time (pytest-xdist): a module's fixtures (a stack's launches,
# the digits runs) are made once. Two workers even on 2 cores fill part
# of the time multi-rank tests wait (interpreters starting, ranks waiting
# out a timeout on purpose): 408 s serial, 303 s so (BENCHMARKS.md 12).
workers="${GZ_PYTEST_WORKERS:-$((GZ_JOBS < 2 ? 2 : GZ_JOBS > 4 ? 4 : GZ_JOBS))}"
gz_log "pytest (tests/python, $workers workers)"
(cd "$GZ_ROOT" && timeout 1800 "$GZ_PYTHON" -m pytest tests/python -q -n "$workers" --dist loadfile --durations=25)

gz_log "fuzzing the decoders (libFuzzer, ASan, UBSan)"
finish_job "$fuzz_job" "$fuzz_log" "building the fuzzers"
ctest --test-dir "$GZ_ROOT/build-fuzz" --output-on-failure -j "$GZ_JOBS"

gz_log "all tests passed"
