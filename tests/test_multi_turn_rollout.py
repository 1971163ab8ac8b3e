"""The multi-turn rollout on the host (`locojax.rollout.multi_turn`), with scripted envs.

Checked: masks (model tokens carry behaviour logprobs and are the only targets; env
tokens are context, each observation cut to max_obs_tokens), rewards (a crash or a hang
zeroes a trajectory that had earned reward), limits (turns, trajectory tokens), the
counters, a turn cut at the token level after `</tool>`, the env pool's deadlines, and
the refusal of limits that do not fit. The engine is the random TINY model with the char
tokenizer (its random text never calls a tool: the envs decide what happens).
"""

import threading
import time

import jax
import numpy as np
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import TOOL_CLOSE, Example, Step, Task
from locojax.envs.pool import EnvPool
from locojax.model import config, params
from locojax.profiler import StepTimer
from locojax.rollout import limits as limits_lib
from locojax.rollout.multi_turn import cut_turn, rollout, truncate_tokens
from locojax.tokenizer import CharTokenizer

N, T, O, P = 6, 3, 5, 8  # as tests/test_extend.py, so the compiled programs are shared
TOK = CharTokenizer()
LONG = "<result>" + "x" * 100 + "</result>\n"


class Scripted:
    """An env whose behaviour the example's prompt names."""

    def reset(self, ex):
        self.mode, self.steps, self.actions = ex.prompt.rstrip("="), 0, []
        if self.mode == "bad":
            raise RuntimeError("cannot start")
        return ex.prompt

    def step(self, action):
        self.steps += 1
        self.actions.append(action)
        if self.mode == "done":
            return Step("", 1.0, True, {})
        if self.mode == "long":  # a long observation every turn, never done
            return Step(LONG, 0.0, False, {"tool": "x"})
        if self.mode == "crash":  # earns 0.5, then raises
            if self.steps == 2:
                raise RuntimeError("env bug")
            return Step("<r>\n", 0.5, False, {"tool": "x"})
        if self.mode == "hang":
            time.sleep(3)
        if self.mode == "junk":
            return "not a step"
        return Step("ok\n", 0.0, False, {})  # "talk"


def task(modes):
    exs = [Example(m, m + "=", "") for m in modes]
    return Task("scripted", exs, exs, lambda c, e: 0.0, make_env=Scripted, max_turns=T)


@pytest.fixture(scope="module")
def engine():
    cfg = config.tiny()
    return Engine(cfg), params.init(cfg, jax.random.key(1))


def run(engine, modes, max_trajectory_tokens=0, timeout=0.5):
    eng, w = engine
    lim = limits_lib.resolve(
        limits_lib.MultiTurnConfig(max_obs_tokens=O, max_trajectory_tokens=max_trajectory_tokens),
        T, N, P, 1 << 15)
    s = SamplingConfig(max_new_tokens=N, stop_token_ids=TOK.stop_ids, pad_token_id=TOK.pad_id)
    with EnvPool(workers=3, timeout_s=timeout) as pool:
        t = task(modes)
        return rollout(eng, w, TOK, t, pool, t.train, 0, jax.random.key(0), s, 2, lim,
                       StepTimer()), lim


def segments(row_mask):
    """[(start, stop)] of the True runs of a 1-D mask."""
    edges = np.flatnonzero(np.diff(np.r_[0, row_mask.astype(int), 0]))
    return list(zip(edges[::2], edges[1::2]))


def test_masks_rewards_errors_and_turn_limits(engine):
    out, lim = run(engine, ["done", "long", "crash", "hang"])
    assert out.tokens.shape == (8, lim.max_trajectory_tokens) == (8, T * N + (T - 1) * O)
    assert not (out.mask & out.env_mask).any()
    assert (out.logprobs[out.mask] < 0).all() and (out.logprobs[~out.mask] == 0).all()
    assert (out.tokens[~(out.mask | out.env_mask)] == TOK.pad_id).all()
    # done: one model turn, reward 1. long: 3 turns (the limit), 2 observations of O tokens,
    # head and tail of the real one. crash: its 0.5 is taken back. hang: a timeout.
    np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0, 0, 0, 0, 0])
    assert out.status == ["done"] * 2 + ["truncated"] * 2 + ["error"] * 2 + ["timeout"] * 2
    np.testing.assert_array_equal(out.turns, [1, 1, 3, 3, 2, 2, 1, 1])
    want_obs = TOK.encode(LONG)[:3] + TOK.encode(LONG)[-2:]
    for row in (2, 3):
        obs = segments(out.env_mask[row])
        assert len(obs) == 2 and all(b - a == O for a, b in obs)
        assert all(out.tokens[row, a:b].tolist() == want_obs for a, b in obs)
        assert len(segments(out.mask[row])) == 3
    for row in (0, 1, 6, 7):
        assert not out.env_mask[row].any() and 1 <= out.mask[row].sum() <= N
    assert out.texts[4].count("<r>\n") == 1  # crash: its first observation is context
    assert out.env.errors == 2 and out.env.timeouts == 2
    assert out.env.truncated == 2 and out.env.obs_truncated == 4
    m = out.env.metrics(rows=8.0)
    assert m["env/turns/mean"] == out.turns.mean()
    assert m["env/tool_call_rate"] == 4 / 8  # long and crash called "x"
    assert m["env/accuracy_no_tool"] == 2 / 4  # done rows are correct without a tool


def test_token_limit_bad_reset_and_malformed_steps(engine):
    m = N + 3  # room for a turn, an observation and a little more
    out, _ = run(engine, ["talk", "bad", "junk", "talk"], max_trajectory_tokens=m)
    assert out.tokens.shape[1] == m
    lengths = (out.mask | out.env_mask).sum(1)
    assert (lengths <= m).all()
    for row in (0, 1, 6, 7):  # talk: ends on a limit, mostly the token limit
        assert out.status[row] == "truncated" and lengths[row] >= N - 2
    assert out.status[2:6] == ["error"] * 4 and out.rewards.max() == 0
    assert not out.mask[2:4].any()  # a failed reset: the row took part in nothing
    assert out.mask[4:6].sum(1).min() >= 1  # junk: its turn happened
    assert out.env.errors == 4


def test_cut_turn_at_the_token_that_closes_the_call():
    ids = TOK.encode("<tool>calc 1+1</tool><result>2")
    assert cut_turn(TOK, ids) == len("<tool>calc 1+1</tool>")
    assert cut_turn(TOK, TOK.encode("#### 2")) == 6
    assert cut_turn(TOK, TOK.encode(TOOL_CLOSE)) == len(TOOL_CLOSE)
    assert truncate_tokens(list(range(10)), 4) == ([0, 1, 8, 9], True)
    assert truncate_tokens([1, 2], 4) == ([1, 2], False)


def test_env_pool_times_out_and_keeps_its_workers():
    """The hung call spins in Python, holding the GIL but for CPython's switch interval (as
    a tool stuck in a pure-Python loop would): the pool still notices its deadline and
    replaces the worker. A call stuck inside one C call that never releases the GIL (a
    catastrophic regex) would stop every thread, the pool's included: docs/security.md
    says so, and such tools belong in a process (the sandbox, or rewards' process
    isolation)."""
    gate = threading.Event()

    def call(x):
        if x == "hang":
            deadline = time.monotonic() + 10
            while not gate.is_set() and time.monotonic() < deadline:
                pass  # busy: no sleep, no wait, nothing that releases the GIL by itself
        if x == "boom":
            raise ValueError("bad")
        return x * 2

    with EnvPool(workers=2, timeout_s=0.3) as pool:
        out = pool.run(call, [("a",), ("hang",), ("boom",), ("b",)])
        assert [o.status for o in out] == ["ok", "timeout", "error", "ok"]  # not waited out
        assert out[0].value == "aa" and "ValueError: bad" in out[2].detail
        # The hung worker was replaced: two calls still run side by side.
        out = pool.run(lambda x: time.sleep(0.2) or x, [(1,), (2,)])
        assert [o.value for o in out] == [1, 2]
        gate.set()


@pytest.mark.parametrize("kw,match", [
    (dict(max_turns=100), "KV-cache slots per row"),
    (dict(max_trajectory_tokens=1 << 16), "max_position_embeddings"),
    (dict(env_timeout_s=0), "env_timeout_s"),
    (dict(max_obs_tokens=0), "max_obs_tokens"),
])
def test_limits_that_do_not_fit_are_refused(kw, match):
    cfg = limits_lib.MultiTurnConfig(max_cache_slots=2048, **kw)
    with pytest.raises(ValueError, match=match):
        limits_lib.resolve(cfg, 3, 32, 16, 40960)
    ok = limits_lib.resolve(limits_lib.MultiTurnConfig(), 3, 32, 16, 40960)
    assert ok.slots == 16 + 3 * 31 + 2 * 65 and ok.max_trajectory_tokens == 3 * 32 + 2 * 64
