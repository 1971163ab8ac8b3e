"""A pre-registered point's `locojax train` arguments and its model: the leaf that
validate_heldout (which runs the points) and memory_vs_plan (which reads their plans) share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def train_args(pt: dict, run_dir: Path) -> list[str]:
    """The `train` arguments of a point (the file's workload): the arithmetic demo's, or for
    a point of a published config (set 10's, `with_models`) GSM8K's on its random weights."""
    shape = ["--rollout.prompts-per-step", str(pt["prompts"]),
             "--algo.group-size", str(pt["group"]),
             "--rollout.max-prompt-tokens", str(pt["prompt_tokens"]),
             "--rollout.max-new-tokens", str(pt["new_tokens"]), "--rollout.ignore-eos",
             "--algo.beta", "0", "--steps", str(pt["steps"]), "--eval.every", "0",
             "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir)]
    if "config" in pt:
        return ["gsm8k", "--mode", "single", "--model", pt["model"], "--task.data", pt["data"],
                "--task.template", "plain", "--task.skip-invalid", "--precision",
                pt["precision"], "--remat", pt["remat"], *shape]
    return ["demo", "--mode", pt["mode"], "--model", pt["model"], "--task.name", "arith",
            "--task.level", "3", *shape]


def with_models(points: list[dict], configs: Path, data: str, models: Path,
                tiny: bool = False) -> list[dict]:
    """The points, each of a published config (`"config"`: CONFIGS/NAME.json) given its
    random-weight checkpoint under MODELS (written once, on the CPU so that this process
    never holds an accelerator: benchmarks/tpu/random_model.py; `tiny` cuts it to 2 layers
    at d 64 for a dry run), the GSM8K rows `data`, and single mode on one device."""
    out = []
    for pt in points:
        if "config" in pt:
            model = models / (pt["config"] + ("-tiny" if tiny else ""))
            if not (model / "model.safetensors").exists():
                subprocess.run([sys.executable, "-m", "benchmarks.tpu.random_model",
                                str(configs / f"{pt['config']}.json"), str(model),
                                "--tokenizer", "tiny", *(["--tiny"] if tiny else [])],
                               check=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
            pt = {**pt, "model": str(model), "data": data, "mode": "single", "n": 1}
        out.append(pt)
    return out
