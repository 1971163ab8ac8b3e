# Sourced by the chip's scripts (qwen3_fit.sh, host_overlap.sh) from the repository root,
# after they set OUT, TINY, WORK, CONFIG: the summary file and `say`, the dependencies
# (../shared/tpu/README.md's .tpu-wheels/site.sh where carried), PY, the run's header, and
# the random-weight checkpoint `random_model TOKENIZER` writes once to $MODEL (TINY: the
# config cut to 2 layers at d 64, vocabulary kept; benchmarks/tpu/random_model.py).
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

if [ -f .tpu-wheels/site.sh ]; then . .tpu-wheels/site.sh; fi
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

say "# benchmarks/tpu/$(basename "$0"): $(date -u +%FT%TZ) on $(hostname); TINY=$TINY"
say "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (modified)')"
# (jax's version only: a process that opens the chip pays ~10-15 s)
"$PY" -c 'import jax; print(f"# jax {jax.__version__}")' 2>&1 | tee -a "$SUMMARY"

MODEL="$WORK/model-$(basename "$CONFIG" .json)$([ "$TINY" = 1 ] && echo -tiny)"

random_model() {  # tokenizer: `tiny` (the char tokenizer) or a directory to copy it from
  [ -f "$MODEL/model.safetensors" ] && return 0
  mkdir -p "$WORK"
  local tiny=(); [ "$TINY" = 1 ] && tiny=(--tiny)
  # On the CPU, so this process never holds the chip.
  JAX_PLATFORMS=cpu timeout 300 "$PY" -m benchmarks.tpu.random_model "$CONFIG" "$MODEL" \
    --tokenizer "$1" "${tiny[@]}" --made-by "benchmarks/tpu/$(basename "$0"): $CONFIG" \
    2>&1 | tee "$OUT/write_model.log"
  [ -f "$MODEL/model.safetensors" ] || { say "FAILED: could not write $MODEL"; exit 1; }
}
