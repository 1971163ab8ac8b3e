"""benchmarks/harness.py's own logic: the arms' order, interleaving, ratios, the A/A spread and
its verdict, the markdown tables, and reading a run's steady steps."""

import json
import math
import sys

import pytest

from benchmarks import harness


def test_order_fixed_rotates_and_alternates():
    arms = ["a", "b", "c"]
    assert [harness.order(arms, r) for r in range(2)] == [arms, arms]
    assert [harness.order(arms, r, "rotate") for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert [harness.order(arms, r, "alternate") for r in range(3)] == [
        ["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    assert harness.rotated([], 3) == []
    with pytest.raises(ValueError):
        harness.order(arms, 0, "random")


def test_interleave_calls_every_arm_per_round_in_order_within_its_limit():
    calls = []

    def arm(name):
        def run():
            calls.append(name)
            return len(calls)
        return run

    seen = []
    out = harness.interleave(
        {k: arm(k) for k in "xyz"}, 3, "rotate", limits={"z": 1},
        after_round=lambda r, res: seen.append((r, sum(map(len, res.values())))))
    assert calls == ["x", "y", "z", "y", "x", "x", "y"]  # z stops after 1 call
    assert out == {"x": [1, 5, 6], "y": [2, 4, 7], "z": [3]}  # each arm's results, in order
    assert seen == [(0, 3), (1, 5), (2, 7)]


def test_ratio_median_and_med_say_nan_for_what_is_unknown():
    assert harness.ratio(3.0, 2.0) == 1.5
    for num, den in ((1.0, 0.0), (float("nan"), 1.0), (1.0, float("nan"))):
        assert math.isnan(harness.ratio(num, den))
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(harness.median([]))
    rows = [{"t": 1}, {"t": "3"}, {"u": 100}, {"t": 2}]
    assert harness.med(rows, "t") == 2.0  # rows without the key are left out
    assert math.isnan(harness.med(rows, "missing"))


def test_aa_spread_is_max_over_min_of_run_medians_less_one():
    assert math.isclose(harness.aa_spread([1.0, 1.25, 1.1]), 0.25)
    assert math.isclose(harness.aa_spread([2.0, float("nan"), 2.2, 0.0]), 0.1)
    assert math.isnan(harness.aa_spread([1.0]))


def test_verdict_is_a_tie_within_the_spread_on_either_side():
    assert harness.verdict(1.19, 0.2) == "tie"
    assert harness.verdict(1 / 1.19, 0.2) == "tie"
    assert harness.verdict(1.21, 0.2) == "faster"
    assert harness.verdict(1 / 1.21, 0.2) == "slower"
    assert harness.verdict(float("nan"), 0.2) == "?"
    assert harness.verdict(1.5, float("nan")) == "?"


def test_table_writes_a_head_a_rule_and_rows_made_or_given():
    assert harness.table(["a", "b c"], [[1, "x"], "| done |", [2.5, ""]]) == [
        "| a | b c |", "|---|---|", "| 1 | x |", "| done |", "| 2.5 |  |"]
    assert harness.fmt(float("nan")) == "n/a"
    assert harness.fmt(1 / 3, ".2f") == "0.33"


def test_steady_rows_merge_a_step_and_drop_warm_up_and_checkpoint_steps(tmp_path):
    lines = [{"step": s, "perf/step_time": float(s)} for s in range(1, 6)]
    lines.insert(2, {"step": 2, "perf/phase/train": 0.5})  # a second line of step 2
    (tmp_path / "perf.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = harness.steady_rows(tmp_path, steps=5, skip=1)
    assert [r["step"] for r in rows] == [2, 3, 4]
    assert rows[0] == {"step": 2, "perf/step_time": 2.0, "perf/phase/train": 0.5}
    with pytest.raises(RuntimeError, match="missing"):
        harness.steady_rows(tmp_path, steps=8, skip=1)  # steps 6 and 7 never ran


def test_run_logged_returns_the_code_and_tail_and_stops_a_run_past_its_timeout(tmp_path):
    code, tail = harness.run_logged(
        [sys.executable, "-c", "import sys; print(*range(12), sep='\\n'); sys.exit(3)"],
        tmp_path / "a.log", timeout=60)
    assert code == 3 and tail.splitlines() == [str(i) for i in range(4, 12)]
    code, _ = harness.run_logged([sys.executable, "-c", "import time; time.sleep(60)"],
                                 tmp_path / "b.log", timeout=0.5)
    assert code == -9


def test_header_names_the_machine_versions_flags_and_load(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--flag=1")
    line = harness.header("bench_x", "extra words")
    assert line.startswith("# bench_x: ") and "extra words" in line
    assert f"{__import__('os').cpu_count()} CPU cores" in line
    assert "python 3." in line and "jax 0." in line
    assert "XLA_FLAGS='--flag=1'" in line and "load average at start" in line


def test_roofline_share_takes_the_bound_that_binds():
    # 1e9 FLOPs at 1e10 FLOP/s is 0.1 s; 1e8 bytes at 1e10 B/s is 0.01 s: compute binds.
    # Each value is at most two f64 divisions from the exact one (relative error <= 2^-52),
    # far inside `isclose`'s default relative bound of 1e-9, on any machine (IEEE f64).
    assert math.isclose(harness.roofline_seconds(1e9, 1e8, 1e10, 1e10), 0.1)
    assert math.isclose(harness.roofline_share(0.2, 1e9, 1e8, 1e10, 1e10), 0.5)
    # memory-bound: 1e10 bytes at 1e10 B/s is 1 s
    assert math.isclose(harness.roofline_share(4.0, 1e6, 1e10, 1e10, 1e10), 0.25)
    assert math.isnan(harness.roofline_share(0.0, 1e9, 1e8, 1e10, 1e10))
    assert math.isnan(harness.roofline_share(1.0, float("nan"), 1e8, 1e10, 1e10))


def test_roofline_measurements_at_a_toy_size_are_positive_rates():
    # No timed assertion: only that each returns a finite, positive rate.
    bw = harness.read_bandwidth(runs=2, n=2 ** 12)
    peak = harness.matmul_peak(n=32, runs=2)
    assert 0 < bw < math.inf and 0 < peak < math.inf


def test_rates_are_the_published_figures_on_a_known_chip_else_the_probes(monkeypatch):
    # the CPU: the probes (stubbed here: the toy-size test above runs them), the better of
    # these and the ones taken before
    monkeypatch.setattr(harness, "matmul_peak", lambda: 2.0)
    monkeypatch.setattr(harness, "read_bandwidth", lambda: 5.0)
    assert harness.rates()[:2] == (2.0, 5.0) and "measured" in harness.rates()[2]
    assert harness.rates((3.0, 4.0, ""))[:2] == (3.0, 5.0)
    assert harness.spec() is None

    class Chip:
        device_kind = "TPU v5 lite"

    import jax

    monkeypatch.setattr(jax, "devices", lambda: [Chip()])
    monkeypatch.setattr(harness, "_accelerator", lambda: True)
    peak, bandwidth, origin = harness.rates()
    assert (peak, bandwidth) == (197e12, 819e9) and "tpu-v5e" in origin  # hardware/tpu-v5e.json


def test_ab_runs_gives_an_arms_launch_flags_to_its_colocated_points_only(tmp_path):
    from benchmarks import ab_runs

    pinned = ab_runs.argv_of("colocated-2", tmp_path, 5, "", ("--pin-cpus",))
    assert pinned[:2] == ["launch", "--pin-cpus"] and "--hosts" in pinned
    assert ab_runs.argv_of("colocated-2", tmp_path, 5, "") == [a for a in pinned
                                                               if a != "--pin-cpus"]
    assert "--pin-cpus" not in ab_runs.argv_of("single-2", tmp_path, 5, "", ("--pin-cpus",))
    small = ab_runs.argv_of("colocated-2@small", tmp_path, 5, "")
    assert small[small.index("--model") + 1] == "small"


def test_ab_runs_refuses_a_launch_flag_for_an_arm_it_does_not_have(capsys):
    from benchmarks import ab_runs

    with pytest.raises(SystemExit):
        ab_runs.main(["--tree", "a=.", "--launch-flag", "b=--pin-cpus"])
    assert "NAME one of the --tree names" in capsys.readouterr().err
