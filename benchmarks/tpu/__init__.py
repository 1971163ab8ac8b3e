"""Runs made for one accelerator chip (a TPU v5e here), each a script that does a whole
experiment in one process and leaves its logs under one folder, since a borrowed chip is
held for minutes at a time:

- lora_runs (started by lora.sh): LoRA's pre-registered SmolLM2 claim and Qwen3-1.7B LoRA
  GRPO on one chip (issue 57, docs/lora.md), and the real demo's claim and steps-to-target
  table on the chip (issue 55, docs/results/tpu_real_model.md).
- peak_probe: whether the device's peak-bytes statistic counts a program's temporaries.
- decode_blocks: a decode token step's time per attention block size, against the bytes
  it must read (issue 56 item 2).
- decode_profile: a decode token step's time and its device ops per decode knob
  (`attention.DECODE_AS_DOTS`, `attention.HALF_AS_BITS`), traced (issue 56 item 2);
  token_step: the random decoder both decode with, and the bytes a token step must
  read, which both judge it against.
- decode_parts: a decode token step's time attributed by timing its parts apart (the
  cached forward per layer count, the logits and sampler, the rest as differences), each
  against its bytes, without a trace (issue 56 item 2); decode_parts_programs: the parts.
- random_model: the random-weight checkpoint of a published config those runs train
  (qwen3_fit.sh and host_overlap.sh through preamble.sh, their shared shell set-up).
- ballast: the memory plan's peak checked by the ballast a step survives (qwen3_fit.sh's
  BALLAST=1), since that statistic does not count them on a TPU.
"""
