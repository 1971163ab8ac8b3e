"""The multi-turn rollout driver with scripted policies: transcripts, masks, cut-offs, errors."""

import re

import numpy as np
import pytest

from locojax.envs.base import Example, Step, ToolEnv
from locojax.envs.gsm8k import correct_strict
from locojax.envs.rewards import RewardConfig, RewardRunner
from locojax.envs.tasks import calc
from text_episodes import Generation, episode_metrics, run_episodes


def oracle(prompts):
    """Calls the calculator on the prompt's expression, then copies the result."""
    out = []
    for p in prompts:
        result = re.findall(r"<result>(.*?)</result>", p)
        out.append(f"#### {result[-1]}" if result else f"<tool>calc {p.split('=')[0]}</tool>")
    return out


def encode(text):
    return [ord(c) for c in text]  # a char-level tokenizer


def test_oracle_policy_solves_calc_and_masks_observations():
    task = calc.task(level=2)
    examples = list(task.test[:16])
    calls = []

    def policy(prompts):
        calls.append(len(prompts))
        return oracle(prompts)

    eps = run_episodes(policy, task.make_env, examples, task.max_turns)
    assert calls == [16, 16]  # one batched policy call per turn
    for ep, ex in zip(eps, examples):
        assert ep.reward == 1.0 and ep.done and ep.turns == 2 and not ep.error
        # The rollout transcript equals the SFT demonstration.
        demo = task.demo(ex)
        assert ep.completion == demo.completion
        assert [s.is_model for s in ep.segments] == [s.is_model for s in demo.segments]
        prompt_ids, ids, mask = ep.tokenize(encode)
        assert "".join(map(chr, prompt_ids)) == ex.prompt
        assert "".join(map(chr, ids)) == ep.completion
        # Exactly the environment's "<result>...</result>\n" is masked.
        env_text = "".join(chr(t) for t, m in zip(ids, mask) if m == 0)
        assert env_text == f"<result>{ex.answer}</result>\n"
        model_text = "".join(chr(t) for t, m in zip(ids, mask) if m == 1)
        assert model_text == f"<tool>calc {ex.meta['expr']}</tool>#### {ex.answer}"
    m = episode_metrics(eps)
    assert m["env/reward/mean"] == 1.0 and m["env/tool_calls/mean"] == 1.0
    assert m["env/errors"] == 0 and m["env/truncated"] == 0


def test_wrong_and_direct_policies():
    task = calc.task(level=1)
    examples = list(task.test[:8])
    wrong = run_episodes(lambda ps: ["#### 0"] * len(ps), task.make_env, examples, 3)
    assert all(ep.reward == 0.0 and ep.done and ep.turns == 1 for ep in wrong)
    direct = run_episodes(lambda ps: [f"#### {calc.calculator(p[:-1])}" for p in ps],
                          task.make_env, examples, 3)
    assert all(ep.reward == 1.0 and ep.turns == 1 for ep in direct)  # no tool is fine too
    # Calls the tool forever: cut off at max_turns with reward 0, the last result masked.
    loop = run_episodes(lambda ps: ["<tool>calc 1+1</tool>"] * len(ps), task.make_env,
                        examples, max_turns=2)
    for ep in loop:
        assert ep.reward == 0.0 and not ep.done and ep.turns == 2
        assert [s.is_model for s in ep.segments] == [True, False, True, False]
    assert episode_metrics(loop)["env/truncated"] == len(examples)


def test_turn_cut_after_tool_call_and_generation_ids():
    ex = Example("e", "6*7=", "42", meta={"expr": "6*7"})
    gen_ids = [101, 102]

    def policy(prompts):
        p = prompts[0]
        if "<result>" not in p:  # keeps writing after its call: a fake result
            return [Generation("<tool>calc 6*7</tool><result>41</result>\n#### 41", [1, 2, 3])]
        return [Generation("#### 42", gen_ids, [-0.1, -0.2])]

    (ep,) = run_episodes(policy, calc.make_env, [ex], max_turns=3)
    assert ep.reward == 1.0
    assert ep.completion == "<tool>calc 6*7</tool><result>42</result>\n#### 42"
    # The cut turn is re-encoded; the untouched one keeps the sampler's exact ids.
    assert ep.generations[0] is None and ep.generations[2].token_ids == gen_ids
    _, ids, mask = ep.tokenize(encode)
    assert list(ids[-2:]) == gen_ids and list(mask[-2:]) == [1, 1]
    assert "".join(map(chr, ids[:-2])) == "<tool>calc 6*7</tool><result>42</result>\n"


class Exploding:
    def __init__(self):
        self.n = 0

    def reset(self, ex):
        return ex.prompt

    def step(self, action):
        self.n += 1
        if action == "boom":
            raise RuntimeError("env bug")
        return Step("ok\n", 0.5, self.n >= 3, {})


def test_env_error_ends_only_its_episode_and_max_chars():
    exs = [Example(str(i), "go:", "") for i in range(3)]
    eps = run_episodes(lambda ps: ["boom" if p == "go:" and i == 1 else "a"
                                   for i, p in enumerate(ps)], Exploding, exs, max_turns=5)
    assert eps[1].error == "RuntimeError: env bug" and eps[1].reward == 0.0
    assert eps[0].done and eps[0].reward == 1.5 and eps[0].turns == 3
    assert episode_metrics(eps)["env/errors"] == 1
    # A transcript longer than max_chars is cut off after the turn that crossed it.
    (ep,) = run_episodes(lambda ps: ["aaaa"] * len(ps), Exploding, exs[:1], 5, max_chars=10)
    assert ep.turns == 2 and not ep.done and ep.transcript == "go:aaaaok\naaaaok\n"


def test_bad_policy_and_arguments():
    ex = Example("e", "1=", "1")
    env = lambda: ToolEnv({}, correct_strict)  # noqa: E731
    with pytest.raises(ValueError, match="returned 0 completions for 1 prompts"):
        run_episodes(lambda ps: [], env, [ex], 2)
    with pytest.raises(ValueError, match="max_turns"):
        run_episodes(lambda ps: ps, env, [ex], 0)
    assert run_episodes(lambda ps: ps, env, [], 2) == []
    _, ids, mask = run_episodes(lambda ps: ["#### 1"], env, [ex], 1)[0].tokenize(encode)
    assert ids.dtype == np.int32 and mask.tolist() == [1] * 6


def test_final_reward_through_a_runner_is_guarded():
    def broken(completion, example):
        raise KeyError("oops")

    runner = RewardRunner(RewardConfig(timeout_s=2.0))
    ex = calc.task(level=1).test[0]
    env = lambda: ToolEnv({"calc": calc.calculator}, broken, score=runner.score)  # noqa: E731
    (ep,) = run_episodes(oracle, env, [ex], max_turns=3)
    assert ep.done and ep.reward == 0.0 and not ep.error  # scored 0, the episode still ended
    assert runner.metrics()["reward/errors"] == 1
    (ep,) = run_episodes(oracle, lambda: calc.make_env(score=runner.score), [ex], 3)
    assert ep.reward == 1.0 and runner.metrics()["reward/calls"] == 1
