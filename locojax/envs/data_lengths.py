"""Prompt lengths from the data: every prompt encoded once, before any work.

The engine pads every prompt to one width P (`rollout.max_prompt_tokens`), a compiled
shape. `fit` encodes each prompt of a task's data splits with the run's tokenizer (and chat
template) at start-up, so that:

- `auto` sizes P from the data: the longest prompt, rounded up to a bucket (`bucket`), so
  a user never guesses it, and a slightly different data file keeps the same compiled shape;
- with an explicit P, a prompt longer than P is refused before step 1, naming its row
  (`file:line`) and its length, never cut: a truncated question trains on a prompt the
  model never saw whole. With `skip_invalid` it is skipped and counted instead;
- a prompt the tokenizer cannot encode (a character outside the shipped char vocabulary)
  is refused (or skipped) the same way, at start-up rather than at the step that draws it,
  which on several hosts used to stop one host mid-run.

Sized: splits of rows (a `data.Dataset`, a tuple or list a user task returns). Generated
splits (arith, calc: lazily made, 100,000 rows) are sized only for `auto`: their generator
is the package's, and encoding them all costs seconds at every start. Multi-turn tasks take
their first prompt from the env's reset, not the row, so they need an explicit P.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from locojax.envs.base import Example, Task
from locojax.envs.data import MAX_PROBLEMS_KEPT, DataError, Dataset
from locojax.envs.prompt import encode_prompt

AUTO = "auto"
"""`--rollout.max-prompt-tokens auto`: P from the data."""


def bucket(n: int) -> int:
    """The width P for a longest prompt of n tokens: a power of two up to 128, then a
    multiple of 128 (TPU lanes are 128 wide; on any device fewer distinct widths mean fewer
    compiles when the data changes a little)."""
    if n <= 128:
        return max(8, 1 << max(n - 1, 0).bit_length())
    return -(-n // 128) * 128


@dataclasses.dataclass(frozen=True)
class Sized:
    """What `fit` found: the width, where it came from, and what it refused or skipped."""

    max_prompt_tokens: int
    """P: the explicit width, or `bucket(longest)` for auto."""
    longest: int
    """Tokens of the longest prompt that fits (0: no split was sized)."""
    longest_id: str
    """Its row (`file:line`)."""
    skipped: int = 0
    """Rows skipped (skip_invalid): over P, or not encodable."""

    def describe(self, asked: int | str) -> str:
        """One line for the start-up log."""
        if not self.longest_id:
            return f"max_prompt_tokens={self.max_prompt_tokens}"
        how = (f"auto: longest prompt {self.longest} tokens ({self.longest_id}), rounded up"
               if asked == AUTO else f"longest prompt {self.longest} tokens ({self.longest_id})")
        skipped = f"; skipped {self.skipped} rows" if self.skipped else ""
        return f"max_prompt_tokens={self.max_prompt_tokens} ({how}){skipped}"


def _sized(split: Sequence[Example], asked: int | str) -> bool:
    return isinstance(split, (Dataset, tuple, list)) or asked == AUTO


def _lengths(split: Sequence[Example], tokenizer) -> list[tuple[Example, int | str]]:
    """Each example with its prompt's length, or the reason it cannot be encoded."""
    out = []
    for ex in split:
        try:
            out.append((ex, len(encode_prompt(tokenizer, ex))))
        except Exception as e:  # noqa: BLE001 - a tokenizer or template error names its row
            out.append((ex, f"the tokenizer cannot encode its prompt ({type(e).__name__}: "
                            f"{str(e)[:200]})"))
    return out


def fit(task: Task, tokenizer, max_prompt_tokens: int | str, skip_invalid: bool = False,
        flags: tuple[str, str] = ("--rollout.max-prompt-tokens", "--task.skip-invalid")
        ) -> tuple[Task, Sized]:
    """`task` with every prompt encoded: P resolved (auto), rows over P or not encodable
    refused (DataError naming the first, with the count) or, with `skip_invalid`, dropped
    from their split and counted. `flags`: the command's spelling of the width and skip
    options, for the messages."""
    asked = max_prompt_tokens
    if task.multi_turn:
        if asked == AUTO:
            raise ValueError(f"task {task.name!r} is multi-turn: its first prompt comes from "
                             f"its env, so {flags[0]} auto cannot size it; "
                             "give a number")
        return task, Sized(int(asked), 0, "")
    splits = {"train": task.train, "test": task.test}
    if splits["test"] is splits["train"]:
        del splits["test"]
    measured = {name: _lengths(split, tokenizer) for name, split in splits.items()
                if _sized(split, asked)}
    fits = [n for rows in measured.values() for _, n in rows if isinstance(n, int)]
    width = bucket(max(fits, default=1)) if asked == AUTO else int(asked)
    bad = {name: {i: f"{ex.id}: {_problem(n, width, flags[0])}"
                  for i, (ex, n) in enumerate(rows) if _problem(n, width, flags[0])}
           for name, rows in measured.items()}
    # One row in both splits (eval's, a file given as both) is one problem.
    problems = list(dict.fromkeys(why for rows in bad.values() for why in rows.values()))
    if problems and not skip_invalid:
        more = f" (and {len(problems) - 1} more rows)" if len(problems) > 1 else ""
        raise DataError(f"{problems[0]}{more}; {flags[1]} skips such rows and counts them"
                        + ("" if asked == AUTO else f", {flags[0]} auto sizes P from the "
                           "data"))
    kept = [(ex, n) for rows in measured.values() for ex, n in rows
            if isinstance(n, int) and n <= width]
    longest_ex, longest = max(kept, key=lambda x: x[1], default=(None, 0))
    replaced = {name: _without(splits[name], reasons) for name, reasons in bad.items()
                if reasons}
    if "train" in replaced and "test" not in splits:
        replaced["test"] = replaced["train"]
    for name, split in replaced.items():
        if not len(split):
            raise DataError(f"every row of the {name} split was skipped; the first: "
                            f"{split.problems[0]}")
    sized = Sized(width, longest, longest_ex.id if longest_ex is not None else "",
                  len(problems))
    return dataclasses.replace(task, **replaced), sized


def _problem(n: int | str, width: int, flag: str) -> str:
    """Why a prompt of length `n` (or an encoding error) cannot run at width P; "" if it can."""
    if isinstance(n, str):
        return n
    return f"its prompt has {n} tokens, more than {flag}={width}" if n > width else ""


def _without(split: Sequence[Example], reasons: dict[int, str]) -> Dataset:
    """`split` less the examples `reasons` names (by index), each counted in `skipped` and
    its reason kept with the split's own (the first `MAX_PROBLEMS_KEPT`)."""
    keep = tuple(ex for i, ex in enumerate(split) if i not in reasons)
    dropped = tuple(reasons.values())
    if isinstance(split, Dataset):
        return dataclasses.replace(split, examples=keep, skipped=split.skipped + len(dropped),
                                   problems=(split.problems + dropped)[:MAX_PROBLEMS_KEPT])
    return Dataset(keep, skipped=len(dropped), problems=dropped[:MAX_PROBLEMS_KEPT])
