"""GSM8K: every gold answer in the real data scores 1, corrupted answers score 0."""

import json
import os
import pathlib

import pytest

from locojax.envs import gsm8k
from locojax.envs.base import Example

DATA = pathlib.Path(os.environ.get(
    "LOCOJAX_DATA", pathlib.Path(__file__).resolve().parents[1] / "../shared/data"))


def gsm8k_file(split):
    path = DATA / "gsm8k" / f"{split}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present (set LOCOJAX_DATA)")
    return path


def bump_final(text: str) -> str:
    """The same text with its final `#### N` replaced by N+1 (commas dropped)."""
    head, final = text.rsplit("####", 1)
    return f"{head}#### {int(final.strip().replace(',', '')) + 1}"


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gold_scores_one_and_corruptions_zero(split):
    path = gsm8k_file(split)
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ds = gsm8k.load(path)
    assert len(ds) == len(raw) and ds.skipped == 0
    assert len(ds) == {"train": 7473, "test": 1319}[split]
    for row, ex in zip(raw, ds):
        assert "<<" not in ex.solution and ">>" not in ex.solution
        raw_answer = row["answer"]
        # The gold as written (commas, annotations), and the loader's cleaned solution.
        for text in (raw_answer, gsm8k.strip_calculator(raw_answer), ex.solution):
            assert gsm8k.correct_strict(text, ex) == 1.0, (ex.id, text)
            assert gsm8k.correct_flexible(text, ex) == 1.0, (ex.id, text)
            assert gsm8k.format_ok(text, ex) == 1.0, (ex.id, text)
        wrong = bump_final(raw_answer)
        assert gsm8k.correct_strict(wrong, ex) == 0.0, (ex.id, wrong)
        assert gsm8k.correct_flexible(wrong, ex) == 0.0, (ex.id, wrong)
        no_marker = raw_answer.rsplit("####", 1)[0]
        assert gsm8k.correct_strict(no_marker, ex) == 0.0, ex.id
        assert gsm8k.format_ok(no_marker, ex) == 0.0, ex.id


EX = Example("e", "q", "18")


@pytest.mark.parametrize("text,strict,flexible", [
    ("#### 18", 1, 1),
    ("#### $18.00.", 1, 1),
    ("#### 18.", 1, 1),
    ("She makes $18.", 0, 1),
    ("#### 1,8", 1, 1),  # commas are thousands separators: dropped, not a decimal point
    ("#### 18\nThen 20", 1, 0),  # flexible reads the LAST number
    ("#### 17\n#### 18", 1, 1),  # strict reads the LAST marker
    ("#### 180", 0, 0),
    ("#### -18", 0, 0),
    ("", 0, 0),
])
def test_extraction_cases(text, strict, flexible):
    assert gsm8k.correct_strict(text, EX) == strict
    assert gsm8k.correct_flexible(text, EX) == flexible


@pytest.mark.parametrize("raw,norm", [
    ("−7", "-7"), ("-7.50", "-7.5"), ("$1,234", "1234"), (".5", "0.5"), ("1e3", "1000"),
    ("18.00.", "18"), ("abc", None), ("-", None), ("", None), ("nan", None),
])
def test_normalize_number(raw, norm):
    assert gsm8k.normalize_number(raw) == norm


def test_templates_and_format_reward():
    assert gsm8k.make_prompt(" 2+2? ") == "Question: 2+2?\nAnswer:"
    (msg,) = gsm8k.make_prompt("2+2?", "qwen")
    assert msg["role"] == "user" and msg["content"].startswith("2+2?\n")
    assert "####" in msg["content"]
    r = gsm8k.reward("strict", format_weight=0.5)
    assert r("so\n#### 18", EX) == 1.5 and r("#### 18 is it", EX) == 1.0
    assert r("#### 3", EX) == 0.5
    with pytest.raises(ValueError, match="mode"):
        gsm8k.reward("fuzzy")
