"""Your own task, data and reward, without editing the package.

Three ways in, from least code to most (docs/your_task.md walks through each):

- `--task.name data --task.data FILE --task.reward my_mod:fn`: any dataset (jsonl, parquet,
  a `datasets` directory or hub name), prompts from one column (`--task.prompt-field`), and
  rewards with TRL's signature. Every column but the prompt reaches the reward.
- `--task.reward my_mod:fn` on gsm8k, math or arith: their data, your reward.
- `--task.name my_mod:make_task`: a function returning a `Task` (its own data, reward,
  and `make_env` for multi-turn), or returning a `MultiTurnEnv`, which is then the env
  factory of a multi-turn task over `--task.data`.

A reference is `module:function` (imported from the current directory first, as `python
train.py` would find it) or `path/to/file.py:function` (its directory goes on `sys.path`
and its stem is imported). Workers that score rewards in their own process re-import it by
the same reference: `TRLReward` pickles as its reference, never as code. The Ray modes ship
the modules the references name to every actor (`shipped_modules`, Ray's runtime_env
`py_modules`), so a cluster whose nodes lack the user's files imports them all the same; a
`file.py` reference whose path does not exist there imports the shipped module by its stem.

TRL's reward contract (`trl.GRPOTrainer`, `reward_funcs`), and where locojax departs:

- called as `fn(prompts=..., completions=..., **columns)`, each a list; conversational rows
  (the prompt is a list of messages) get `completions` as `[{"role": "assistant",
  "content": text}]`, plain rows get strings. A function without `**kwargs` gets only the
  arguments it names (TRL passes them all, and fails on such a function).
- departure: one row per call (lists of length 1), so that each row has its own deadline,
  its own error and its own worker kill (`rewards.RewardRunner`); a reward that batches
  work across rows gets no batch to share.
- departure: no `completion_ids` (the reward runs on text; the engine's ids stay on the
  accelerator host) and no `trainer_state`.
- `None` means "does not apply to this row". TRL sums weighted rewards with nansum; here a
  None contributes 0 to the weighted total and leaves its reward's mean, and a row where
  every reward returned None is a counted error (`reward/errors`) scored 0.
- anything else that is not one real number per row (a string, even "0.5"; a list of the
  wrong length; NaN, inf, |r| > 1e6, an int too big for a float) is an error naming the
  reward and the row, scored 0 and counted (`base.check_reward`, docs/security.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from locojax.envs.base import (Example, MultiTurnEnv, Reward, RewardValueError, Task,
                               check_reward, combine_rewards)

# ---------------------------------------------------------------------------------------------
# References.


def is_ref(text: str) -> bool:
    """Whether `text` names user code (`module:function`, `file.py:function`)."""
    return ":" in text


def load_ref(ref: str) -> Any:
    """The object `ref` names, imported; ValueError saying what is missing."""
    where, sep, attr = ref.rpartition(":")
    if not (sep and where and attr):
        raise ValueError(f"{ref!r} is not a reference: write module:function or "
                         "path/to/file.py:function")
    if where.endswith(".py") or os.sep in where:
        path = Path(where).resolve()
        module_name = path.stem
        if path.is_file():
            _on_path(str(path.parent))
        elif not _shipped(module_name, path.name):
            raise ValueError(f"{ref!r}: no such file {path}")
    else:
        module_name = where
        _on_path(os.getcwd())  # as `python train.py` run here would find it
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any way the user's module fails to import
        raise ValueError(f"{ref!r}: cannot import {module_name!r} "
                         f"({type(e).__name__}: {e})") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{ref!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) "
                         f"has no {attr!r}") from None


def _shipped(module_name: str, file_name: str) -> bool:
    """Whether `module_name` is importable from a file called `file_name`: a module Ray
    shipped to this node (`shipped_modules`) for a path that exists only on the driver's."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    return spec is not None and Path(spec.origin or "").name == file_name


def shipped_modules(refs: Sequence[str]) -> list[str]:
    """The files or package directories of the user modules `refs` name (Ray's runtime_env
    `py_modules`): what a Ray cluster's actors need to import them. Installed packages (in
    site-packages) are left out: a cluster has its own environment."""
    out: list[str] = []
    for ref in refs:
        load_ref(ref)  # on sys.path as the actors will look for it, and it imports
        where = ref.rpartition(":")[0]
        name = Path(where).stem if where.endswith(".py") or os.sep in where else where
        spec = importlib.util.find_spec(name.partition(".")[0])
        if spec is None or spec.origin is None or spec.name == "locojax":
            continue  # (locojax is on every node that runs it)
        origin = Path(spec.origin).resolve()
        if any(origin.is_relative_to(d) for d in installed_dirs()):
            continue  # the standard library or an installed package
        path = str(origin.parent if spec.submodule_search_locations else origin)
        if path not in out:
            out.append(path)
    return out


def installed_dirs() -> list[Path]:
    """Where this interpreter's standard library and installed packages live."""
    import sysconfig

    return [Path(sysconfig.get_paths(vars=v)[k]).resolve()
            for v in ({}, {"base": sys.base_prefix, "platbase": sys.base_prefix})
            for k in ("stdlib", "platstdlib", "purelib", "platlib")]


def _on_path(directory: str) -> None:
    # Spawned reward workers start with the parent's sys.path, so this reaches them too.
    if directory not in sys.path:
        sys.path.insert(0, directory)


# ---------------------------------------------------------------------------------------------
# TRL-signature rewards.

_FUNCTIONS: dict[str, Any] = {}  # ref -> function, per process (workers import once)


def _function(ref: str):
    if ref not in _FUNCTIONS:
        fn = load_ref(ref)
        if not callable(fn):
            raise ValueError(f"reward {ref!r} is a {type(fn).__name__}, not a function")
        _FUNCTIONS[ref] = fn
    return _FUNCTIONS[ref]


@dataclasses.dataclass(frozen=True)
class TRLReward:
    """A reward with TRL's signature, as locojax's `(completion, example) -> float | None`.

    Pickles as its reference, so a worker process imports the user's module itself."""

    ref: str
    """`module:function` or `file.py:function`."""
    name: str
    """The metric name (`reward/<name>/mean`): the function's name, as TRL logs it."""

    abstains = True
    """`None` from this reward means "does not apply" (`rewards.RewardRunner`)."""

    def __call__(self, completion: str, example: Example) -> float | None:
        fn = _function(self.ref)
        where = f"reward {self.name} ({self.ref}) on row {example.id}"
        prompt = example.prompt
        if isinstance(prompt, str):
            prompts, completions = [prompt], [completion]
        else:  # conversational, as TRL gives it
            prompts = [[dict(m) for m in prompt]]
            completions = [[{"role": "assistant", "content": completion}]]
        columns = {k: [v] for k, v in example.meta.items()
                   if k not in ("prompts", "completions")}
        out = fn(**_accepted(fn, {**columns, "prompts": prompts, "completions": completions}))
        if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
            raise RewardValueError(f"{where}: returned {_kind(out)}, not a list of one value "
                                   "per completion")
        if len(out) != 1:
            raise RewardValueError(f"{where}: returned {len(out)} values for 1 completion")
        value = out[0]
        if value is None:
            return None
        if isinstance(value, (str, bytes)):  # float("0.5") would pass; TRL would not
            raise RewardValueError(f"{where}: returned the {type(value).__name__} "
                                   f"{value[:40]!r}, not a number")
        try:
            return check_reward(value)
        except RewardValueError as e:
            raise RewardValueError(f"{where}: {e}") from None


def _kind(value: Any) -> str:
    return type(value).__name__


def _accepted(fn, columns: dict[str, list]) -> dict[str, list]:
    """The arguments `fn` can take: all of them if it has `**kwargs`, else those it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: give it everything
        return columns
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return columns
    names = {p.name for p in params}
    return {k: v for k, v in columns.items() if k in names}


def rewards(refs: Sequence[str], weights: Sequence[float] = (), builtin: Reward | None = None
            ) -> Reward:
    """The weighted sum of TRL-signature rewards named by `refs` (weights default to 1),
    each imported now so that a typo stops the run before any work; plus `builtin` (a
    task's own reward, e.g. GSM8K's flexible correctness) at weight 1 if given."""
    if weights and len(weights) != len(refs):
        raise ValueError(f"--task.reward-weights has {len(weights)} weights for {len(refs)} "
                         "rewards")
    for w in weights:
        if not math.isfinite(w):
            raise ValueError(f"--task.reward-weights must be finite, got {w}")
    names = []
    for ref in refs:
        fn = _function(ref)
        name = getattr(fn, "__name__", None) or ref.rpartition(":")[2]
        names.append(name)
    names = [ref if names.count(n) > 1 else n for n, ref in zip(names, refs)]
    terms = [(TRLReward(ref, name), float(w))
             for ref, name, w in zip(refs, names, weights or [1.0] * len(refs))]
    if builtin is not None:
        terms.insert(0, (builtin, 1.0))
    return combine_rewards(terms) if len(terms) > 1 or terms[0][1] != 1.0 else terms[0][0]


# ---------------------------------------------------------------------------------------------
# The `data` task: rows of any dataset, prompts from one column, user rewards.


def _prompt(value: Any, field: str):
    """A prompt column's value: text, or TRL's conversational list of messages."""
    from locojax.envs.data import RowError

    if isinstance(value, str):
        if not value.strip():
            raise RowError(f"field {field!r} is empty")
        return value
    if not isinstance(value, list) or not value:
        raise RowError(f"field {field!r} should be text or a non-empty list of messages, got "
                       f"{type(value).__name__}")
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise RowError(f"field {field!r}: message {i} should be "
                           "{'role': str, 'content': str}, got " f"{m!r:.80}")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def load(source: str, prompt_field: str = "prompt", answer_field: str = "answer",
         split: str = "train", skip_invalid: bool = False, limit: int | None = None):
    """Examples of a jsonl/parquet file, a `datasets` directory or a hub name; every column
    but the prompt goes to `Example.meta` (the reward's keyword arguments)."""
    from locojax.envs.data import load_examples

    def convert(row, ex_id: str) -> Example:
        answer = row.get(answer_field)
        meta = {k: v for k, v in row.items() if k != prompt_field}
        return Example(ex_id, _prompt(row[prompt_field], prompt_field),
                       "" if answer is None else str(answer), meta=meta)

    return load_examples(source, convert, {prompt_field: (str, list)},
                         skip_invalid=skip_invalid, limit=limit, split=split)


def task(data: str, reward: Sequence[str], test_data: str = "", prompt_field: str = "prompt",
         answer_field: str = "answer", reward_weights: Sequence[float] = (),
         split: str = "train", test_split: str = "test", skip_invalid: bool = False,
         builtin: str = "", format_weight: float = 0.0) -> Task:
    """The `data` task: `data` (and `test_data`, default: `data`'s `test_split` if it has
    one, else `data` itself) scored by the rewards `reward` names; `builtin` (strict,
    flexible): GSM8K's correctness on the answer column next to them, and its format reward
    at `format_weight`."""
    from locojax.envs.data import has_split

    if not reward:
        raise ValueError("task 'data' needs --task.reward module:function (a TRL-style "
                         "reward; repeat it for several)")
    own = None
    if builtin:
        from locojax.envs import gsm8k

        own = gsm8k.reward(builtin, format_weight)
    fn = rewards(reward, reward_weights, own)
    train = load(data, prompt_field, answer_field, split, skip_invalid)
    if test_data:
        test = load(test_data, prompt_field, answer_field, test_split, skip_invalid)
    elif test_split != split and has_split(data, test_split):
        test = load(data, prompt_field, answer_field, test_split, skip_invalid)
    else:
        test = train
    return Task(name="data", train=train.examples, test=test, reward=fn)


# ---------------------------------------------------------------------------------------------
# `--task.name module:function`.

OPTIONS = ("seed", "data", "test_data", "level", "train_size", "template", "max_turns",
           "skip_invalid")
"""What a user task function may declare, by name, to receive from the run's config."""


def user_task(ref: str, options: dict[str, Any], reward: Sequence[str] = (),
              reward_weights: Sequence[float] = (), prompt_field: str = "prompt",
              answer_field: str = "answer", split: str = "train",
              test_split: str = "test") -> Task:
    """The task `ref`'s function makes, called with the `OPTIONS` it names.

    It returns a `Task`, or a `MultiTurnEnv` (then the function is the env factory of a
    multi-turn task over `--task.data`). `reward` refs replace a single-turn task's reward."""
    make = load_ref(ref)
    if not callable(make):
        raise ValueError(f"--task.name {ref!r} is a {type(make).__name__}, not a function")
    try:
        params = inspect.signature(make).parameters
    except (TypeError, ValueError):
        params = {}
    made = make(**{k: v for k, v in options.items() if k in params and k in OPTIONS})
    # A Task, or the first env of the factory.
    if isinstance(made, Task):
        if reward:
            if made.multi_turn:
                raise ValueError(f"task {ref!r} is multi-turn: its env scores it, so "
                                 "--task.reward does not apply")
            made = dataclasses.replace(made, reward=rewards(reward, reward_weights))
        return made
    if isinstance(made, MultiTurnEnv):
        if reward:
            raise ValueError(f"task {ref!r} makes a multi-turn env, which scores itself: "
                             "--task.reward does not apply")
        if not options.get("data"):
            raise ValueError(f"task {ref!r} makes a multi-turn env: give its rows with "
                             "--task.data FILE")
        data = options["data"]
        train = load(data, prompt_field, answer_field, split, options.get("skip_invalid", False))
        test = (load(options["test_data"], prompt_field, answer_field, test_split,
                     options.get("skip_invalid", False)) if options.get("test_data") else train)
        factory = functools.partial(make, **{k: v for k, v in options.items()
                                             if k in params and k in OPTIONS})
        return Task(name=ref, train=train.examples, test=test, reward=_scored_by_env,
                    make_env=factory, max_turns=options.get("max_turns") or 4)
    raise ValueError(f"--task.name {ref!r} returned a {type(made).__name__}; it must return "
                     "a locojax.envs.base.Task or a MultiTurnEnv")


def _scored_by_env(completion: str, example: Example) -> float:
    raise RuntimeError("a multi-turn user task is scored by its env's steps")
