#!/usr/bin/env bash
# The C++ targets of issue 16, measured exactly as BENCHMARKS.md reports them:
# gradzip-bench and torch's gloo allreduce on the emulated 1 Gbit/s cluster.
#   1. 2 ranks, 100M floats: onebit and topk 1% >= 22x, fp16 >= 1.95x faster
#      than gradzip's fp32; fp32 <= 1.05x the link bound, no slower than gloo
#      (also at 4M and 16M floats).
#   2. 4 ranks, 100M floats: onebit and topk 1% >= 12x.
#   3. 2 nodes x 2 ranks, 25.6M floats: hierarchical onebit >= 1.5x faster
#      than flat scatter_reduce onebit, with no larger error.
# Run as root on a quiet machine (nothing else running: the ranks share its
# cores), from the repository root, after a build:
#   bench/cluster/engine_targets.sh [OUT_DIR]     (default: engine-targets-<date>)
# It writes each run's JSON and log to OUT_DIR and prints the report
# (bench/cluster/engine_targets.py) to stdout and OUT_DIR/report.md. About
# 10 minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-engine-targets-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
ITERS="${ITERS:-3}"

RUN_HIDE='^\[0\] # (times|baseline|\(hier|The calls|are the|hidden|least|workspace)'  # the header's prose
source "$ROOT/bench/cluster/run_lib.sh"

bench() { echo "$BIN/gradzip-bench --iters $ITERS --warmup 1 --timeout 600"; }
gloo() { echo "$PY $ROOT/python/gradzip/baselines/gloo_allreduce.py --iters $ITERS --warmup 1 --timeout 600"; }

# 1. two ranks
run two-bench -n 2 --link 1gbit -- $(bench) --sizes 100000000 --codecs none,fp16,onebit,topk:density=0.01 \
    --json "$OUT/two-bench.json"
run two-fp32 -n 2 --link 1gbit -- $(bench) --sizes 4194304,16777216 --codecs none --json "$OUT/two-fp32.json"
run two-gloo -n 2 --link 1gbit -- $(gloo) --sizes 4194304,16777216,100000000 --json "$OUT/two-gloo.json"
# 2. four ranks
run four-bench -n 4 --link 1gbit -- $(bench) --sizes 100000000 --codecs none,onebit,topk:density=0.01 \
    --json "$OUT/four-bench.json"
run four-gloo -n 4 --link 1gbit -- $(gloo) --sizes 100000000 --json "$OUT/four-gloo.json"
# 3. two nodes of two ranks
run nodes-flat -n 4 --ranks-per-node 2 --link 1gbit -- $(bench) --sizes 25600000 --codecs onebit \
    --algorithm scatter_reduce --json "$OUT/nodes-flat.json"
run nodes-hier -n 4 --ranks-per-node 2 --link 1gbit -- $(bench) --sizes 25600000 --codecs onebit \
    --algorithm hierarchical --json "$OUT/nodes-hier.json"

"$PY" "$ROOT/bench/cluster/engine_targets.py" "$OUT" | tee "$OUT/report.md"
