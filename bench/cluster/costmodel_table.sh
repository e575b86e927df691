#!/usr/bin/env bash
# Issue 23's cost model against the emulated cluster: gradzip-bench --predict
# (auto's choice, every codec, >= 4M floats) on 2 ranks, 4 ranks and 2 nodes x
# 2 ranks, over 1 and 10 Gbit/s links; then the memory-traffic limit rows
# (2 ranks, 1 Gbit/s, 100M floats, onebit and topk). Run as root on a quiet
# machine (the ranks share its cores), from the repository root, after a build:
#   bench/cluster/costmodel_table.sh [OUT_DIR]      (default: costmodel-<date>)
# Writes each run's JSON and log, the codec rates the model used
# (OUT_DIR/codec-rates.tsv: measured on the first run, then reused) and the
# table (bench/cluster/costmodel_table.py) to OUT_DIR/report.md. About 10
# minutes on 2 vCPUs; SIZES, ITERS and SKIP_LIMIT=1 shorten it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-costmodel-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ITERS="${ITERS:-3}"
SIZES="${SIZES:-4194304,16777216}"
export GRADZIP_RATES_CACHE="$OUT/codec-rates.tsv"
{ echo "commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with local changes)')"
  lscpu | grep 'Model name'; grep -o -w -E 'avx2|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  date -u; } > "$OUT/machine.txt"

RUN_SHOW='^\[0\] # model'  # the model's measured inputs
source "$ROOT/bench/cluster/run_lib.sh"

bench() { echo "$BIN/gradzip-bench --predict --iters $ITERS --warmup 1 --timeout 600"; }

for link in 1gbit 10gbit; do
  run "two-$link" -n 2 --link $link -- $(bench) --sizes "$SIZES" --json "$OUT/two-$link.json"
  run "four-$link" -n 4 --link $link -- $(bench) --sizes "$SIZES" --json "$OUT/four-$link.json"
  run "nodes-$link" -n 4 --ranks-per-node 2 --link $link -- $(bench) --sizes "$SIZES" --json "$OUT/nodes-$link.json"
done
if [[ "${SKIP_LIMIT:-0}" != 1 ]]; then
  run limit -n 2 --link 1gbit -- $(bench) --sizes 100000000 --codecs onebit,topk:density=0.01 \
      --json "$OUT/limit.json"
fi
uptime | tee -a "$OUT/runs.log"
"$PY" "$ROOT/bench/cluster/costmodel_table.py" "$OUT" | tee "$OUT/report.md"
