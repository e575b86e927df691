#!/usr/bin/env bash
# The main job: set up, build, and run the benchmark with its default settings.
# Extra arguments go to the benchmark.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
gz_apt_deps
gz_build
gz_log "kernel benchmark (one thread; medians of 5 repetitions)"
"$GZ_BUILD_DIR/bin/gradzip-kernels-bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.2 "$@"
