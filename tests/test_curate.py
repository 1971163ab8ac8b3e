"""`locojax curate`: pass counts stay aligned with their rows through padded batches, the kept
rows are written as the file wrote them, and malformed files fail naming file:line."""

import json

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from locojax import curate
from locojax.model import loader
from locojax.commands.curate import main
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs import gsm8k
from locojax.envs.base import Task


def rows(n):
    return [{"question": f"What is {i}+{i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
            for i in range(n)]


def write(path, items):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return str(path)


def test_scores_stay_with_their_rows_through_padded_batches(tmp_path):
    """A reward that ignores the completion and solves rows 0 mod 3: the counts must come
    back k or 0 at exactly those rows, with 7 rows in batches of 3 (the last one padded)."""
    data = gsm8k.load(write(tmp_path / "d.jsonl", rows(7)))
    m = loader.load("tiny")
    solve = lambda completion, ex: float(int(ex.answer) % 6 == 0)  # noqa: E731  2i = 0 mod 6
    task = Task("t", data.examples, data.examples, solve)
    sampling = SamplingConfig(max_new_tokens=4, stop_token_ids=tuple(m.tokenizer.stop_ids),
                              pad_token_id=m.tokenizer.pad_id)
    scored = curate.score(Engine(m.cfg), m.weights, m.tokenizer, task, data.examples, 4,
                          sampling, 32, 3)
    np.testing.assert_array_equal(scored.solved, [4, 0, 0, 4, 0, 0, 4])
    assert scored.ids == tuple(f"d.jsonl:{i}" for i in range(1, 8))
    np.testing.assert_array_equal(scored.histogram(), [4, 0, 0, 0, 3])
    assert scored.summary() == {"pass@1": 3 / 7, "pass@4": 3 / 7}


def test_keep_thresholds_and_verbatim_rows(tmp_path):
    s = curate.Scored(("f:1", "f:2", "f:3", "f:4"), np.array([0, 1, 4, 3]), 4)
    np.testing.assert_array_equal(s.keep(), [False, True, False, True])
    np.testing.assert_array_equal(s.keep(too_easy=0.75, too_hard=0.25), [False, False, False, False])
    # jsonl: the kept lines byte for byte, numbers as written, blank lines not counted as rows
    src = tmp_path / "m.jsonl"
    src.write_text('{"problem": "a", "answer": 27.0}\n\n{"problem": "b", "answer": 1.50}\n'
                   '{"problem": "c", "answer": "x"}')
    assert curate.write_filtered(str(src), ["m.jsonl:3", "m.jsonl:4"], str(tmp_path / "o.jsonl")) == 2
    assert (tmp_path / "o.jsonl").read_text() == \
        '{"problem": "b", "answer": 1.50}\n{"problem": "c", "answer": "x"}\n'
    pq.write_table(pa.Table.from_pylist(rows(4)), tmp_path / "d.parquet")
    curate.write_filtered(str(tmp_path / "d.parquet"), ["d.parquet:4", "d.parquet:2"],
                          str(tmp_path / "o.parquet"))
    assert pq.read_table(tmp_path / "o.parquet").to_pylist() == [rows(4)[1], rows(4)[3]]


def test_cli_reports_bad_rows_and_writes_outputs(tmp_path, capsys):
    bad = write(tmp_path / "bad.jsonl", [*rows(3), {"question": "q"}, *rows(2)])
    out = str(tmp_path / "out" / "kept.jsonl")
    # The shapes of the test above (k, tokens, batch), so the engine's compile is reused.
    args = [bad, "--out", out, "--model", "tiny", "--k", "4", "--max-new-tokens", "4",
            "--max-prompt-tokens", "32", "--batch-size", "3"]
    assert main(args) == 2
    assert f"{bad}:4: missing field 'answer'" in capsys.readouterr().err
    assert main([*args, "--skip-invalid"]) == 0
    text = capsys.readouterr().out
    assert "skipped 1 invalid rows" in text and "kept 0 of 5" in text  # random weights
    report = [json.loads(line) for line in open(out + ".passrates.jsonl")]
    assert [r["id"] for r in report] == ["bad.jsonl:1", "bad.jsonl:2", "bad.jsonl:3",
                                         "bad.jsonl:5", "bad.jsonl:6"]
    assert open(out).read() == "" and (tmp_path / "out" / "kept.jsonl.hist.png").stat().st_size
    assert main([bad, "--out", bad]) == 2  # never overwrite the input


@pytest.fixture(autouse=True)
def _cpu0():
    with jax.default_device(jax.devices()[0]):
        yield


def test_cli_with_a_users_rows_and_trl_reward(tmp_path, capsys):
    """--task data --reward file.py:fn: the user's columns reach the reward (a reward that
    reads only `parity` solves the even rows k of k and the odd ones never), and the prompt
    width is sized from the rows (auto)."""
    (tmp_path / "my_reward.py").write_text(
        "def by_parity(prompts, completions, parity, **kwargs):\n"
        "    return [1.0 if p == 'even' else 0.0 for p in parity]\n")
    data = write(tmp_path / "rows.jsonl", [{"prompt": f"{i}+{i}=", "parity": "odd" if i % 2
                                            else "even"} for i in range(5)])
    out = str(tmp_path / "kept.jsonl")
    args = [data, "--out", out, "--model", "tiny", "--k", "4", "--max-new-tokens", "4",
            "--batch-size", "3", "--task", "data",
            "--reward", f"{tmp_path / 'my_reward.py'}:by_parity"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "max_prompt_tokens=8 (auto: longest prompt 4 tokens (rows.jsonl:1)" in text
    report = [json.loads(line) for line in open(out + ".passrates.jsonl")]
    assert [r["solved"] for r in report] == [4, 0, 4, 0, 4]
    assert open(out).read() == ""  # each row is solved always or never: none can teach


def test_cli_refuses_a_prompt_over_the_width_or_not_encodable_naming_its_row(tmp_path, capsys):
    data = write(tmp_path / "g.jsonl", [*rows(2), {"question": "What is 1’s double?",
                                                   "answer": "#### 2"}])
    args = [data, "--out", str(tmp_path / "o.jsonl"), "--model", "tiny", "--k", "2",
            "--max-new-tokens", "4", "--batch-size", "3"]
    assert main(args) == 2  # the char vocabulary has no ’, found before any sampling
    assert "g.jsonl:3: the tokenizer cannot encode its prompt" in capsys.readouterr().err
    args[0] = write(tmp_path / "g2.jsonl", rows(12))
    assert main([*args, "--max-prompt-tokens", "31"]) == 2  # rows 1-10 have 30 or 31 tokens
    err = capsys.readouterr().err
    assert ("g2.jsonl:11: its prompt has 32 tokens, more than --max-prompt-tokens=31 (and 1 "
            "more rows)") in err
    assert "--skip-invalid skips such rows" in err
