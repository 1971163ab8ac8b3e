"""How far the paper comparison moves with the constants nobody measured: each assumed
constant the studies read is moved to 2/3 and to 3/2 of its value (`uncertainty.LOW`,
`HIGH`; an efficiency at most 1), the dispatch cost refitted to the paper's 36% host share
each time (as the nominal comparison fits it), and the comparison's figures recomputed.

The workloads' batch sizes and length distributions (workloads.json) are assumptions too,
but they are inputs, not constants of the ledger; they are not moved here.
"""

from __future__ import annotations

from benchmarks import paper
from locojax.predict import modes
from locojax.predict.uncertainty import HIGH, LOW, Scaled, uncertain

FITTED = "host.controller_dispatch_s"  # refitted under each move, so not moved itself
HEAD = ("| constant | x | dispatch us | 0.6B network | GSM8K ctrl/CO @8 | @64 | "
        "CO@8 / ctrl@64 | DA 0.75: CO/DA |")


def figures(scale) -> dict[str, float]:
    """The figures the comparison turns on, with `scale` (a dict or a shared `Scaled`)."""
    d = paper.fit_dispatch(scale=scale)
    model = paper.SIZES[0]
    ctx = paper.ctx_for(model, paper.SWEEP_WORKLOAD, paper.sweep_chips(model), d, scale=scale)
    net = modes.controller(ctx, paper.DECODE_CHUNK).shares["network"]
    rows = {(r.values["workload"], r.values["chips"]): r.values for r in paper.co_vs_controller(
        d, scale, points=[("gsm8k", 8), ("gsm8k", 64)])}
    ratio = {n: rows[("gsm8k", n)]["controller"].step / rows[("gsm8k", n)]["colocated"].step
             for n in (8, 64)}
    co, da = paper.da_study(d, scale, fractions=(0.75,))
    return {"dispatch": d, "network": net, "r8": ratio[8], "r64": ratio[64],
            "co8_ctrl64": rows[("gsm8k", 8)]["colocated"].step
            / rows[("gsm8k", 64)]["controller"].step,
            "da": co.step / da[0].values["da"].step}


def constants() -> list[str]:
    """The assumed (and fitted) constants the comparison reads, the dispatch aside."""
    shared = Scaled({})
    figures(shared)
    return [n for n in uncertain(shared) if n != FITTED]


def _row(name: str, factor: str, f: dict) -> str:
    return (f"| {name} | {factor} | {f['dispatch'] * 1e6:.1f} | {f['network']:.1%} | "
            f"{f['r8']:.2f} | {f['r64']:.2f} | {f['co8_ctrl64']:.2f} | {f['da']:.2f} |")


def table() -> list[str]:
    """The sensitivity table (markdown lines): the nominal row, then each constant low and
    high."""
    lines = [HEAD, "|---|---|---|---|---|---|---|---|", _row("(nominal)", "1", figures({}))]
    for name in constants():
        for factor in (LOW, HIGH):
            lines.append(_row(f"`{name}`", f"{factor:.2g}", figures({name: factor})))
    return lines
