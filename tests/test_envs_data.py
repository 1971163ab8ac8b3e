"""Loader validation: each kind of malformed row names its file and line, or is skipped and
counted with skip_invalid=True."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from locojax.envs import gsm8k, math_boxed
from locojax.envs.base import Example
from locojax.envs.data import DataError

GOOD = {"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}


def write_jsonl(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return path


# Each malformed row, and the phrase its error must contain.
BAD_ROWS = [
    ('{"question": "broken", "answer": "#### 1"', "broken JSON line"),
    ({"question": "no answer here"}, "missing field 'answer'"),
    ({"question": 7, "answer": "#### 7"}, "field 'question' should be str, got int"),
    ({"question": "q", "answer": "   "}, "field 'answer' is empty"),
    ({"question": "q", "answer": "no final line"}, "no '#### N' final line"),
    ({"question": "q", "answer": "x\n#### seven"}, "not a number"),
    ('["a", "list"]', "row is a JSON list, expected an object"),
    ({"question": None, "answer": "#### 1"}, "missing field 'question'"),
]


@pytest.mark.parametrize("bad,phrase", BAD_ROWS)
def test_malformed_row_names_file_and_line(tmp_path, bad, phrase):
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DataError) as err:
        gsm8k.load(path)
    msg = str(err.value)
    assert f"{path}:3:" in msg and phrase in msg, msg


def test_skip_invalid_counts_every_kind(tmp_path):
    lines = [GOOD]
    for bad, _ in BAD_ROWS:
        lines += [bad, GOOD]
    lines.insert(3, "")  # blank lines are not rows and not errors
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    ds = gsm8k.load(path, skip_invalid=True)
    assert len(ds) == len(BAD_ROWS) + 1 and ds.skipped == len(BAD_ROWS)
    assert len(ds.problems) == len(BAD_ROWS)
    for (_, phrase), problem in zip(BAD_ROWS, ds.problems):
        assert phrase in problem and str(path) in problem
    # Ids point at the source lines of the valid rows (line 4 is the blank one).
    assert [e.id for e in ds][:3] == ["train.jsonl:1", "train.jsonl:3", "train.jsonl:6"]
    assert all(e.answer == "4" for e in ds)


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        gsm8k.load(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported format"):
        gsm8k.load(tmp_path / "x.csv")
    path = write_jsonl(tmp_path / "all_bad.jsonl", [{"question": "q"}])
    with pytest.raises(DataError, match=r"no valid rows \(1 skipped\)"):
        gsm8k.load(path, skip_invalid=True)
    (tmp_path / "corrupt.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="corrupt.parquet: cannot read parquet"):
        gsm8k.load(tmp_path / "corrupt.parquet")
    with pytest.raises(ValueError, match="template"):
        gsm8k.load(path, template="llama")


def test_json_documents_are_refused_naming_the_file(tmp_path):
    """A `.json` that holds one JSON document, not JSON Lines: one error for the file, saying
    what it holds, instead of a "broken JSON line" per line."""
    rows = [GOOD, GOOD]
    for name, text in [("pretty.json", json.dumps(rows, indent=2)),
                       ("oneline.json", json.dumps(rows))]:
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match="holds a JSON array of rows") as err:
            gsm8k.load(tmp_path / name, skip_invalid=True)  # a file error, not a row to skip
        msg = str(err.value)
        assert msg.startswith(f"{tmp_path / name}: ") and "JSON Lines" in msg
        assert f"> {tmp_path / name.replace('.json', '.jsonl')}" in msg  # how to convert
    (tmp_path / "object.json").write_text(json.dumps(GOOD, indent=2))
    with pytest.raises(DataError, match="object.json: holds one JSON value spread over"):
        gsm8k.load(tmp_path / "object.json")
    write_jsonl(tmp_path / "lines.json", rows)  # JSON Lines under .json is fine
    assert len(gsm8k.load(tmp_path / "lines.json")) == 2


def test_non_utf8_rows_name_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"question": "caf\u00e9?", '
                     '"answer": "#### 1"}\n'.encode("latin-1") + json.dumps(GOOD).encode())
    with pytest.raises(DataError, match=rf"{path}:2: not UTF-8 \(invalid continuation byte"):
        gsm8k.load(path)
    ds = gsm8k.load(path, skip_invalid=True)
    assert len(ds) == 2 and ds.skipped == 1 and "not UTF-8" in ds.problems[0]
    bom = tmp_path / "bom.jsonl"  # a UTF-8 byte-order mark (Windows editors) is not an error
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    assert len(gsm8k.load(bom)) == 1


def test_parquet_rows_validated_with_row_numbers(tmp_path):
    rows = [GOOD, {"question": "q2", "answer": ""}, {"question": "q3", "answer": "#### 1,000"}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError, match=r"train.parquet:2: field 'answer' is empty"):
        gsm8k.load(path)
    ds = gsm8k.load(path, skip_invalid=True)
    assert [e.answer for e in ds] == ["4", "1000"] and ds.skipped == 1
    assert ds[0].solution == " 2+2=4\n#### 4"  # calculator annotation stripped


MATH_BAD = [
    ({"problem": "p"}, "no 'solution' (nor an assistant message) and no 'answer'"),
    ({"problem": "", "answer": "1"}, "field 'problem' is empty"),
    ({"problem": "p", "solution": "no box"}, "no 'answer' field and no \\boxed{}"),
    ({"problem": "p", "solution": "$\\boxed{1}$", "answer": ""}, "field 'answer' is empty"),
    ({"problem": "p", "solution": 3}, "field 'solution' should be str, got int"),
    ({"messages": [{"role": "user", "content": "p"}]}, "no 'solution' (nor an assistant"),
    ({"messages": [{"role": "assistant", "content": "p"}], "answer": "1"}, "needs a user message"),
    ({"problem": "p", "answer": True}, "field 'answer' should be str or int or float, got bool"),
    ({"messages": "hi"}, "field 'messages' should be list"),
    ({"title": "x"}, "needs 'problem' and 'solution' or 'answer', or 'messages'"),
]


@pytest.mark.parametrize("bad,phrase", MATH_BAD)
def test_math_malformed_rows(tmp_path, bad, phrase):
    good = {"problem": "1+1?", "solution": "It is $\\boxed{2}$."}
    path = write_jsonl(tmp_path / "m.jsonl", [good, bad])
    with pytest.raises(DataError) as err:
        math_boxed.load(path)
    assert f"{path}:2:" in str(err.value) and phrase in str(err.value), str(err.value)
    ds = math_boxed.load(path, skip_invalid=True)
    assert len(ds) == 1 and ds.skipped == 1 and ds[0].answer == "2"


def test_math_rows_without_solution_and_numeric_answers(tmp_path):
    """Evaluation-set rows (problem + answer, no solution) load; a JSON number answer is read
    as the text the file wrote, in .jsonl and .parquet alike (parquet stores no text: a
    float column reads as Python's rendering, an int column as the integer)."""
    path = tmp_path / "eval.jsonl"
    path.write_text('{"problem": "3^3?", "answer": 27.0}\n'
                    '{"problem": "1.5 as text?", "answer": 1.50}\n'
                    '{"problem": "int?", "answer": 12, "level": 2}\n'
                    '{"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"}\n')
    exs = math_boxed.load(path)
    assert [e.answer for e in exs] == ["27.0", "1.50", "12", "2"]
    assert [e.solution for e in exs] == ["", "", "", ""]
    assert exs[0].prompt == "Problem: 3^3?\nSolution:" and exs[2].meta == {"level": 2}
    task = math_boxed.task(str(path), str(path))
    assert task.reward("so $\\boxed{27}$", exs[0]) == 1.0  # 27.0 and 27 are one answer
    assert task.reward("so $\\boxed{1.5}$", exs[1]) == 1.0
    pq.write_table(pa.Table.from_pylist([{"problem": "p", "answer": 27.0},
                                         {"problem": "q", "answer": 3.5}]),
                   tmp_path / "eval.parquet")
    assert [e.answer for e in math_boxed.load(tmp_path / "eval.parquet")] == ["27.0", "3.5"]


# Rows whose parse fails outside JSONDecodeError: json raises RecursionError past the
# interpreter's recursion limit (100000 levels is far past the default 1000), and ValueError
# for an integer over Python's int-string limit (4300 digits by default; 5000 is over it).
UNPARSABLE = [
    ('{"question": "q", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"question": "q", "answer": ' + "9" * 5000 + "}", "cannot parse the line (ValueError"),
]


@pytest.mark.parametrize("bad,phrase", UNPARSABLE, ids=["deep", "long_int"])
def test_a_row_that_fails_to_parse_in_any_way_names_file_and_line(tmp_path, bad, phrase):
    for lines, line in [([GOOD, bad, GOOD], 2), ([bad, GOOD], 1)]:  # the first line too
        path = write_jsonl(tmp_path / "train.jsonl", lines)
        with pytest.raises(DataError) as err:
            gsm8k.load(path)
        assert f"{path}:{line}: " in str(err.value) and phrase in str(err.value), str(err.value)
        ds = gsm8k.load(path, skip_invalid=True)
        assert len(ds) == len(lines) - 1 and ds.skipped == 1
        assert ds.problems[0].startswith(f"{path}:{line}: ") and phrase in ds.problems[0]


def test_a_converter_that_fails_unexpectedly_names_file_and_line(tmp_path):
    """Not only RowError: whatever a converter raises on a row is that row's error."""
    from locojax.envs.data import load_examples

    def convert(row, id_):
        return Example(id_, row["question"], str(1 / len(row["answer"])))  # "" divides by 0

    path = write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "1"},
                                               {"question": "q", "answer": []}])
    with pytest.raises(DataError, match=rf"{path}:2: ZeroDivisionError"):
        load_examples(path, convert, {"question": str}, {"answer": (str, list)})
    ds = load_examples(path, convert, {"question": str}, {"answer": (str, list)},
                       skip_invalid=True)
    assert len(ds) == 1 and ds.skipped == 1
