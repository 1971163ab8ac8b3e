"""The TRL side of `ab_sample_trl.py`: what TRL's `GRPOTrainer` samples from the real
SmolLM2 checkpoint before any update, on the held-out rows `locojax eval` scores.

The trainer is built as `trl_real_worker.py` builds it (`trl_common.grpo_config`), and its own
generation step, `GRPOTrainer._generate`, draws the completions: TRL's chat-template
rendering, left padding, `generate` with TRL's GenerationConfig and its cut at the first
stop token, in train mode as during training. Each row's prompt is repeated `--k` times in a
row, as TRL's sampler repeats it G times. The rows are `locojax.envs`' own (the arith task's
test split for this seed, as `locojax eval --task arith --seed S` reads them), scored by the
task's reward.

Writes OUT (jsonl): one line per row, `id`, `rewards`, `lengths` and `truncated` (no stop
token within the budget), the fields `locojax eval --out` writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=200, help="the first this many held-out rows")
    ap.add_argument("--k", type=int, default=16, help="samples of each row")
    ap.add_argument("--batch", type=int, default=8, help="rows per generate call")
    ap.add_argument("--settings", required=True, help="JSON of bench_real_trl.SETTINGS")
    args = ap.parse_args(argv)
    s = json.loads(args.settings)

    import datasets
    import torch
    from trl import GRPOTrainer

    from benchmarks.peers.trl_common import grpo_config
    from locojax.envs.tasks import arith

    torch.set_num_threads(os.cpu_count())
    task = arith.task(level=s["level"], template="chat", mode=s["reward"], seed=args.seed)
    rows = list(task.test)[:args.rows]
    data = datasets.Dataset.from_dict({"prompt": [list(ex.prompt) for ex in rows[:1]]})
    sizes = dict(s, prompts_per_step=args.batch, group_size=args.k)
    config = grpo_config(sizes, Path(args.out + ".trl"), 1, args.seed, "cpu", torch)
    trainer = GRPOTrainer(model=args.model, reward_funcs=lambda **_: [], args=config,
                          train_dataset=data)
    trainer.model.train()  # TRL samples in train mode during training
    stops = set(trainer.eos_token_ids) | {trainer.processing_class.pad_token_id}
    with open(args.out, "w") as f:
        for start in range(0, len(rows), args.batch):
            chunk = rows[start:start + args.batch]
            prompts = [list(ex.prompt) for ex in chunk for _ in range(args.k)]
            _, ids, _, completions, *_ = trainer._generate(prompts)
            for i, ex in enumerate(chunk):
                mine = range(i * args.k, (i + 1) * args.k)
                f.write(json.dumps({
                    "id": ex.id,
                    "rewards": [float(task.reward(completions[j][0]["content"], ex))
                                for j in mine],
                    "lengths": [len(ids[j]) for j in mine],
                    "truncated": [not ids[j] or ids[j][-1] not in stops for j in mine],
                }) + "\n")
            f.flush()
            print(f"rows {start + len(chunk)}/{len(rows)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
