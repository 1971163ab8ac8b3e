"""bench_modes' table logic: the A/A spread, ties, and a run serving two scaling tables."""

import math
from types import SimpleNamespace

from benchmarks import modes_report as mr


def run(mode, n, steps, scalings=("strong",), ok=True, workload="gsm8k"):
    return SimpleNamespace(
        shape="GSM8K", workload=workload, mode=mode, n=n, scalings=list(scalings), ok=ok, error="",
        steady=[{"perf/step_time": s, "perf/phase/decode": s / 2, "perf/host_share": 0.25,
                 "perf/timing": "phase-synchronised"} for s in steps],
        step_time=sorted(steps)[len(steps) // 2], compile_time=3.0, wall=60.0,
        load_before=4.0, lengths=[100.0], decode_iterations=[128.0], rows=64)


def test_aa_spread_is_max_over_min_of_run_medians():
    assert math.isclose(mr.aa_spread([1.0, 1.1, 1.05]), 0.1)
    assert math.isnan(mr.aa_spread([1.0]))  # one run: no A/A
    assert math.isnan(mr.aa_spread([1.0, float("nan")]))


def test_verdict_ties_within_the_spread_both_ways():
    assert mr.verdict(1.09, 0.10) == "tie"
    assert mr.verdict(1 / 1.09, 0.10) == "tie"  # symmetric in log: 0.917 is inside too
    assert mr.verdict(1.11, 0.10) == "faster"
    assert mr.verdict(0.85, 0.10) == "slower"
    assert mr.verdict(1.5, float("nan")) == "?"


def test_ratio_cell_uses_the_larger_spread_of_the_two_arms():
    ctrl = {"step": 1.2, "spread": 0.25}
    colo = {"step": 1.0, "spread": 0.02}
    assert "tie" in mr.ratio_cell(ctrl, colo)  # 1.2 within controller's own 25%
    assert "faster" in mr.ratio_cell({**ctrl, "spread": 0.05}, colo)


def test_a_run_serves_every_table_it_is_listed_for_once():
    results = [run("colocated", 4, [1.0, 1.0], ("strong", "weak")),
               run("colocated", 4, [1.2, 1.2], ("strong", "weak")),
               run("controller", 4, [2.0, 2.0], ("strong", "weak")),
               run("controller", 4, [2.0, 2.2, 2.2], ("strong", "weak")),
               run("controller", 2, [9.0], ok=False)]
    by = mr.cells(results)
    colo = by[("GSM8K", "gsm8k", "strong", 4, "colocated")]
    assert colo == by[("GSM8K", "gsm8k", "weak", 4, "colocated")]
    assert colo["step"] == 1.1 and math.isclose(colo["spread"], 0.2)
    assert by[("GSM8K", "gsm8k", "strong", 2, "controller")] is None  # failed: listed, no figures
    spreads = mr.mode_spreads(by)
    assert spreads["colocated"][2] == 1  # counted once, not once per table
    assert math.isclose(spreads["controller"][1], 0.1)


def test_report_prints_what_was_held_fixed():
    spec = SimpleNamespace(title="GSM8K", prompts=16, weak_prompts=4, group=4)
    results = [run("colocated", 1, [1.0, 1.1]), run("colocated", 1, [1.0, 1.2]),
               run("controller", 1, [1.5]), run("controller", 1, [1.6])]
    text = "\n".join(mr.report(results, {("GSM8K", "gsm8k"): spec}, [1], ["strong"]))
    assert "STRONG SCALING, held fixed: the global batch, 16 prompts x G 4" in text
    # controller 1.55 (median of 1.5, 1.6) / colocated 1.05 = 1.48, outside the 9% A/A spread
    assert "| 1.48 faster (A/A ±9%) |" in text
