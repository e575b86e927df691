#!/usr/bin/env bash
# The main job: set up, build, and run the benchmark with its default settings:
# 4 ranks on an emulated 1 Gbit/s cluster (gradzip-run --link, docs/cluster.md)
# when this machine can make one (root, iproute2, network namespaces), else 4
# local ranks over loopback, saying why. Extra arguments go to the benchmark.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
gz_apt_deps
gz_build

# Why no emulated cluster can run here ("" when one can).
why_no_cluster() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "not root (network namespaces and tc need it)"
    return
  fi
  local tool
  for tool in ip tc; do
    if ! command -v "$tool" >/dev/null && [[ ! -x /usr/sbin/$tool && ! -x /sbin/$tool ]]; then
      echo "iproute2's $tool is missing"
      return
    fi
  done
  local probe="gzrun-probe-$$" ip
  ip=$(command -v ip || echo /usr/sbin/ip)
  if ! "$ip" netns add "$probe" 2>/dev/null; then
    echo "this machine does not let us make network namespaces"
    return
  fi
  "$ip" netns del "$probe" 2>/dev/null || true
}

reason="$(why_no_cluster)"
if [[ -z "$reason" ]]; then
  gz_log "compressed allreduce benchmark: 4 ranks on an emulated 1 Gbit/s cluster (gradzip-run --link 1gbit), every codec"
  "$GZ_BUILD_DIR/bin/gradzip-run" -n 4 --link 1gbit -- "$GZ_BUILD_DIR/bin/gradzip-bench" "$@"
else
  gz_log "compressed allreduce benchmark: 4 local ranks over UCX, every codec"
  echo "gradzip: no emulated 1 Gbit/s cluster here ($reason): the ranks talk over loopback and shared memory, where compression saves little time"
  "$GZ_BUILD_DIR/bin/gradzip-run" -n 4 -- "$GZ_BUILD_DIR/bin/gradzip-bench" "$@"
fi
