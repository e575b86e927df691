# Sourced by the emulated-cluster tables (engine_targets.sh, costmodel_table.sh):
# `run NAME ARGS...` runs `gradzip-run ARGS...` into $OUT/NAME.log, logging the
# command and the load average before it to $OUT/runs.log (the load says
# whether the times can be trusted), and prints the rank-0 lines that
# match $RUN_SHOW (an extended regex; RUN_HIDE drops lines again).
# Needs ROOT (the checkout) and OUT; sets BIN (the programs) and PY (the
# build's Python, for the table scripts) unless given.
BIN="${GRADZIP_BIN_DIR:-$ROOT/build/bin}"
PY="${GZ_PYTHON:-$ROOT/build/venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
RUN_SHOW="${RUN_SHOW:-^\[0\] }"
RUN_HIDE="${RUN_HIDE:-^$}"

run() {
  local name=$1
  shift
  echo "== $name: gradzip-run $*" | tee -a "$OUT/runs.log"
  uptime | tee -a "$OUT/runs.log"
  "$BIN/gradzip-run" "$@" > "$OUT/$name.log" 2>&1 || { cat "$OUT/$name.log"; exit 1; }
  grep -E "$RUN_SHOW" "$OUT/$name.log" | grep -vE "$RUN_HIDE" | tee -a "$OUT/runs.log" || true
}
