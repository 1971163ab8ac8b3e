"""Your own task and data (`locojax/envs/user.py`, `envs/data.py`): the `data` task over
jsonl, parquet and `datasets` directories, `--task.name module:function`, the refusals
before any work, and a short training run whose user reward returns bad values on purpose."""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from locojax.envs.base import MultiTurnEnv
from locojax.envs.data import DataError
from locojax.envs.registry import TaskConfig, build

TASK_MODULE = '''
from locojax.envs.base import Example, Task, ToolEnv

def make_task(seed, level=1, data=""):
    rows = [Example(f"mine:{i}", f"{i}+{level}=", str(i + level)) for i in range(4)]
    return Task("mine", rows, rows, reward=lambda c, ex: float(c.strip() == ex.answer))

def make_env():
    return ToolEnv({"echo": lambda a: a}, reward=lambda c, ex: 1.0)

def not_a_task():
    return 42

def length(completions, **kwargs):
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def in_user_dir(tmp_path, monkeypatch):
    (tmp_path / "mytask_mod.py").write_text(textwrap.dedent(TASK_MODULE))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("mytask_mod", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"q": "2+3=", "a": 5, "topic": "add"},
        {"q": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7-2="}],
         "a": "5", "topic": "sub"}]


def test_data_task_reads_jsonl_parquet_and_a_datasets_directory(in_user_dir):
    import datasets

    jsonl = write_jsonl(in_user_dir / "rows.jsonl", ROWS)
    datasets.Dataset.from_list([{"q": "2+3=", "a": 5, "topic": "add"}]).to_parquet(
        str(in_user_dir / "rows.parquet"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:1] * 3),
                          "test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(
        str(in_user_dir / "dd"))
    opts = dict(name="data", prompt_field="q", answer_field="a", reward=("mytask_mod:length",))
    t = build(TaskConfig(data=jsonl, **opts), seed=0)
    plain, chat = t.train
    assert plain.prompt == "2+3=" and plain.answer == "5" and plain.id == "rows.jsonl:1"
    assert plain.meta == {"a": 5, "topic": "add"}  # every column but the prompt
    assert chat.prompt == tuple(ROWS[1]["q"]) and chat.meta == {"a": "5", "topic": "sub"}
    assert build(TaskConfig(data=str(in_user_dir / "rows.parquet"), **opts), 0).train[0].meta \
        == {"a": 5, "topic": "add"}
    t = build(TaskConfig(data=str(in_user_dir / "dd"), **opts), seed=0)
    assert [e.id for e in t.train] == ["dd/train:1", "dd/train:2", "dd/train:3"]
    assert [e.id for e in t.test] == ["dd/test:1"]  # the DatasetDict's test split
    with pytest.raises(DataError, match="has no split 'dev'"):
        build(TaskConfig(data=str(in_user_dir / "dd"), split="dev", **opts), seed=0)


def test_a_bad_row_names_its_source_and_line(in_user_dir):
    bad = write_jsonl(in_user_dir / "bad.jsonl", [ROWS[0], {"q": [{"role": "user"}], "a": 1}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'q': message 0 should be"):
        build(TaskConfig(name="data", data=bad, prompt_field="q",
                         reward=("mytask_mod:length",)), seed=0)
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing field 'prompt'"):
        build(TaskConfig(name="data", data=bad, reward=("mytask_mod:length",)), seed=0)


def test_a_conversational_prompt_is_rendered_with_the_chat_template(in_user_dir):
    from locojax.envs.prompt import encode_prompt
    from locojax.tokenizer.char import CharTokenizer

    jsonl = write_jsonl(in_user_dir / "rows.jsonl", ROWS)
    t = build(TaskConfig(name="data", data=jsonl, prompt_field="q",
                         reward=("mytask_mod:length",)), seed=0)
    tok = CharTokenizer()
    rendered = tok.apply_chat_template(ROWS[1]["q"], add_generation_prompt=True)
    assert encode_prompt(tok, t.train[1]) == tok.encode(rendered)
    assert encode_prompt(tok, t.train[0]) == tok.encode("2+3=")  # text stays text


def test_a_task_function_of_your_own(in_user_dir):
    t = build(TaskConfig(name="mytask_mod:make_task", level=2), seed=7)
    assert t.name == "mine" and t.train[1].prompt == "1+2="  # level reached it by name
    t = build(TaskConfig(name="mytask_mod:make_task", reward=("mytask_mod:length",)), seed=0)
    assert t.score("abc", t.train[0])[0] == 3.0  # your reward replaces the task's
    data = write_jsonl(in_user_dir / "rows.jsonl", ROWS[:1])
    t = build(TaskConfig(name="mytask_mod:make_env", data=data, prompt_field="q"), seed=0,
              max_turns=3)
    assert t.multi_turn and t.max_turns == 3 and isinstance(t.make_env(), MultiTurnEnv)


@pytest.mark.parametrize("cfg,message", [
    (dict(name="data", data="rows.jsonl"), "needs --task.reward module:function"),
    (dict(name="data", reward=("mytask_mod:length",)), "needs --task.data"),
    (dict(name="data", data="rows.jsonl", reward=("mytask_mod:nope",)), "has no 'nope'"),
    (dict(name="data", data="rows.jsonl", reward=("nomod_xyz:f",)), "cannot import"),
    (dict(name="data", data="rows.jsonl", reward=("strict",)), "needs --task.reward module"),
    (dict(name="data", data="rows.jsonl", reward=("mytask_mod:length",), format_weight=0.5),
     "no format reward of its own"),
    (dict(name="math", data="rows.jsonl", reward=("flexible", "mytask_mod:length")),
     "flexible does not apply"),
    (dict(name="mytask_mod:make_task", reward=("flexible", "mytask_mod:length")),
     "is your own: --task.reward takes module:function rewards only"),
    (dict(name="calc", reward=("mytask_mod:length",)), "has its own reward"),
    (dict(name="arith", reward=("mytask_mod:length",), format_weight=0.5),
     "add a format reward as another --task.reward"),
    (dict(name="mytask_mod:not_a_task"), "returned a int"),
    (dict(name="mytask_mod:make_env"), "give its rows with --task.data"),
    (dict(name="nomod_xyz:make"), "cannot import 'nomod_xyz'"),
])
def test_a_task_config_that_cannot_run_is_refused_by_name(in_user_dir, cfg, message):
    write_jsonl(in_user_dir / "rows.jsonl", ROWS)
    with pytest.raises(ValueError, match=message):
        build(TaskConfig(**cfg), seed=0)


def test_config_level_refusals():
    with pytest.raises(ValueError, match="strict or flexible is one reward; name one"):
        TaskConfig(reward=("strict", "flexible"))
    with pytest.raises(ValueError, match="1 weights for 2"):
        TaskConfig(name="data", reward=("a:f", "b:g"), reward_weights=(1.0,))
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        TaskConfig(name="nope")
    assert TaskConfig(reward="flexible").reward == ("flexible",)  # a string from Python


BAD_MIX = '''
def bad_sometimes(prompts, completions, **kwargs):
    """Row i ("i+1=") gets bad value i: all but row 7 are bad."""
    i = int(prompts[0].split("+")[0])
    return [[float("nan")], [float("inf")], ["0.5"], [1e39], [10 ** 400], [None], [1.0, 2.0],
            [float(len(completions[0]) % 3)]][i]
'''


def test_bad_reward_values_never_stop_a_run_nor_reach_the_advantages(tmp_path):
    """A 2-step run whose only reward returns NaN, inf, a string, 1e39, 10**400, None and
    two values for one row: each a counted 0, every metric finite, the run completes."""
    (tmp_path / "badmix.py").write_text(textwrap.dedent(BAD_MIX))
    write_jsonl(tmp_path / "rows.jsonl", [{"prompt": f"{i}+1="} for i in range(8)])
    out = subprocess.run(
        [sys.executable, "-m", "locojax.cli", "train", "demo", "--model", "tiny", "--mode",
         "single", "--steps", "2", "--run-dir", str(tmp_path / "run"), "--task.name", "data",
         "--task.data", "rows.jsonl", "--task.reward", "badmix:bad_sometimes",
         "--rollout.prompts-per-step", "4", "--algo.group-size", "4",
         "--rollout.max-new-tokens", "6", "--rollout.max-prompt-tokens", "8",
         "--eval.every", "0", "--no-progress", "--no-tensorboard"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert rows[-1]["step"] == 2
    for r in rows:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
    # 2 steps x 4 prompts cover the 8 rows once, each sampled 4 times; 7 rows are bad
    # (a None alone on its row is an error too)
    assert sum(r.get("reward/errors", 0) for r in rows) == 7 * 4
    assert "on row rows.jsonl:" in out.stderr  # the first failures are logged by row


def test_a_builtin_reward_named_with_yours_is_kept_next_to_them(in_user_dir):
    """--task.reward flexible my_mod:fn: GSM8K's flexible correctness (weight 1, on the answer
    column of a data task) plus your reward at its weight; alone, yours replaces it."""
    data = write_jsonl(in_user_dir / "rows.jsonl", ROWS)
    t = build(TaskConfig(name="data", data=data, prompt_field="q", answer_field="a",
                         reward=("flexible", "mytask_mod:length"), reward_weights=(0.5,)),
              seed=0)
    ex = t.train[0]  # 2+3= -> 5
    assert [n for n, _, _ in t.reward.parts] == ["correct_flexible", "length"]
    assert t.score("so it is 5", ex)[0] == 1.0 + 0.5 * len("so it is 5")
    assert t.score("it is 6", ex)[0] == 0.5 * len("it is 6")
    t = build(TaskConfig(name="arith", level=1, reward=("strict", "mytask_mod:length"),
                         format_weight=0.25), seed=0)
    assert [(n, w) for n, _, w in t.reward.parts] == [("correct_strict", 1.0), ("format_ok", 0.25),
                                                       ("length", 1.0)]
    assert t.format_check is not None  # the built-in format is still reported
