#!/usr/bin/env bash
# LoRA on one TPU v5e chip (issue 57): docs/lora.md's pre-registered SmolLM2-135M sweep and
# seeds (real-demo, LoRA against the full fine-tune), then Qwen3-1.7B LoRA GRPO for 20 steps.
#
# From the repository root on the TPU machine (single mode only: no sockets there):
#   bash benchmarks/tpu/lora.sh                 # sweep, seeds, qwen (v5e: 5 + 7 minutes)
#   bash benchmarks/tpu/lora.sh sweep seeds     # or any of the stages alone
#   bash benchmarks/tpu/lora.sh target          # steps to held-out 0.70 at 4-32 prompts a step
# Needs: .tpu-wheels/ (../shared/tpu/fetch_wheels.sh), the SmolLM2 GGUF at $GGUF and the
# Qwen3-1.7B config at $QWEN_CONFIG. Logs, results.jsonl and the table go under $OUT.
# A CPU dry run at a toy size: JAX_PLATFORMS=cpu bash benchmarks/tpu/lora.sh --toy
set -euo pipefail
OUT=${OUT:-/tmp/lora-out}
GGUF=${GGUF:-/tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
QWEN_CONFIG=${QWEN_CONFIG:-.tpu-data/configs/qwen3-1.7b.json}
mkdir -p "$OUT"
if [ -f .tpu-wheels/site.sh ]; then . .tpu-wheels/site.sh; fi
python3 -c 'import jax; print("devices:", jax.devices())'
python3 -m benchmarks.tpu.lora_runs --out "$OUT" --gguf "$GGUF" --qwen-config "$QWEN_CONFIG" \
  "$@" 2>&1 | tee -a "$OUT/lora.log"
