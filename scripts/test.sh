#!/usr/bin/env bash
# Every test: set up, build with warnings as errors, run ctest (C++, CUDA
# where a GPU is present, multi-process UCX, the emulated cluster as root),
# install the Python package and run pytest, then fuzz the payload decoders
# for a bounded time with clang's libFuzzer + sanitizers.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
export GZ_WERROR=ON
gz_apt_deps
gz_python_env  # first: the cluster tests that ctest runs use its python3
gz_build
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
gz_log "ctest"
ctest --test-dir "$GZ_BUILD_DIR" --output-on-failure -j "$GZ_JOBS" --timeout 600

# pytest (its "no tests collected" exit, 5, fails here too).
gz_log "pytest (tests/python)"
(cd "$GZ_ROOT" && timeout 1800 "$GZ_PYTHON" -m pytest tests/python -q)

gz_log "fuzzing the decoders (libFuzzer, ASan, UBSan)"
CXX=clang++ cmake -S "$GZ_ROOT" -B "$GZ_ROOT/build-fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGRADZIP_FUZZ=ON -DGRADZIP_CUDA=OFF -DGRADZIP_UCX=OFF -DGRADZIP_BUILD_BENCH=OFF -DGRADZIP_BUILD_TOOLS=OFF \
  -DGRADZIP_WERROR=ON >/dev/null
# Only what the fuzz tests run (not the examples), and the fuzzers side by side.
cmake --build "$GZ_ROOT/build-fuzz" -j "$GZ_JOBS" --target gradzip-decode-fuzzer gradzip-fuzz-seeds \
  gradzip-rendezvous-fuzzer gradzip-state-fuzzer gradzip-rendezvous-seeds
ctest --test-dir "$GZ_ROOT/build-fuzz" --output-on-failure -j "$GZ_JOBS"

gz_log "all tests passed"
