#!/usr/bin/env bash
# scripts/setup.sh's gz_build configures as its caller asks, and keeps the
# build folder's -Werror setting when the caller does not say: run.sh after
# test.sh must reuse test.sh's build, not recompile it with other flags.
# cmake is replaced by a function that records its arguments.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

configure_args() {  # GZ_WERROR as given ("" = unset); prints the configure's arguments
  (
    if [[ -n "$1" ]]; then export GZ_WERROR=$1; else unset GZ_WERROR; fi
    export GZ_BUILD_DIR="$tmp/build"
    # shellcheck source=/dev/null
    source "$root/scripts/setup.sh"
    cmake() { [[ $1 == --build ]] || echo "$*"; }
    gz_log() { :; }
    gz_build
  )
}

# A new build folder: warnings stay warnings unless asked.
[[ "$(configure_args "")" == *"-DGRADZIP_WERROR=OFF"* ]] || fail "a new build folder is not configured with WERROR=OFF"
[[ "$(configure_args ON)" == *"-DGRADZIP_WERROR=ON"* ]] || fail "GZ_WERROR=ON (test.sh) is not passed on"
# A build folder test.sh made (WERROR=ON): run.sh, which sets nothing, keeps it.
mkdir -p "$tmp/build"
echo "GRADZIP_WERROR:BOOL=ON" >"$tmp/build/CMakeCache.txt"
args="$(configure_args "")"
[[ "$args" != *GRADZIP_WERROR* ]] || fail "run.sh's configure changes the build folder's WERROR: $args"
[[ "$(configure_args OFF)" == *"-DGRADZIP_WERROR=OFF"* ]] || fail "an explicit GZ_WERROR=OFF is not passed on"
echo "1 passed, 0 failed"
