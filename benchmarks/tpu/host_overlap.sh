#!/usr/bin/env bash
# Host work off the critical path on one TPU v5e chip (issue 56 item 1): the real demo's step
# (SmolLM2-135M shape, 8 prompts x G 8 = 64 rows x 32 new tokens, chat arithmetic) split into
# host time hidden behind device work (`perf/host_hidden`) and exposed (`perf/host_exposed`),
# at β 0 (no device work needs no reward: the gain is the smaller host work) and β 0.04 (the
# reference forward dispatched before scoring, `locojax/train/early.py`).
#
#   OUT=/some/dir bash benchmarks/tpu/host_overlap.sh                       # this checkout
#   OUT=... BEFORE=.tpu-before bash benchmarks/tpu/host_overlap.sh          # and an older one
#   OUT=... TINY=1 JAX_PLATFORMS=cpu bash benchmarks/tpu/host_overlap.sh    # dry run, tiny
#
# Run from the repository root on the TPU machine. It needs, in ignored folders carried with
# the checkout:
#   .tpu-wheels/site.sh                       the dependencies (../shared/tpu/README.md)
#   .tpu-data/configs/smollm2-135m-instruct.json   the published config (../shared/configs/)
#   .tpu-data/smollm2-tokenizer/              the tokenizer of `locojax convert smollm2 DIR`:
#       DIR's config.json, generation_config.json, locojax.json, tokenizer.json and
#       tokenizer_config.json (its chat template), not model.safetensors (2 MB in all)
#   BEFORE (optional)                         a checkout of the code to compare with (e.g.
#       `git archive <commit> | tar -x -C .tpu-before`), run interleaved with this one
# Model: random weights at the published config (written once to $WORK by locojax's own init,
# on the CPU, no torch) with the real tokenizer, so detokenizing costs what it costs in the
# real demo; the real demo's command line otherwise (`locojax train real-demo`), eval off.
# Each run is one process (one holds the chip at a time): a warm-up step, then STEPS steps;
# ROUNDS rounds alternate the order of the sides (benchmarks/host_overlap.py prints the
# medians and the ratios). Everything it prints is also in $OUT (summary.txt last).
set -uo pipefail

OUT=${OUT:?set OUT to the folder the logs go to}
TINY=${TINY:-0}
STEPS=${STEPS:-5}
ROUNDS=${ROUNDS:-2}
BETAS=${BETAS:-"0 0.04"}
BEFORE=${BEFORE:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-500}  # one child run (start, compiles, steps)
WORK=${WORK:-/tmp/locojax-host-overlap}
CONFIG=${CONFIG:-.tpu-data/configs/smollm2-135m-instruct.json}
TOKENIZER=${TOKENIZER:-.tpu-data/smollm2-tokenizer}
. benchmarks/tpu/preamble.sh
say "# BEFORE=${BEFORE:-none}"
[ -f "$TOKENIZER/tokenizer.json" ] || { say "FAILED: no $TOKENIZER/tokenizer.json"; exit 1; }

# The shapes. TINY: the same command on a 2-layer, d=64 model (vocab and tokenizer kept),
# 2 prompts x G 4 and 8 new tokens.
SHAPE=()
if [ "$TINY" = 1 ]; then
  STEPS=${TINY_STEPS:-1}; ROUNDS=${TINY_ROUNDS:-1}
  SHAPE=(--rollout.prompts-per-step 2 --algo.group-size 4 --rollout.max-new-tokens 8)
fi
say "# STEPS=$STEPS ROUNDS=$ROUNDS BETAS=$BETAS; model $MODEL (random init of $CONFIG)"
random_model "$TOKENIZER"  # the real tokenizer, so detokenizing costs what it costs

SIDES=()
if [ -n "$BEFORE" ]; then SIDES+=("before=$BEFORE"); fi
SIDES+=("here=.")
# shellcheck disable=SC2086  # BETAS is a list of words
"$PY" -m benchmarks.host_overlap --sides "${SIDES[@]}" --rounds "$ROUNDS" --steps "$STEPS" \
  --beta $BETAS --timeout "$RUN_TIMEOUT" --out "$OUT/steps.json" \
  -- real-demo --model "$MODEL" "${SHAPE[@]}" 2>&1 | tee "$OUT/host_overlap.log"
rc=${PIPESTATUS[0]}
grep -E '^\||^β' "$OUT/host_overlap.log" >> "$SUMMARY"
if grep -q "Traceback" "$OUT/host_overlap.log"; then say "TRACEBACK in host_overlap.log"; fi
say "# exit $rc; done $(date -u +%FT%TZ)"
exit "$rc"
