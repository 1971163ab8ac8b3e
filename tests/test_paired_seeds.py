"""The paired test of claim (3) in docs/real_model.md (benchmarks/paired_seeds.py), on
made-up block means: what the verdict on locojax's learning against TRL's is computed by."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import paired_seeds


def _table(tmp_path, blocks: dict) -> object:
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"source": "made up", "blocks": blocks}))
    return path


def _results(tmp_path, rows: list[dict]) -> object:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(rows))
    return path


def test_paired_statistics_by_hand():
    p = paired_seeds.paired([1.0, 2.0, 3.0], alpha=0.05)
    # mean 2, sd 1, se 1 / sqrt(3): t = 2 sqrt(3); Student's t at 0.975 on 2 df is 4.3027
    assert p["mean"] == 2.0 and p["sd"] == 1.0
    assert p["t"] == pytest.approx(2 * math.sqrt(3), rel=1e-12)
    assert p["crit"] == pytest.approx(4.3027, abs=1e-4)  # printed tables give 4 decimals
    assert p["low"] == pytest.approx(2 - 4.3027 / math.sqrt(3), abs=1e-4)


def test_results_and_table_combine_and_flagged_runs_are_left_out(tmp_path):
    table = _table(tmp_path, {"0": {"locojax": [0.2, 0.5], "trl": [0.3, 0.6]}})
    steps = [0.4] * 10 + [0.7] * 10
    results = _results(tmp_path, [
        {"seed": 1, "side": "locojax", "rewards": steps},
        {"seed": 1, "side": "trl", "rewards": [0.5] * 20},
        {"seed": 1, "side": "locojax", "rewards": [0.0] * 20, "flags": "--optim.x"},
        {"seed": 1, "side": "trl", "rewards": [0.0] * 20, "device": "cuda"}])
    seeds = paired_seeds.collect([results], table)
    assert seeds[0] == {"locojax": [0.2, 0.5], "trl": [0.3, 0.6]}
    assert seeds[1]["locojax"] == pytest.approx([0.4, 0.7])  # block means of `steps`
    assert seeds[1]["trl"] == pytest.approx([0.5, 0.5])


def test_a_seed_twice_or_with_one_side_is_refused(tmp_path):
    table = _table(tmp_path, {"0": {"locojax": [0.2], "trl": [0.3]}})
    twice = _results(tmp_path, [{"seed": 0, "side": "trl", "rewards": [0.1] * 10}])
    with pytest.raises(ValueError, match="seed 0 trl appears twice"):
        paired_seeds.collect([twice], table)
    lone = _results(tmp_path, [{"seed": 5, "side": "locojax", "rewards": [0.1] * 10}])
    with pytest.raises(ValueError, match=r"without both sides: \[5\]"):
        paired_seeds.collect([lone], table)


def test_verdict_misses_on_a_consistent_gap_and_holds_on_noise(tmp_path, capsys):
    # every seed 0.05 +- 0.01 lower: t far past any critical value
    gap = {str(s): {"locojax": [0.50 - 0.05 + 0.01 * (s % 2)], "trl": [0.50]}
           for s in range(6)}
    assert not paired_seeds.report(paired_seeds.collect([], _table(tmp_path, gap)), 1, 0.05)
    assert "MISSED" in capsys.readouterr().out
    noise = {str(s): {"locojax": [0.50 + (0.05 if s % 2 else -0.05)], "trl": [0.50]}
             for s in range(6)}  # mean difference 0: t = 0
    assert paired_seeds.report(paired_seeds.collect([], _table(tmp_path, noise)), 1, 0.05)
    assert "paired test over every block: HOLDS" in capsys.readouterr().out


def test_too_few_blocks_is_refused(tmp_path):
    seeds = paired_seeds.collect([], _table(tmp_path, {
        "0": {"locojax": [0.2], "trl": [0.3]}, "1": {"locojax": [0.2], "trl": [0.3]}}))
    with pytest.raises(ValueError, match="fewer than 2 blocks"):
        paired_seeds.report(seeds, 2, 0.05)
