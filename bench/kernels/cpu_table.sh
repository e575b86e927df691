#!/usr/bin/env bash
# The CPU kernel tables of BENCHMARKS.md section 1, for a quiet machine:
#
#   bench/kernels/cpu_table.sh [BUILD_DIR]     (default: build)
#
# Runs every CPU benchmark of gradzip-kernels-bench (1M, 16M, 64M; five
# repetitions, medians), keeps the Google Benchmark JSON in
# BUILD_DIR/kernels-cpu-<UTC time>.json, and prints what a BENCHMARKS.md
# entry needs: commit, date, load average before and after, the machine
# (CPU model, its ISA, the ISA the kernels were built for), the bench's own
# summary with the targets, and the markdown tables. About 5-10 minutes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
bench="$build/bin/gradzip-kernels-bench"
if [[ ! -x "$bench" ]]; then
  echo "no $bench: build first (source scripts/setup.sh; GZ_BUILD_DIR=$build gz_build)" >&2
  exit 1
fi

json="$build/kernels-cpu-$(date -u +%Y%m%dT%H%M%SZ).json"
commit="$(git -C "$root" rev-parse --short HEAD)"
git -C "$root" diff --quiet HEAD -- kernels bench || commit="$commit + uncommitted changes in kernels/ or bench/"
echo "commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# JSON on stdout into the file; the summary (text) arrives on stderr.
"$bench" --benchmark_filter='^(copy|encode|decode|topk_select|nth_element)/' \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 \
  --benchmark_format=json >"$json"

echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); JSON: $json"
echo
python3 "$root/scripts/kernels_bench_table.py" "$json"
