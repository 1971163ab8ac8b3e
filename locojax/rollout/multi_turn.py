"""One host's multi-turn rollout: model turns in the KV cache, environment turns on the host.

    prompt ─ begin ─ decode ─┬─ env steps (pool, parallel) ─ extend ─ decode ─┬─ ...
                             └─ done / error / timeout / out of turns, tokens ┘ (row ends)

Each row is one trajectory with its own environment (`task.make_env()`). A model turn
ends at EOS, at the tokens of `</tool>` (the engine stops there, inside its loop), or at
the row's token budget. The tokens the engine sampled are the tokens trained on; the host
decodes them only to hand the env its text. If a turn holds `</tool>` in another
tokenization than the stop sequence's, it is cut after the token that completes it, at
the token level, and the env sees the text up to `</tool>`. The environment's answer is
encoded, cut to `max_obs_tokens` (head and tail), and appended with `Conversation.extend`:
written into the row's existing cache, never re-prefilling the history.

Rows come back as `Rollouts` whose response columns interleave model and environment
tokens: `mask` marks model tokens (the policy loss's targets, and the only tokens with
behaviour logprobs), `env_mask` environment tokens (context: attended to, never trained
on, never counted by a loss normaliser).

A trajectory ends (and its reward is the sum of its env's step rewards) when the env says
done, when it has had `max_turns` model turns or would exceed `max_trajectory_tokens`
(`env/truncated`); an env that raises or outlives `env_timeout_s` ends its trajectory with
reward 0 (`env/errors`, `env/timeouts`), never the run.

References: verl's and rLLM's multi-turn rollouts (observation tokens masked out of the
loss); SWE-agent (tool output truncated, one action per turn).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import jax
import numpy as np

from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.sampling import SamplingConfig
from locojax.envs.base import (TOOL_CLOSE, Example, Step, Task, check_reward,
                               truncate_to_tool_call)
from locojax.envs.pool import EnvPool, Outcome
from locojax.envs.prompt import encode_prompt
from locojax.profiler import StepTimer
from locojax.rollout.limits import Limits
from locojax.rollout.single_turn import Rollouts
from locojax.sums import Sums
from locojax.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EnvStats(Sums):
    """What a batch of trajectories did, as sums over its rows (adds with +)."""

    errors: float = 0.0  # trajectories ended by an env error
    timeouts: float = 0.0  # ... by an env call past its deadline
    truncated: float = 0.0  # ... by max_turns or max_trajectory_tokens
    obs_truncated: float = 0.0  # observations cut to max_obs_tokens
    turns: float = 0.0  # model turns
    tool_calls: float = 0.0
    env_tokens: float = 0.0  # tokens the environments wrote
    used_tool: float = 0.0  # rows that called a tool at least once
    no_tool: float = 0.0  # rows that never did
    correct_no_tool: float = 0.0  # rows that never did and were right

    def metrics(self, rows: float) -> dict[str, float]:
        """The logged `env/*` metrics of these sums over `rows` rows."""
        return {
            "env/errors": self.errors, "env/timeouts": self.timeouts,
            "env/truncated": self.truncated, "env/obs_truncated": self.obs_truncated,
            "env/turns/mean": self.turns / rows,
            "env/tool_calls/mean": self.tool_calls / rows,
            "env/env_tokens/mean": self.env_tokens / rows,
            "env/tool_call_rate": self.used_tool / rows,
            "env/accuracy_no_tool": self.correct_no_tool / max(self.no_tool, 1.0),
        }


@dataclasses.dataclass
class MultiTurnRollouts(Rollouts):
    """`Rollouts` plus what each trajectory did (for evaluation and dumps)."""

    turns: np.ndarray | None = None  # [R] int32 model turns
    tool_calls: np.ndarray | None = None  # [R] int32
    status: list[str] = dataclasses.field(default_factory=list)  # [R] how each ended


@dataclasses.dataclass
class Trajectory:
    """One row's trajectory as it grows (host side)."""

    env: Any = None
    ids: list[int] = dataclasses.field(default_factory=list)  # response tokens
    is_model: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    tool_calls: int = 0
    obs_truncated: int = 0
    status: str = "running"  # running | done | truncated | error | timeout
    detail: str = ""

    def add(self, ids: Sequence[int], model: bool, logprobs: Sequence[float] | None = None):
        self.ids += [int(t) for t in ids]
        self.is_model += [model] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if model else [0.0] * len(ids)

    def end(self, status: str, detail: str = "") -> None:
        self.status, self.detail = status, detail
        if status in ("error", "timeout"):
            self.reward = 0.0


def cut_turn(tokenizer: Tokenizer, ids: Sequence[int]) -> int:
    """How many tokens of a model turn to keep: all, or up to and including the token that
    completes its first `</tool>` (the env answers that call; what follows is dropped)."""
    if TOOL_CLOSE not in tokenizer.decode(list(ids)):
        return len(ids)
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds `</tool>`
    while lo < hi:
        mid = (lo + hi) // 2
        if TOOL_CLOSE in tokenizer.decode(list(ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return lo


def truncate_tokens(ids: list[int], limit: int) -> tuple[list[int], bool]:
    """At most `limit` tokens, keeping the head and the tail (where a result's closing tag
    and the end of a test log are)."""
    if len(ids) <= limit:
        return ids, False
    tail = limit // 2
    return ids[:limit - tail] + (ids[-tail:] if tail else []), True


def _start(task: Task, example: Example):
    env = task.make_env()
    return env, env.reset(example)


def _step(env, action: str) -> Step:
    out = env.step(action)
    obs, reward, done, info = out  # a malformed result is an env error, caught by the pool
    if not isinstance(obs, str):
        raise TypeError(f"env step returned observation of type {type(obs).__name__}")
    # A value the trainer cannot use (1e39 is inf in float32, 10**400 overflows) raises
    # RewardValueError naming it: an env error, the trajectory scores 0, never NaN advantages.
    return Step(obs, check_reward(reward), bool(done), dict(info))


def rollout(engine: Engine, weights, tokenizer: Tokenizer, task: Task, pool: EnvPool,
            examples: Sequence[Example], first_group: int, key: jax.Array,
            sampling: SamplingConfig, group_size: int, limits: Limits, timer: StepTimer,
            compact: bool = True) -> MultiTurnRollouts:
    """`group_size` trajectories per example; rows prompt-major, group ids global (as
    `single_turn.rollout`). `timer` gets admission, prefill, decode, env and extend."""
    phase = timer.phase
    g, n, m = group_size, sampling.max_new_tokens, limits.max_trajectory_tokens
    r = len(examples) * g
    row_examples = [ex for ex in examples for _ in range(g)]
    with phase("env"):
        started = pool.run(lambda ex: _start(task, ex), [(ex,) for ex in row_examples])
    trajs = [Trajectory() for _ in range(r)]
    with phase("admission"):
        texts = []
        for i, ex in enumerate(examples):
            group = started[i * g:(i + 1) * g]
            text = next((o.value[1] for o in group if o.status == "ok"), None)
            texts.append(text if isinstance(text, str) else None)
            for j, o in enumerate(group):
                t = trajs[i * g + j]
                if o.status == "ok" and isinstance(o.value[1], str):
                    t.env = o.value[0]
                else:
                    t.end(o.status if o.status != "ok" else "error",
                          o.detail or f"reset returned {type(o.value[1]).__name__}, not text")
        ids = [tokenizer.encode(text) if text is not None else encode_prompt(tokenizer, ex)
               for text, ex in zip(texts, examples)]
        for ex, x in zip(examples, ids):
            if len(x) > limits.max_prompt_tokens:
                raise ValueError(f"prompt of example {ex.id} has {len(x)} tokens, more than "
                                 f"max_prompt_tokens={limits.max_prompt_tokens}")
        prompt_tokens, prompt_mask = pad_prompts(ids, tokenizer.pad_id, limits.max_prompt_tokens)
    conv = engine.conversation(sampling, limits.slots, max_block=limits.max_block,
                        stops=(tuple(tokenizer.encode(TOOL_CLOSE)),), compact=compact)
    try:
        with phase("prefill") as ph:
            conv.begin(weights, prompt_tokens, prompt_mask, key, num_samples=g,
                       first_row=first_group * g, limits=[min(n, m)] * r,
                       active=[t.status == "running" for t in trajs])
            ph.sync(conv.pending)
        asked = list(range(r))  # the rows of the turn being decoded, in its order
        decode_steps = 0
        while any(trajs[i].status == "running" for i in asked):
            with phase("decode"):
                out = conv.decode()
                decode_steps += out.steps
            with phase("env"):
                cont = _env_turn(tokenizer, pool, trajs, asked, out, limits)
            if not cont:
                break
            with phase("extend") as ph:
                asked = [row for row, _, _, _ in cont]
                conv.extend(asked, [k for _, k, _, _ in cont], [o for _, _, o, _ in cont],
                            [lim for _, _, _, lim in cont])
                ph.sync(conv.pending)
    finally:
        conv.close()
    out = _rows(tokenizer, examples, prompt_tokens, prompt_mask, trajs, first_group, g, m)
    return dataclasses.replace(out, decode_steps=decode_steps)


def _env_turn(tokenizer: Tokenizer, pool: EnvPool, trajs: list[Trajectory], asked: list[int],
              out, limits: Limits) -> list[tuple[int, int, list[int], int]]:
    """Take the model turn of each asked row, step the envs, decide who goes on.

    Returns (row, tokens of the turn kept, environment tokens, next turn's budget) for each
    row that continues; every other asked row has ended."""
    keep, actions, stepped = {}, [], []
    for i, row in enumerate(asked):
        t = trajs[row]
        if t.status != "running":  # its env failed to start: the row only filled the batch
            continue
        stepped.append(row)
        turn = out.tokens[i, :out.lengths[i]].tolist()
        k = cut_turn(tokenizer, turn)
        t.add(turn[:k], True, out.logprobs[i, :k])
        t.turns += 1
        keep[row] = k
        actions.append((t.env, truncate_to_tool_call(tokenizer.decode(turn[:k]))))
    outcomes: list[Outcome] = pool.run(_step, actions)
    cont = []
    for row, o in zip(stepped, outcomes):
        t = trajs[row]
        if o.status != "ok":
            t.end(o.status, o.detail)
            continue
        obs, reward, done, info = o.value
        t.reward += reward
        t.tool_calls += int("tool" in info)
        if done:
            t.end("done")
            continue
        if t.turns >= limits.max_turns:
            t.end("truncated", "max_turns")
            continue
        try:
            obs_ids = tokenizer.encode(obs)
        except ValueError as e:  # text the tokenizer cannot encode: the env's fault
            t.end("error", f"observation: {e}")
            continue
        obs_ids, cut = truncate_tokens(obs_ids, limits.max_obs_tokens)
        t.obs_truncated += int(cut)
        room = limits.max_trajectory_tokens - len(t.ids) - len(obs_ids)
        if room < 1:
            t.end("truncated", "max_trajectory_tokens")
            continue
        t.add(obs_ids, False)
        cont.append((row, keep[row], obs_ids, min(limits.max_new_tokens, room)))
    return cont


def _rows(tokenizer: Tokenizer, examples, prompt_tokens, prompt_mask, trajs: list[Trajectory],
          first_group: int, g: int, m: int) -> Rollouts:
    r = len(trajs)
    tokens = np.full((r, m), tokenizer.pad_id, np.int32)
    mask, env_mask = np.zeros((r, m), bool), np.zeros((r, m), bool)
    logprobs = np.zeros((r, m), np.float32)
    for i, t in enumerate(trajs):
        k = len(t.ids)
        tokens[i, :k] = t.ids
        mask[i, :k] = t.is_model
        env_mask[i, :k] = ~np.asarray(t.is_model, bool)
        logprobs[i, :k] = t.logprobs
    rewards = np.asarray([t.reward for t in trajs], np.float32)
    correct = rewards >= 1.0 - 1e-6
    used = np.asarray([t.tool_calls > 0 for t in trajs])
    stats = EnvStats(
        errors=float(sum(t.status == "error" for t in trajs)),
        timeouts=float(sum(t.status == "timeout" for t in trajs)),
        truncated=float(sum(t.status == "truncated" for t in trajs)),
        obs_truncated=float(sum(t.obs_truncated for t in trajs)),
        turns=float(sum(t.turns for t in trajs)),
        tool_calls=float(sum(t.tool_calls for t in trajs)),
        env_tokens=float(env_mask.sum()), used_tool=float(used.sum()),
        no_tool=float((~used).sum()), correct_no_tool=float((correct & ~used).sum()))
    texts = [tokenizer.decode(t.ids) for t in trajs]
    group_ids = np.repeat(np.arange(first_group, first_group + len(examples)), g)
    return MultiTurnRollouts(
        list(examples), prompt_tokens, prompt_mask, tokens, mask, logprobs, texts, rewards, {},
        group_ids.astype(np.int32), env_mask=env_mask, env=stats,
        turns=np.asarray([t.turns for t in trajs], np.int32),
        tool_calls=np.asarray([t.tool_calls for t in trajs], np.int32),
        status=[t.status for t in trajs])
