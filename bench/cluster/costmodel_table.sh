#!/usr/bin/env bash
# The cost model against the emulated cluster: gradzip-bench --predict, every
# codec, on flat layouts of RANKS ranks and (NODES=1) 2 nodes x 2 ranks, over
# the LINKS, for each of the ALGORITHMS; then the memory-traffic limit rows
# (2 ranks, 1 Gbit/s, 100M floats, onebit and topk). Run as root on a quiet
# machine (the ranks share its cores), from the repository root, after a build:
#   bench/cluster/costmodel_table.sh [OUT_DIR]      (default: costmodel-<date>)
# Writes each run's JSON and log, the codec rates the model used
# (OUT_DIR/codec-rates.tsv: measured on the first run, then reused) and the
# table (bench/cluster/costmodel_table.py) to OUT_DIR/report.md.
# Defaults (issue 23's table, about 10 minutes on 2 vCPUs): LINKS="1gbit
# 10gbit" RANKS="2 4" NODES=1 ALGORITHMS=auto SIZES=4194304,16777216 ITERS=3.
# Issue 34's grid: RANKS="2 4 8" ALGORITHMS="allgather scatter_reduce ring"
# SIZES=1M,16M BIG=100M (BIG: sizes run on 2 ranks only). SKIP_LIMIT=1 leaves
# the limit rows out.
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

LINKS="${LINKS:-1gbit 10gbit}"
RANKS="${RANKS-2 4}"
NODES="${NODES:-1}"
ALGORITHMS="${ALGORITHMS:-auto}"
for link in $LINKS; do
  for algo in $ALGORITHMS; do
    for n in $RANKS; do
      sizes="$SIZES"
      [[ -n "${BIG:-}" && $n == 2 ]] && sizes="$SIZES,$BIG"
      run "r$n-$algo-$link" -n "$n" --link "$link" -- $(bench) --algorithm "$algo" --sizes "$sizes" \
          --json "$OUT/r$n-$algo-$link.json"
    done
    if [[ $NODES == 1 ]]; then
      run "nodes-$algo-$link" -n 4 --ranks-per-node 2 --link "$link" -- $(bench) --algorithm "$algo" \
          --sizes "$SIZES" --json "$OUT/nodes-$algo-$link.json"
    fi
  done
done
if [[ "${SKIP_LIMIT:-0}" != 1 ]]; then
  run limit -n 2 --link 1gbit -- $(bench) --sizes 100000000 --codecs onebit,topk:density=0.01 \
      --json "$OUT/limit.json"
fi
uptime | tee -a "$OUT/runs.log"
"$PY" "$ROOT/bench/cluster/costmodel_table.py" "$OUT" | tee "$OUT/report.md"
