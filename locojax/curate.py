"""Offline pass-rate curation (RLAX): score a dataset with a model, keep what can teach.

`locojax curate` samples k completions of every prompt on the engine (batched, one compiled
shape), scores them with the task's reward, and keeps the rows whose pass rate c/k lies
strictly between `too_hard` and `too_easy` (by default: solved sometimes, not always): a
prompt the model always or never solves gives GRPO a group of equal rewards, so no gradient.
It writes
- OUT: the kept rows, as the input file wrote them (jsonl lines verbatim, parquet rows);
- OUT + `.passrates.jsonl`: per row, its id (`file:line`), solved count, k and whether kept;
- OUT + `.hist.png`: the histogram of solved counts (0..k), also printed with pass@1 and pass@k.
`curation.py` is the online counterpart: the same thresholds applied to a running pass rate
during training.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import jax
import numpy as np

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import Example, Task
from locojax.envs.rewards import RewardRunner
from locojax.profiler import StepTimer
from locojax.rollout.single_turn import rollout


@dataclasses.dataclass(frozen=True)
class Scored:
    """Pass counts of a dataset: row i of the file solved `solved[i]` of k samples."""

    ids: tuple[str, ...]  # example ids, `file:line`
    solved: np.ndarray  # [n] int
    k: int

    def keep(self, too_easy: float = 1.0, too_hard: float = 0.0) -> np.ndarray:
        """[n] bool: too_hard < c/k < too_easy."""
        rate = self.solved / self.k
        return (rate > too_hard) & (rate < too_easy)

    def histogram(self) -> np.ndarray:
        """[k + 1] counts of rows with c = 0..k solved."""
        return np.bincount(self.solved, minlength=self.k + 1)

    def summary(self) -> dict[str, float]:
        return {"pass@1": float(np.mean(self.solved / self.k)),
                f"pass@{self.k}": float(np.mean(self.solved > 0))}


def score(engine: Engine, weights, tokenizer, task: Task, examples: Sequence[Example], k: int,
          sampling: SamplingConfig, max_prompt_tokens: int, batch_size: int, seed: int = 0,
          runner: RewardRunner | None = None, on_batch: Callable[[int], None] | None = None
          ) -> Scored:
    """k samples of each example (row r of example i keyed by its global row i·k + r, so the
    result does not depend on batch_size), scored by `task.reward`."""
    own = runner is None
    runner = runner or RewardRunner()
    key = jax.random.key(seed)
    solved = []
    try:
        for start in range(0, len(examples), batch_size):
            chunk = list(examples[start:start + batch_size])
            # The last chunk is padded to a full batch: one compiled shape for the whole file.
            padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
            out = rollout(engine, weights, tokenizer, task, runner, padded, start, key, sampling,
                          k, max_prompt_tokens, StepTimer())
            right = (out.rewards >= 1.0 - 1e-6).reshape(-1, k).sum(axis=1)
            solved.extend(right[:len(chunk)].tolist())
            if on_batch is not None:
                on_batch(start + len(chunk))
    finally:
        if own:
            runner.close()
    return Scored(tuple(ex.id for ex in examples), np.asarray(solved, np.int64), k)


def _line_of(example_id: str) -> int:
    return int(example_id.rsplit(":", 1)[1])


def write_filtered(source: str, kept_ids: Sequence[str], out: str) -> int:
    """Write the rows of `source` named by `kept_ids` to `out`, unchanged; returns the count.

    jsonl: the kept lines byte for byte (so `27.0` stays `27.0`). parquet: the kept rows.
    """
    lines = {_line_of(i) for i in kept_ids}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if source.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(source)
        rows = np.array(sorted(lines), np.int64) - 1  # parquet ids count rows from 1
        pq.write_table(table.take(pa.array(rows, pa.int64())), out)
        return len(rows)
    n = 0
    with open(source, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as g:
        for line_no, line in enumerate(f, start=1):
            if line_no in lines:
                g.write(line if line.endswith("\n") else line + "\n")
                n += 1
    return n


def write_report(scored: Scored, kept: np.ndarray, out: str) -> tuple[str, str]:
    """OUT.passrates.jsonl and OUT.hist.png; returns their paths."""
    rates_path, png_path = out + ".passrates.jsonl", out + ".hist.png"
    with open(rates_path, "w") as f:
        for i, c, keep in zip(scored.ids, scored.solved.tolist(), kept.tolist()):
            f.write(json.dumps({"id": i, "solved": c, "k": scored.k, "kept": keep}) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = scored.histogram()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    colors = ["tab:gray" if c in (0, scored.k) else "tab:blue" for c in range(scored.k + 1)]
    ax.bar(np.arange(scored.k + 1), counts, color=colors)
    ax.set_xlabel(f"solved of k={scored.k} samples")
    ax.set_ylabel("prompts")
    ax.set_title(f"pass rates of {len(scored.ids)} prompts ({int(kept.sum())} kept)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return rates_path, png_path


def text_histogram(scored: Scored, width: int = 40) -> str:
    counts = scored.histogram()
    top = max(int(counts.max()), 1)
    return "\n".join(f"  {c:>3}/{scored.k}  {n:>6}  {'#' * round(width * n / top)}"
                     for c, n in enumerate(counts.tolist()))
