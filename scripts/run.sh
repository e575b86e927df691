#!/usr/bin/env bash
# The main job: set up, build, and run the benchmark with its default settings.
# Extra arguments go to the benchmark.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
gz_apt_deps
gz_build
gz_log "compressed allreduce benchmark: 4 local ranks over UCX, every codec"
"$GZ_BUILD_DIR/bin/gradzip-run" -n 4 -- "$GZ_BUILD_DIR/bin/gradzip-bench" "$@"
