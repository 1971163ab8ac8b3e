"""Runs made for one accelerator chip (a TPU v5e here), each a script that does a whole
experiment in one process and leaves its logs under one folder, since a borrowed chip is
held for minutes at a time:

- lora_runs (started by lora.sh): LoRA's pre-registered SmolLM2 claim and Qwen3-1.7B LoRA
  GRPO on one chip (issue 57, docs/lora.md), and the real demo's claim and steps-to-target
  table on the chip (issue 55, docs/results/tpu_real_model.md).
- peak_probe: whether the device's peak-bytes statistic counts a program's temporaries.
"""
