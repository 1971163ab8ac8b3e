"""Prompt lengths from the data (envs/data_lengths.py): every prompt is encoded before any
work, `auto` sizes the width from the longest, and a row over an explicit width or one the
tokenizer cannot encode is refused naming its row, or skipped and counted."""

import json
import os
import subprocess
import sys

import pytest

from locojax.envs import data_lengths
from locojax.envs.base import Example, Task
from locojax.envs.data import DataError, Dataset
from locojax.model import loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATH500 = os.path.join(os.path.dirname(ROOT), "shared", "data", "math500", "test.jsonl")
TOK = loader.load_tokenizer_of("tiny")  # one token per character


def _task(prompts, test=None):
    rows = Dataset(tuple(Example(f"f.jsonl:{i + 1}", p, "1") for i, p in enumerate(prompts)),
                   "f.jsonl")
    return Task("t", rows, rows if test is None else test, lambda c, e: 0.0)


def test_bucket_is_a_power_of_two_then_a_multiple_of_16_then_of_128():
    assert [data_lengths.bucket(n) for n in (0, 1, 8, 9, 32, 33, 46, 100, 128, 129, 449, 961)] \
        == [8, 8, 8, 16, 32, 48, 48, 112, 128, 256, 512, 1024]


def test_auto_sizes_the_width_from_the_longest_prompt():
    task, sized = data_lengths.fit(_task(["ab", "a" * 20, "abc"]), TOK, "auto")
    assert sized.max_prompt_tokens == 32 and sized.longest == 20
    assert sized.longest_id == "f.jsonl:2" and sized.skipped == 0
    assert len(task.train) == 3
    assert "auto: longest prompt 20 tokens (f.jsonl:2)" in sized.describe("auto")


def test_an_explicit_width_refuses_a_longer_prompt_naming_row_and_length():
    with pytest.raises(DataError, match=r"f.jsonl:2: its prompt has 20 tokens, more than "
                       r"--rollout.max-prompt-tokens=16 \(and 1 more rows\); "
                       r"--task.skip-invalid skips"):
        data_lengths.fit(_task(["ab", "a" * 20, "b" * 17]), TOK, 16)
    task, sized = data_lengths.fit(_task(["ab", "a" * 20, "b" * 17]), TOK, 16,
                                   skip_invalid=True)
    assert [ex.id for ex in task.train] == ["f.jsonl:1"] and task.test is task.train
    assert sized.skipped == 2 and task.train.skipped == 2
    assert task.train.problems[0].startswith("f.jsonl:2: its prompt has 20 tokens")


def test_a_prompt_the_tokenizer_cannot_encode_is_refused_at_start_up():
    """The char vocabulary has no U+2019: that row used to pass the data check and stop a
    multi-host run at the step that drew it."""
    with pytest.raises(DataError, match=r"f.jsonl:2: the tokenizer cannot encode its prompt "
                       r"\(ValueError: character '’'"):
        data_lengths.fit(_task(["ab", "what’s 2+2"]), TOK, "auto")
    task, sized = data_lengths.fit(_task(["ab", "what’s 2+2"]), TOK, "auto",
                                   skip_invalid=True)
    assert [ex.id for ex in task.train] == ["f.jsonl:1"] and sized.max_prompt_tokens == 8


def test_every_row_skipped_is_an_error():
    with pytest.raises(DataError, match="every row of the train split was skipped"):
        data_lengths.fit(_task(["a" * 20]), TOK, 8, skip_invalid=True)


def test_multi_turn_needs_an_explicit_width():
    task = Task("mt", (), (), lambda c, e: 0.0, make_env=lambda: None)
    with pytest.raises(ValueError, match="multi-turn.*give a number"):
        data_lengths.fit(task, TOK, "auto")
    assert data_lengths.fit(task, TOK, 64)[1].max_prompt_tokens == 64


def _arith(level, template="plain", train_size=100_000):
    from locojax.envs.registry import TaskConfig, build

    return build(TaskConfig(name="arith", level=level, template=template,
                            train_size=train_size), 0)


def test_a_generated_split_is_sized_from_its_widest_prompts_not_every_row():
    """arith's 100,000 drawn rows are not encoded at every start: its generator declares
    its longest prompts, and a probe of drawn rows checks them."""
    from locojax.envs.tasks import procedural

    task = _arith(4)
    draws = []
    sample = task.train.sample
    task.train.sample = lambda rng: draws.append(1) or sample(rng)
    _, auto = data_lengths.fit(task, TOK, "auto")
    assert auto.longest == len("99+99+99=") and auto.max_prompt_tokens == 16
    assert auto.longest_id.startswith("widest/")
    assert 0 < len(draws) <= 10 * data_lengths.PROBE  # a draw may reject a few before it keeps
    assert isinstance(task.train, procedural.ProceduralSplit)


def test_the_widest_prompts_bound_every_drawn_prompt_at_every_level():
    """Under the char tokenizer a prompt's length is its characters: the widest (every
    operand at its most digits) bound 2000 drawn rows of each level and equal the longest."""
    for level in range(6):
        task = _arith(level, train_size=2000)
        bound = max(len(TOK.encode(ex.prompt)) for ex in task.train.widest)
        drawn = [len(TOK.encode(task.train[i].prompt)) for i in range(2000)]
        assert max(drawn) <= bound, level


SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct")


@pytest.mark.skipif(not os.path.exists(os.path.join(SMOL, "tokenizer.json")),
                    reason="make real-model has not converted SmolLM2-135M-Instruct")
def test_the_widest_chat_prompts_bound_every_level0_prompt_with_smollm2():
    """The real demo's prompts (arith level 0, SmolLM2's chat template): every one of its
    21 x 21 x 2 expressions, encoded, is no longer than the declared widest, and the width
    auto gives is the 48 the demo's runs were measured with."""
    from locojax.envs.prompt import encode_prompt
    from locojax.envs.tasks import arith
    from locojax.train.build import tokenizer_of

    tok = tokenizer_of(SMOL, "chat")
    task = _arith(0, "chat")
    bound = max(len(encode_prompt(tok, ex)) for ex in task.train.widest)
    every = [len(encode_prompt(tok, Example("", arith.chat_prompt(f"{a}{op}{b}"), "")))
             for a in range(21) for b in range(21) for op in "+-"]
    assert max(every) == bound
    assert data_lengths.fit(task, tok, "auto")[1].max_prompt_tokens == 48


def test_a_wrong_declaration_is_caught_by_the_probe():
    task = _arith(3)
    task.train.widest = task.train.widest[:0] + (Example("widest/0", "1+1=", ""),)
    with pytest.raises(DataError, match=r"the train split's generator declares its longest "
                       r"prompts 4 tokens, but train/0 has 8 .*give "
                       r"--rollout.max-prompt-tokens a number"):
        data_lengths.fit(task, TOK, "auto")


def test_a_generated_split_over_an_explicit_width_is_refused_at_start_up():
    """Its rows are drawn as the run goes, so none can be skipped: refused, even with
    --task.skip-invalid, naming the widest prompt, before any step draws one."""
    for skip in (False, True):
        with pytest.raises(DataError, match=r"widest/0: its prompt has 8 tokens, more than "
                           r"--rollout.max-prompt-tokens=6, the longest prompt the generated "
                           r"train split can draw; give a wider"):
            data_lengths.fit(_arith(3), TOK, 6, skip_invalid=skip)
    assert data_lengths.fit(_arith(3), TOK, 8)[1].max_prompt_tokens == 8


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(MATH500), reason="MATH-500 is not in shared/data")
def test_math500_evaluates_whole_without_a_width(tmp_path):
    """`locojax eval` on MATH-500 with --max-prompt-tokens left out: the width comes from the
    longest of its 500 prompts. The tiny preset's char vocabulary cannot encode 2 of them
    (a tab, a non-ASCII character): refused by row before any sampling, or skipped and counted
    with --skip-invalid. (With an HF tokenizer every row encodes: docs/your_task.md.)"""
    out = tmp_path / "eval.jsonl"
    cmd = [sys.executable, "-m", "locojax.cli", "eval", "--model", "tiny", "--task", "math",
           "--data", MATH500, "--limit", "2", "--max-new-tokens", "2", "--batch-size", "2",
           "--out", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "test.jsonl:18: the tokenizer cannot encode" in run.stderr
    assert "(and 1 more rows); --skip-invalid skips" in run.stderr
    run = subprocess.run([*cmd, "--skip-invalid"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    longest = max(len(json.loads(line)["problem"]) for line in open(MATH500))
    assert "prompts: max_prompt_tokens=1792 (auto: longest prompt 1752 tokens " \
           "(test.jsonl:302), rounded up); skipped 2 rows" in run.stdout, run.stdout
    assert longest < 1752  # the prompt is the problem within the task's plain template
    summary = json.load(open(f"{out}.summary.json"))
    assert summary["rows"] == 2 and summary["skipped"] == 2


@pytest.mark.skipif(not (os.path.exists(MATH500) and os.path.exists(SMOL)),
                    reason="MATH-500 (shared/data) or SmolLM2 (make real-model) is absent")
def test_math500_sizes_all_500_prompts_with_smollm2_and_refuses_none():
    """The issue's failure: eval stopped at MATH-500's 6th row (449 tokens over a guessed
    384). With auto, SmolLM2's own tokenizer and chat template encode all 500 prompts, none
    is refused, and the width is the longest's bucket (docs/eval.md has the whole run)."""
    from locojax.envs.registry import TaskConfig, build
    from locojax.train.build import tokenizer_of

    task = build(TaskConfig(name="math", data=MATH500, test_data=MATH500, template="chat"), 0)
    task, sized = data_lengths.fit(task, tokenizer_of(SMOL, "chat"), "auto")
    assert len(task.test) == 500 and sized.skipped == 0
    assert (sized.longest, sized.longest_id) == (961, "test.jsonl:302")
    assert sized.max_prompt_tokens == 1024


def test_train_defaults_to_auto_and_the_demo_presets_keep_their_widths():
    """auto is train's default; the demo (char tokenizer) and the real demo (SmolLM2's chat
    template, where converted) resolve to the widths their runs were measured with."""
    import dataclasses

    from locojax.train.build import sized
    from locojax.train.config import PRESETS, RolloutConfig

    assert RolloutConfig().max_prompt_tokens == "auto"
    assert sized(PRESETS["demo"][1])[0].rollout.max_prompt_tokens == 8
    if os.path.exists(os.path.join(SMOL, "tokenizer.json")):
        real = dataclasses.replace(PRESETS["real-demo"][1], model=SMOL)
        assert sized(real)[0].rollout.max_prompt_tokens == 48
