"""Workloads by name (`workloads.json`: the benchmarks' shapes and the paper's workloads,
each with its source) and from a `locojax train` run config.

A run config gives B, G, P, N, the task, β and the turns; the completion lengths come from
`--rollout.ignore-eos` (exactly N), a rollout dump or data file (`lengths_from`), the
task's data file (reference solutions) or, failing all, the cap N, stated as such.
"""

from __future__ import annotations

import json
from pathlib import Path

from locojax.predict.origin import from_json
from locojax.predict.workload import Lengths, Workload, from_data_file, from_rollout_dump

WORKLOADS = Path(__file__).parent / "workloads.json"
CHARS_PER_TOKEN = 4.0  # English BPE text (assumed; the char tokenizer's is 1)


def names() -> list[str]:
    with open(WORKLOADS) as f:
        return sorted(json.load(f))


def load(name: str) -> tuple[Workload, int]:
    """(workload, env workers per host or 0) of a named preset."""
    with open(WORKLOADS) as f:
        table = json.load(f)
    if name not in table:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(table))}")
    d = table[name]
    comp, src = d["completion"], d["source"]
    if "fixed" in comp:
        lengths = Lengths.fixed(comp["fixed"], src)
    elif "lognormal" in comp:
        ln = comp["lognormal"]
        lengths = Lengths.lognormal(ln["mean"], ln["sigma"], ln["cap"], src)
    else:
        lengths = Lengths.from_samples(comp["samples"], src, cap=d["max_new"])
    tool = from_json(d["tool_s"], f"{WORKLOADS}: {name}.tool_s").value if "tool_s" in d else 0.0
    wl = Workload(name, d["prompts"], d["group"], d["prompt_columns"], d["max_new"], lengths,
                  task=d["task"], turns=d.get("turns", 1), obs_tokens=d.get("obs_tokens", 0),
                  tool_s=tool, source=src)
    return wl, int(d.get("env_workers", 0))


def from_run(cfg, lengths_from: str = "", chars_per_token: float = 0.0) -> Workload:
    """The workload of a `locojax train` RunConfig (read by attribute, so that a refactored
    config with the same fields still reads)."""
    ro, algo, task = cfg.rollout, cfg.algo, cfg.task
    n, p = ro.max_new_tokens, ro.max_prompt_tokens
    multi = getattr(cfg, "multi_turn", None)
    turns = getattr(multi, "max_turns", 1) if task.name in ("swe", "calc") else 1
    obs = getattr(multi, "max_obs_tokens", 0) if turns > 1 else 0
    trajectory = getattr(multi, "max_trajectory_tokens", 0) if turns > 1 else 0
    cpt = chars_per_token or (1.0 if str(cfg.model).startswith(("embedded", "tiny", "small"))
                              else CHARS_PER_TOKEN)
    if ro.ignore_eos:
        lengths = Lengths.fixed(n, "--rollout.ignore-eos: every completion is exactly N")
    elif lengths_from and Path(lengths_from).is_dir():
        lengths = from_rollout_dump(lengths_from, n)
    elif lengths_from:
        lengths = from_data_file(lengths_from, cpt, p, n, 1, 1, task.name)[1]
    elif getattr(task, "data", "") and Path(task.data).is_file():
        lengths = from_data_file(task.data, cpt, p, n, 1, 1, task.name)[1]
    else:
        lengths = Lengths.fixed(n, "assumed: every completion runs to the cap N (pass "
                                   "--lengths-from RUN_DIR or a data file for a distribution)")
    return Workload(f"train {task.name}", ro.prompts_per_step, algo.group_size, p, n, lengths,
                    task=task.name, beta=float(algo.beta), turns=max(1, turns),
                    obs_tokens=obs, trajectory=trajectory, source=lengths.source)
