"""benchmarks/validate_heldout.py's report: the verdict line against a target, and the
cost model's own predictions printed beside `measure`'s, every run point with its sign."""

import json

from benchmarks import validate_heldout as v

TARGET = {"within": 0.25, "share_within": 0.9, "mean_signed_error_max": 0.10}


def test_the_verdict_counts_strictly_within_and_the_signed_mean():
    # |-0.25| is not within (strict); mean (0.1 - 0.25 + 0.0) / 3 = -0.05.
    line = v.verdict([0.1, -0.25, 0.0], TARGET)
    assert "within 25%: 67% of 3 points" in line and "mean signed error -5.0%" in line
    assert "under-predicted 1 of 3" in line and line.endswith("TARGET MISSED")
    assert v.verdict([0.05, -0.05], TARGET).endswith("TARGET MET")


def test_the_cost_models_own_predictions_come_from_the_saved_files(tmp_path):
    a, b, c = ({"id": i} for i in ("a", "b", "c"))
    (tmp_path / "a.pred.json").write_text(json.dumps({"step": 1.0, "model_step": 1.5}))
    (tmp_path / "b.pred.json").write_text(json.dumps({"step": 1.0}))  # an older file
    rows = [(a, 1.0, 1.0, ""), (b, 2.0, 2.0, ""), (c, None, "", "skipped")]
    lines = v.model_lines(rows, tmp_path, TARGET)
    assert "  a: the cost model 1.500 s, measured 1.000 s: +50.0%" in lines
    assert not any(line.startswith(("  b:", "  c:")) for line in lines)
    assert lines[-1].startswith("the cost model: within 25%: 0% of 1 points")
    assert v.model_lines([(c, None, "", "skipped")], tmp_path, TARGET) == []
