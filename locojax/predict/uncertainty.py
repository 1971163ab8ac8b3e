"""How far the uncertain constants move a prediction (the throughput and chip-hours printed
with that range: locojax/commands/predict_report.py).

Range: every constant the prediction read whose origin is `assumed` or `fitted`
(origin.py) is moved, one at a time, to LOW and to HIGH times its value (an efficiency at
most 1), and the prediction rerun; then, for each mode, all at once, each to the end that
made that mode's step shorter (the range's low end) or longer (its high end). A verdict
flips when, in any of those runs, which mode is fastest, or the order of two modes, differs
from the nominal prediction; each flip names the constant and the end that does it.
"""

from __future__ import annotations

import dataclasses

from locojax.predict.origin import Ledger
from locojax.predict.phases import Ctx

LOW, HIGH = 2 / 3, 3 / 2
UNCERTAIN = ("assumed", "fitted")
EFFICIENCY = "efficiency"  # a constant named so is a fraction: at most 1


class Scaled(Ledger):
    """A ledger that hands out some constants scaled (the others as they are)."""

    def __init__(self, scale: dict[str, float]):
        super().__init__()
        self.scale = scale

    def get(self, name, c) -> float:
        super().get(name, c)
        v = float(c) * self.scale.get(name, 1.0)
        return min(v, 1.0) if name.endswith(EFFICIENCY) else v


def uncertain(ledger: Ledger) -> list[str]:
    """The constants a prediction read into `ledger` that are assumed or fitted."""
    return [n for n, c in ledger.used.items() if c.origin in UNCERTAIN]


def _steps(ctx: Ctx, predict, scale: dict[str, float]) -> dict[str, float]:
    return {p.mode: p.step for p in predict(at(ctx, scale)) if p.phases}


@dataclasses.dataclass
class Range:
    nominal: dict[str, float]  # mode -> step (s)
    low: dict[str, float]
    high: dict[str, float]
    flips: list[str]
    constants: list[str]
    ends: dict = dataclasses.field(default_factory=dict)  # mode -> (faster, slower) scales


def _order(steps: dict[str, float]) -> list[str]:
    return sorted(steps, key=steps.get)


def _flips(nominal: dict, runs: list[tuple[str, dict]]) -> list[str]:
    """Each verdict that some run reverses (the fastest mode; the order of two modes), with
    the runs that reverse it."""
    by: dict[str, list[str]] = {}
    first = _order(nominal)
    for label, steps in runs:
        order = _order(steps)
        if order and first and order[0] != first[0]:
            by.setdefault(f"{order[0]} fastest (not {first[0]})", []).append(label)
            continue
        for i, a in enumerate(first):
            for b in first[i + 1:]:
                if a in steps and b in steps and steps[a] > steps[b]:
                    by.setdefault(f"{b} faster than {a}", []).append(label)
    return [f"{verdict} with {'; '.join(dict.fromkeys(labels))}"
            for verdict, labels in by.items()]


def step_range(ctx: Ctx, predict) -> Range:
    """`predict(ctx) -> [Prediction]`, rerun over the uncertain constants (module docstring).
    Each mode's range is its own: every constant at the end that shortens (lengthens) that
    mode's step, as the one-at-a-time runs found it."""
    nominal = _steps(ctx, predict, {})
    probe = dataclasses.replace(ctx, ledger=Ledger())
    predict(probe)
    names = uncertain(probe.ledger)
    runs, moved = [], {}
    for n in names:
        moved[n] = (_steps(ctx, predict, {n: LOW}), _steps(ctx, predict, {n: HIGH}))
        runs += [(f"{n} x{LOW:.2g}", moved[n][0]), (f"{n} x{HIGH:.2g}", moved[n][1])]
    low, high, ends = {}, {}, {}
    for mode in nominal:
        faster = {n: LOW if lo.get(mode, 0) <= hi.get(mode, 0) else HIGH
                  for n, (lo, hi) in moved.items()}
        slower = {n: LOW * HIGH / f for n, f in faster.items()}  # the other end
        ends[mode] = (faster, slower)
        for label, scale, out in (("faster", faster, low), ("slower", slower, high)):
            steps = _steps(ctx, predict, scale)
            out[mode] = steps[mode]
            runs.append((f"every uncertain constant at the end that makes {mode} {label}",
                         steps))
    return Range(nominal, low, high, _flips(nominal, runs), names, ends)


def at(ctx: Ctx, scale: dict) -> Ctx:
    """ctx with the constants of `scale` moved (one end of a range)."""
    return dataclasses.replace(ctx, ledger=Scaled(scale))

