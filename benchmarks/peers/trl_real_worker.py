"""The TRL side of `bench_real_trl.py`: TRL's `GRPOTrainer` on the real SmolLM2 checkpoint and
locojax's own task, in TRL's venv.

The task is locojax's (`locojax.envs` is plain Python and numpy, so TRL's venv imports it
from the repository), the settings' (`task_of`): the real demo's chat arith, or GSM8K from a
data file in the chat template (`real_runs.gsm8k_settings`). The same prompts in the same
order as `locojax train` with this seed (`train.data.PromptStream`), as conversational
`prompt` rows that TRL renders with the checkpoint's chat template, and the same reward
function, called on each completion's text.
TRL's settings are set where they differ from the locojax side's and left at TRL's defaults
otherwise (`loss_type="dapo"`, i.e. token-mean over the batch; `scale_rewards="group"`;
ε 0.2); `bench_real_trl.py` passes the locojax side the same values.

Writes OUT/metrics.jsonl in locojax's format (one line per step: `reward/mean`,
`perf/step_time`), so `locojax plot` overlays both sides, and OUT/final_model, which
`locojax eval` scores on the held-out split as it scores the locojax side's. With TRL's
`completions/mean_length` beside each step, which shows a fixed length (EOS suppressed) held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.peers.trl_common import grpo_config


def task_of(s: dict, seed: int):
    """locojax's task of the settings, as `locojax train` builds it (envs/registry.py):
    GSM8K from its data file (its held-out split the same file, as when `--task.test-data`
    is not given), or the real demo's chat arith."""
    if s.get("task") == "gsm8k":
        from locojax.envs import gsm8k

        return gsm8k.task(s["data"], s["data"], template=s["template"], mode=s["reward"])
    from locojax.envs.tasks import arith

    return arith.task(level=s["level"], template="chat", mode=s["reward"], seed=seed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--settings", required=True, help="JSON of bench_real_trl.SETTINGS")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: TRL's own GPU path (the comparison's step times are CPU's)")
    args = ap.parse_args(argv)
    s = json.loads(args.settings)

    import datasets
    import torch
    import trl
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from locojax.train.data import PromptStream

    torch.set_num_threads(os.cpu_count())
    B, G = s["prompts_per_step"], s["group_size"]
    task = task_of(s, args.seed)
    stream = PromptStream(task.train, args.seed)
    examples = [ex for step in range(args.steps) for ex in stream.take(step, B, 0, B)]
    data = datasets.Dataset.from_dict({"prompt": [list(ex.prompt) for ex in examples],
                                       "row": list(range(len(examples)))})

    def locojax_reward(completions, row, **_):
        return [task.reward(c[0]["content"], examples[i]) for c, i in zip(completions, row)]

    out = Path(args.out)
    config = grpo_config(s, out / "trl", args.steps, args.seed, args.device, torch)
    trainer = GRPOTrainer(model=args.model, reward_funcs=locojax_reward, args=config,
                          train_dataset=data)

    class Log(TrainerCallback):
        """One metrics line per optimizer step: its mean reward and wall seconds."""

        def __init__(self):
            self.t, self.file = time.perf_counter(), open(out / "metrics.jsonl", "w")

        def on_log(self, _args, state, _control, logs=None, **_):
            if logs and "reward" in logs:
                now = time.perf_counter()
                row = {"step": state.global_step, "reward/mean": float(logs["reward"]),
                       "perf/step_time": now - self.t}
                if "completions/mean_length" in logs:
                    row["completions/mean_length"] = float(logs["completions/mean_length"])
                self.file.write(json.dumps(row) + "\n")
                self.file.flush()
                self.t = now

    out.mkdir(parents=True, exist_ok=True)
    trainer.add_callback(Log())
    print(f"trl {trl.__version__} torch {torch.__version__} device {args.device} "
          f"threads {torch.get_num_threads()} "
          f"loss_type {config.loss_type} scale_rewards {config.scale_rewards}", flush=True)
    trainer.train()
    trainer.save_model(str(out / "final_model"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
