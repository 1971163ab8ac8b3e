"""The task registry: from a config to a Task, and each task's checks of its config.

| name | kind | needs |
|---|---|---|
| arith | single-turn, procedural | nothing (`level`, `seed`, `train_size`, `test_size`) |
| calc | multi-turn tool use, procedural | nothing (`level`, `seed`, ...) |
| gsm8k | single-turn | `train_path`, `test_path` (HF jsonl/parquet) |
| math | single-turn, boxed answers | `train_path`, `test_path` |
| swe | multi-turn bug fixing in the sandbox | nothing (`level`, ...) or `train_dir`, `test_dir` |
| data | single-turn, any dataset, your rewards | `data`, `reward` (`module:function`, TRL-style) |
| `module:function` | your own task (`envs/user.py`) | what your function declares |

`build(TaskConfig, seed)` is what `locojax train` uses; `make_task(name, **options)` calls a
task module's own `task(...)` with checked options (scripts, tests). Adding a task touches
only `envs/`: its module, and one `Entry` here saying how a `TaskConfig` becomes its options
and what its inputs must satisfy before a run starts. Task modules are imported on demand,
so that, e.g., math-verify (and sympy) load only for math. Your own task and rewards, from
your own code: `locojax/envs/user.py`, docs/your_task.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

from locojax.envs.base import Task


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The workload."""

    name: str = "arith"
    """Task: arith, calc, gsm8k, math, swe, data (any dataset, your --task.reward), or your
    own `module:function` returning a Task or a MultiTurnEnv (docs/your_task.md)."""
    level: int = 3
    """Difficulty level of procedural tasks (arith, calc, swe)."""
    data: str = ""
    """Training data file (jsonl/parquet) for gsm8k / math; for data also a `datasets`
    directory (save_to_disk) or hub name; for swe a directory of your own tasks (layout in
    locojax/envs/swe/tasks.py; empty: generated repositories)."""
    test_data: str = ""
    """Held-out data file for gsm8k / math (default: the training file); swe: a task
    directory (default: none held out for your tasks)."""
    template: str = "plain"
    """Prompt template of gsm8k, math and arith: plain (text), qwen (one user message in
    hand-written ChatML; gsm8k, math) or chat (one user message in the checkpoint's own
    chat template from its
    tokenizer_config.json; stop tokens from its generation_config.json)."""
    autosubmit: bool = False
    """swe: at the env's turn limit, score the repository as if the model had submitted."""
    train_size: int = 100_000
    """Training problems of procedural tasks (arith, calc): a smaller pool is seen for more
    epochs, which is where pass-rate curation has prompts to hold back."""
    skip_invalid: bool = False
    """gsm8k / math: skip malformed rows (and count them) instead of stopping at the first."""
    reward: tuple[str, ...] = ()
    """Correctness reward of gsm8k and arith: strict (the default: the number after `####`)
    or flexible (the last number in the reply, as lm-eval's flexible-extract; for instruct
    models that answer "... = 42"). Or your own rewards with TRL's signature,
    `module:function` or `file.py:function`, several after one flag (data, gsm8k, math,
    arith, your own single-turn task: they replace the task's reward, unless strict or
    flexible is named with them: then the built-in correctness, weight 1, is added to them;
    for data it reads the answer column). One flag, not a repeated one, so that it replaces
    a preset's reward rather than adding to it."""
    reward_weights: tuple[float, ...] = ()
    """Weights of the `module:function` rewards, one each (default: all 1), e.g.
    `--task.reward-weights 1 0.2`."""
    prompt_field: str = "prompt"
    """data: the column holding the prompt: text, or TRL's conversational list of messages
    (rendered with the chat template; --task.template chat: the checkpoint's own)."""
    answer_field: str = "answer"
    """data: the column holding the gold answer (optional; evaluation's accuracy counts a
    total reward >= 1 as correct). Every column but the prompt reaches the reward."""
    split: str = "train"
    """data: the split of a `datasets` source with several (a DatasetDict, a hub name)."""
    test_split: str = "test"
    """data: the held-out split (default source: --task.test-data, else this split of
    --task.data if it has one, else --task.data itself)."""
    format_weight: float = 0.0
    """gsm8k, arith and math: weight of a format reward added to correctness (gsm8k/arith:
    a `#### N` last line; math: a \\boxed answer); 0 = correctness alone."""
    sandbox: str = "auto"
    """Isolation of the model-written code a task runs (swe's tests): auto (namespaces, else
    bubblewrap, else the run refuses to start and says how to get isolation), namespaces,
    bwrap, or none: unisolated, only when named here, announced at start-up
    (docs/security.md)."""

    def __post_init__(self):
        from locojax.envs.sandbox import MODES
        from locojax.envs.user import is_ref

        if isinstance(self.reward, str):  # TaskConfig(reward="flexible") from Python
            object.__setattr__(self, "reward", (self.reward,))
        object.__setattr__(self, "reward", tuple(self.reward))
        object.__setattr__(self, "reward_weights", tuple(float(w) for w in self.reward_weights))
        if self.name not in TASKS and not is_ref(self.name):
            raise ValueError(f"unknown task {self.name!r}; valid tasks: {', '.join(task_names())}"
                             ", or module:function of your own")
        if self.train_size < 1:
            raise ValueError(f"task.train_size must be >= 1, got {self.train_size}")
        bad = [r for r in self.reward if r not in REWARDS and not is_ref(r)]
        if bad:
            raise ValueError(f"task.reward must be one of {', '.join(REWARDS)} or module:function "
                             f"references (several allowed), got {', '.join(self.reward)}")
        if sum(r in REWARDS for r in self.reward) > 1:
            raise ValueError(f"task.reward: {' or '.join(REWARDS)} is one reward; name one, "
                             f"got {', '.join(self.reward)}")
        if self.reward_weights and len(self.reward_weights) != len(self.user_rewards):
            raise ValueError(f"task.reward_weights has {len(self.reward_weights)} weights for "
                             f"{len(self.user_rewards)} module:function rewards")
        if self.format_weight < 0:
            raise ValueError(f"task.format_weight must be >= 0, got {self.format_weight}")
        if self.sandbox not in MODES:
            raise ValueError(f"task.sandbox must be one of {', '.join(MODES)}, got "
                             f"{self.sandbox!r}")


    @property
    def mode(self) -> str:
        """The built-in reward mode (strict unless --task.reward flexible)."""
        return self.reward[0] if self.reward and self.reward[0] in REWARDS else "strict"

    @property
    def builtin_reward(self) -> str:
        """strict or flexible when named in --task.reward (kept next to user rewards), else ""."""
        return next((r for r in self.reward if r in REWARDS), "")

    @property
    def user_rewards(self) -> tuple[str, ...]:
        """The `module:function` rewards, in order."""
        from locojax.envs.user import is_ref

        return tuple(r for r in self.reward if is_ref(r))


REWARDS = ("strict", "flexible")
"""`--task.reward` values (gsm8k, arith)."""


def _procedural(cfg: TaskConfig, seed: int, max_turns: int) -> dict:
    return dict(level=cfg.level, seed=seed, train_size=cfg.train_size)


def _arith(cfg: TaskConfig, seed: int, max_turns: int) -> dict:
    return dict(_procedural(cfg, seed, max_turns), mode=cfg.mode,
                format_weight=cfg.format_weight, template=cfg.template)


def _data_files(cfg: TaskConfig, seed: int, max_turns: int) -> dict:
    return dict(train_path=cfg.data, test_path=cfg.test_data or cfg.data, template=cfg.template,
                skip_invalid=cfg.skip_invalid, format_weight=cfg.format_weight)


def _gsm8k(cfg: TaskConfig, seed: int, max_turns: int) -> dict:
    return dict(_data_files(cfg, seed, max_turns), mode=cfg.mode)


def _swe(cfg: TaskConfig, seed: int, max_turns: int) -> dict:
    # The env's own turn limit follows --multi-turn.max-turns when that is set.
    return dict(level=cfg.level, seed=seed, train_dir=cfg.data or None,
                test_dir=cfg.test_data or None, autosubmit=cfg.autosubmit, sandbox=cfg.sandbox,
                **({"max_turns": max_turns} if max_turns else {}))


def _data(cfg: TaskConfig, seed: int, max_turns: int) -> dict:
    return dict(data=cfg.data, test_data=cfg.test_data, reward=cfg.user_rewards,
                reward_weights=cfg.reward_weights, prompt_field=cfg.prompt_field,
                answer_field=cfg.answer_field, split=cfg.split, test_split=cfg.test_split,
                skip_invalid=cfg.skip_invalid, builtin=cfg.builtin_reward,
                format_weight=cfg.format_weight)


def _no_inputs(cfg: TaskConfig) -> None:
    _reward_is_its_own(cfg)


def _reward_is_its_own(cfg: TaskConfig) -> None:
    """Tasks whose reward takes no options refuse them rather than ignore them."""
    if cfg.name in ("calc", "swe") and (cfg.reward not in ((), ("strict",))
                                        or cfg.format_weight):
        raise ValueError(f"task {cfg.name!r} has its own reward: --task.reward and "
                         "--task.format-weight do not apply")
    if cfg.name == "math" and cfg.builtin_reward == "flexible":
        raise ValueError("task 'math' scores \\boxed answers: --task.reward flexible does not "
                         "apply")
    if cfg.user_rewards and cfg.format_weight and not cfg.builtin_reward:
        raise ValueError("--task.format-weight weighs the built-in format reward; with your "
                         "own rewards, add a format reward as another --task.reward (or name "
                         "strict or flexible with them to keep the built-in ones)")
    if not cfg.user_rewards and cfg.reward_weights:
        raise ValueError("--task.reward-weights weighs module:function rewards; none given")
    _rewards_load(cfg)


def _rewards_load(cfg: TaskConfig) -> None:
    """Import each user reward now: a typo stops the run before any work."""
    from locojax.envs.user import rewards

    if cfg.user_rewards:
        rewards(cfg.user_rewards, cfg.reward_weights)


def _data_inputs(cfg: TaskConfig) -> None:
    from locojax.envs.data import is_hub_name

    if not cfg.data:
        raise ValueError("task 'data' needs --task.data (jsonl, parquet, a datasets directory "
                         "or a hub name)")
    if not cfg.user_rewards:
        raise ValueError("task 'data' needs --task.reward module:function (a TRL-style "
                         "reward; several after one flag)")
    if cfg.format_weight and not cfg.builtin_reward:
        raise ValueError("task 'data' has no format reward of its own: name strict or "
                         "flexible with your rewards for GSM8K's, or add yours as another "
                         "--task.reward")
    for path in (cfg.data, cfg.test_data):
        if path and not Path(path).exists() and not is_hub_name(path):
            raise ValueError(f"data {path!r} does not exist")
    _rewards_load(cfg)


def _files_exist(cfg: TaskConfig) -> None:
    _reward_is_its_own(cfg)
    if not cfg.data:
        raise ValueError(f"task {cfg.name!r} needs --task.data FILE (HF-format jsonl or parquet)")
    for path in (cfg.data, cfg.test_data):
        if path and not Path(path).is_file():
            raise ValueError(f"data file {path!r} does not exist")


def _swe_inputs(cfg: TaskConfig) -> None:
    _reward_is_its_own(cfg)
    for path in (cfg.data, cfg.test_data):
        if path and not Path(path).is_dir():
            raise ValueError(f"swe task directory {path!r} does not exist")
    from locojax.envs.sandbox import SandboxError, default_sandbox

    try:  # swe runs model-written code: no isolation, no run (unless `none` was asked for)
        default_sandbox(cfg.sandbox)
    except SandboxError as e:
        raise ValueError(f"task swe: {e}") from e


@dataclasses.dataclass(frozen=True)
class Entry:
    module: str  # holds `task(**options) -> Task`
    options: Callable[[TaskConfig, int, int], dict]  # (config, seed, max turns) -> options
    check_inputs: Callable[[TaskConfig], None]  # before any work: its files exist, ...


TASKS = {
    "arith": Entry("locojax.envs.tasks.arith", _arith, _no_inputs),
    "calc": Entry("locojax.envs.tasks.calc", _procedural, _no_inputs),
    "gsm8k": Entry("locojax.envs.gsm8k", _gsm8k, _files_exist),
    "math": Entry("locojax.envs.math_boxed", _data_files, _files_exist),
    "swe": Entry("locojax.envs.swe.workload", _swe, _swe_inputs),
    "data": Entry("locojax.envs.user", _data, _data_inputs),
}


def task_names() -> list[str]:
    return sorted(TASKS)


def check(cfg: TaskConfig) -> None:
    """Refuse a task config whose inputs cannot serve a run (ValueError naming them)."""
    if cfg.name in TASKS:
        TASKS[cfg.name].check_inputs(cfg)
        return
    from locojax.envs.user import load_ref  # module:function: it must import

    if cfg.format_weight:
        raise ValueError(f"task {cfg.name!r} is your own: --task.format-weight does not apply")
    if cfg.builtin_reward:
        raise ValueError(f"task {cfg.name!r} is your own: --task.reward takes module:function "
                         "rewards only")
    if not callable(load_ref(cfg.name)):
        raise ValueError(f"--task.name {cfg.name!r} is not a function")
    _rewards_load(cfg)


def build(cfg: TaskConfig, seed: int, max_turns: int = 0) -> Task:
    """The task of a run's config; `max_turns` (multi-turn): the run's turn limit, 0 = the
    task's own default."""
    check(cfg)
    if cfg.name not in TASKS:
        from locojax.envs.user import user_task

        options = dict(seed=seed, data=cfg.data, test_data=cfg.test_data, level=cfg.level,
                       train_size=cfg.train_size, template=cfg.template, max_turns=max_turns,
                       skip_invalid=cfg.skip_invalid)
        return user_task(cfg.name, options, cfg.user_rewards, cfg.reward_weights,
                         cfg.prompt_field, cfg.answer_field, cfg.split, cfg.test_split)
    task = make_task(cfg.name, **TASKS[cfg.name].options(cfg, seed, max_turns))
    if cfg.user_rewards and cfg.name != "data":  # gsm8k, math, arith: their data, your reward
        from locojax.envs.user import rewards

        builtin = task.reward if cfg.builtin_reward else None  # kept next to yours
        task = dataclasses.replace(
            task, reward=rewards(cfg.user_rewards, cfg.reward_weights, builtin),
            format_check=task.format_check if builtin else None)
    return task


def make_task(name: str, **kwargs) -> Task:
    """Build a registered task; unknown names and unknown options are errors that list the
    valid choices."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(task_names())}")
    build_task = importlib.import_module(TASKS[name].module).task
    params = inspect.signature(build_task).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise TypeError(f"task {name!r} got unknown option(s) {unknown}; "
                        f"valid options: {', '.join(params)}")
    missing = [p for p, v in params.items()
               if v.default is inspect.Parameter.empty and p not in kwargs]
    if missing:
        raise TypeError(f"task {name!r} needs {', '.join(missing)}")
    return build_task(**kwargs)
