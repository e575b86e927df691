#!/bin/bash
# One call on a lent GPU machine: device facts, the GPU tests, compute-sanitizer
# (memcheck, racecheck) on the test binary, the CUDA kernel benchmarks and the
# torch top-k reference. Expects the binaries built elsewhere (GRADZIP_NATIVE=OFF)
# under $G/bin, the shared libraries they need under $G/lib, and writes logs
# under $OUT. Usage: G=.gpu OUT=/tmp/out bash device_run.sh [tests|bench|all]
set -u
G=${G:-.gpu}
OUT=${OUT:-/tmp/gz-out}
WHAT=${1:-all}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$G/lib:${LD_LIBRARY_PATH:-}
exec > >(tee "$OUT/run.log") 2>&1

echo "## device"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pstate --format=csv
nvidia-smi | head -12
ldd $G/bin/gradzip-gpu-tests | grep -E "not found|cudart|benchmark" || true
git log -1 --format='checkout: %H %s' 2>/dev/null || true
cat $G/COMMIT 2>/dev/null

if [ "$WHAT" = quick ]; then
  echo "## tests"
  timeout 200 $G/bin/gradzip-gpu-tests --gtest_brief=1 > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
  tail -n 12 "$OUT/tests.log"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  echo "## tests, memcheck and racecheck (in parallel)"
  SAN_FILTER='-CudaCodec.TopkIsDeterministic:CudaCodec.SampledTopkRespectsTheBound:CudaCodec.ErrorFeedbackInvariant:CudaCodec.TopkIsTheKLargestBySort:PayloadHeaderCheck.*'
  ( timeout 300 $G/bin/gradzip-gpu-tests --gtest_brief=1 > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log" ) &
  p1=$!
  ( GZ_TEST_MAX_N=5000 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
      $G/bin/gradzip-gpu-tests --gtest_brief=1 --gtest_filter="$SAN_FILTER" > "$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$?" >> "$OUT/memcheck.log" ) &
  p2=$!
  ( GZ_TEST_MAX_N=70001 timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
      $G/bin/gradzip-gpu-tests --gtest_brief=1 \
      --gtest_filter='Codecs/CudaCodecVsCpu.*topk*65537*:Codecs/CudaCodecVsCpu.*onebit_65537*:Codecs/CudaPayloadValidation.*topk*' \
      > "$OUT/racecheck.log" 2>&1
    echo "racecheck rc=$?" >> "$OUT/racecheck.log" ) &
  p3=$!
  wait $p1 $p2 $p3  # not a bare wait: that would also wait for the tee above
  tail -n 25 "$OUT/tests.log"
  grep -E "ERROR SUMMARY|rc=|PASSED|FAILED" "$OUT/memcheck.log" | tail -n 8
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|rc=|PASSED|FAILED" "$OUT/racecheck.log" | tail -n 8
fi

if [ "$WHAT" != tests ]; then
  echo "## benchmarks (alone on the GPU)"
  timeout 150 $G/bin/gradzip-kernels-bench --benchmark_filter='_cuda' --benchmark_min_time=0.2 \
    --benchmark_out="$OUT/bench.json" --benchmark_out_format=json > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  grep -vE "^\s*$" "$OUT/bench.log" | grep -E "_cuda|%|target|#" | cut -c1-150
  echo "## torch reference"
  PYTHONUNBUFFERED=1 timeout 120 python3 $G/topk_torch.py --bench-json "$OUT/bench.json" --json "$OUT/torch.json" \
    > "$OUT/torch.log" 2>&1
  echo "torch rc=$?"
  cat "$OUT/torch.log"
fi
