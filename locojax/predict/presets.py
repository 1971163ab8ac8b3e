"""Workloads by name (`workloads.json`: the benchmarks' shapes and the paper's workloads,
each with its source), for `locojax predict workload NAME`. A `locojax train` command
line's workload is read from its run config (locojax/commands/predict_train.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from locojax.predict.origin import from_json
from locojax.predict.workload import Lengths, Workload

WORKLOADS = Path(__file__).parent / "workloads.json"


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

