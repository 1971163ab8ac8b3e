#!/usr/bin/env bash
# Makes, on this machine, the two ignored folders the chip's scripts need and the device call
# carries with the checkout (`carry: [".tpu-wheels", ".tpu-data"]`, ~7 MB of the 64 MiB):
#   .tpu-wheels/   the wheels a bare TPU image lacks and site.sh (../shared/tpu/README.md)
#   .tpu-data/configs/*.json          the published configs (../shared/configs/)
#   .tpu-data/gsm8k/train.jsonl       the first 3000 GSM8K rows (../shared/data/gsm8k/)
#   .tpu-data/smollm2-tokenizer/      `locojax convert smollm2`'s files but its weights
#                                     (with TOKENIZER=1: needs `make real-model`, ~1 min)
# Ignored folders do not survive a fresh checkout: run this once a session, from the
# repository root, before the first device call.
#
#   bash benchmarks/tpu/carry.sh [SHARED]        # SHARED: default ../shared
set -eu
shared=${1:-../shared}
[ -f .tpu-wheels/site.sh ] || bash "$shared/tpu/fetch_wheels.sh" .tpu-wheels >/dev/null 2>&1
mkdir -p .tpu-data/configs .tpu-data/gsm8k
cp "$shared"/configs/*.json .tpu-data/configs/
head -3000 "$shared/data/gsm8k/train.jsonl" > .tpu-data/gsm8k/train.jsonl
if [ "${TOKENIZER:-0}" = 1 ]; then
  make real-model >/dev/null
  mkdir -p .tpu-data/smollm2-tokenizer
  for f in config.json generation_config.json locojax.json tokenizer.json tokenizer_config.json; do
    cp "models/SmolLM2-135M-Instruct/$f" .tpu-data/smollm2-tokenizer/ 2>/dev/null || true
  done
fi
for d in .tpu-wheels .tpu-data; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
du -sh .tpu-wheels .tpu-data
