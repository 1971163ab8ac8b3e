"""Terms of a profile whose simulated hosts share one machine (`shared_cores`: cpu-here).

On a cluster every host has its own cores. Here every simulated host is a process on one
machine, and three facts of that machine enter the step. Each is measured by a probe of
the machine (benchmarks/predict_probes.py), never fitted to a benchmark run:
- **Contention and over-subscription.** k busy processes take longer than each alone on its
  share of the cores, t(1 core) · max(1, k / c): at k <= c, pinned one a core as `locojax
  launch` pins them, they still share the memory system and the last-level cache; at k > c
  each process's XLA thread pool also wants every core. The penalty ρ(k) is measured with k
  processes of the train step at once (`oversub`), over one process alone on one core. It
  is 1 for one process, linear in k between the measured k, and held beyond the largest.
- **A multi-device program's loop.** One process driving N simulated devices (`--mode
  single --devices-per-host N`) runs each decode iteration's dozens of small kernels on N
  device threads, which meet twice an iteration (the loop condition reduces over all of
  them). More device threads than cores contend for them at every kernel and meeting;
  fewer use a core that one device's loop leaves idle. The per-iteration time i(N) of the
  engine's own decode loop at a probe shape no benchmark runs is measured (`multidev`);
  the term is i(N) - i(1), since the N = 1 fits already hold i(1), and it may be negative.
  It is linear in N between the measured N.
- **Env processes share the cores too.** The sandboxed tool runs of every host are
  processes on the same cores, so a host's env time is its env work in core-seconds over
  the cores its env processes get (`env_seconds`), not over cores of its own.
None of these applies to a profile without `shared_cores`.
"""

from __future__ import annotations

import numpy as np

from locojax.predict.hardware import Hardware
from locojax.predict.origin import Const, Ledger, from_json


def _table(hw: Hardware, field: str, ledger: Ledger) -> list[tuple[float, float]]:
    """A profile's {count: entry} table as sorted (count, value), every entry in the ledger."""
    raw = hw.extra.get(field) or {}
    out = []
    for key, entry in raw.items():
        c = entry if isinstance(entry, Const) else from_json(entry, f"{hw.path}: {field}.{key}")
        out.append((float(key), ledger.get(f"{hw.name}.{field}.{key}", c)))
    return sorted(out)


def oversubscription(hw: Hardware, ledger: Ledger, processes: float) -> float:
    """ρ(k): k busy processes' time over each alone on its share of the shared cores (1 for
    one process, where the hosts do not share a machine, or without a measured table)."""
    if not hw.extra.get("shared_cores") or processes <= 1:
        return 1.0
    table = [(k, v) for k, v in _table(hw, "oversubscription", ledger) if k > 1]
    if not table:
        return 1.0
    ks, vs = zip(*([(1.0, 1.0)] + table))
    return float(np.interp(processes, ks, vs))


def loop_iteration_extra(hw: Hardware, ledger: Ledger, devices: int) -> float:
    """Seconds per loop iteration that N devices in one process add to one device's loop:
    i(N) - i(1), negative where N threads gain more from the idle core than they lose to
    contention (0 where the hosts do not share a machine, at N = 1, or without a measured
    table)."""
    if not hw.extra.get("shared_cores") or devices <= 1:
        return 0.0
    table = _table(hw, "multi_device_iteration_s", ledger)
    if not table:
        return 0.0
    ns, vs = zip(*table)
    return float(np.interp(devices, ns, vs) - np.interp(1, ns, vs))


def env_seconds(per_row_turn: float, rows: float, turns: int, workers: float,
                cores: float, calibration_cores: float) -> float:
    """Env time of `rows` rows' `turns` tool turns when this host's env processes get
    `cores` cores of the shared machine. `per_row_turn` was measured with the whole machine
    (`calibration_cores`) and `workers` env processes: its work is per_row_turn ·
    min(calibration_cores, workers) core-seconds, and no more than `workers` cores (one
    each) can run it."""
    work = per_row_turn * min(calibration_cores, workers) * rows * turns
    return work / max(min(cores, workers), 1e-9)
