#!/usr/bin/env bash
# One chip call of benchmarks/tpu/decode_parts.py (a token step's parts timed apart,
# issue 56 item 2) on SmolLM2-135M (64 rows, P 48, tokens 16..48) and Qwen3-0.6B (64 rows,
# P 128, tokens 32..96), the default arm of both first, then the cpu arm of each while time
# is left. Run from the repository root (LIMIT: the whole call's seconds, site set-up
# included; .tpu-wheels and .tpu-data from benchmarks/tpu/carry.sh):
#   OUT=DIR LIMIT=280 bash benchmarks/tpu/decode_parts.sh Everything under $OUT: per run a folder with
# decode_parts.json (saved after every round) and a .log beside it; summary.log the summary.
set -uo pipefail
OUT=${OUT:?set OUT to the folder the logs go to}
LIMIT=${LIMIT:-280}; T0=$SECONDS
left() { echo $((LIMIT - (SECONDS - T0))); }
mkdir -p "$OUT"; LOG="$OUT/summary.log"
say() { echo "[$((SECONDS - T0))s] $*" | tee -a "$LOG"; }
. .tpu-wheels/site.sh
say "site ready; git $(git rev-parse --short HEAD 2>/dev/null); $(hostname); $(python3 -c 'import jax; print(jax.__version__)' 2>&1 | tail -1)"
parts() {  # name config prompt n1 n2 arm cap_s min_s
  local t; t=$(( $(left) - 5 )); [ "$t" -gt "$7" ] && t=$7
  [ "$t" -lt "$8" ] && { say "$1 $6: not started, ${t}s left"; return; }
  say "$1 $6 (timeout $t)"
  timeout -k 5 "$t" python3 -m benchmarks.tpu.decode_parts --config ".tpu-data/configs/$2.json" \
    --rows 64 --prompt "$3" --n1 "$4" --n2 "$5" --arms "$6" --out "$OUT/$1_$6" \
    > "$OUT/$1_$6.log" 2>&1
  say "$1 $6 rc $?"
  grep -E '^(\||per layer|arm |round )' "$OUT/$1_$6.log" | tee -a "$LOG"
}
parts smollm2 smollm2-135m-instruct 48 16 48 default 90 40
parts qwen3 qwen3-0.6b 128 32 96 default 110 50
parts smollm2 smollm2-135m-instruct 48 16 48 cpu 70 45
parts qwen3 qwen3-0.6b 128 32 96 cpu 90 60
say "done"
