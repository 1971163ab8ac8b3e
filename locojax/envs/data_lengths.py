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

Sized: splits of rows (a `data.Dataset`, a tuple or list a user task returns), every row.
A generated split (arith: lazily drawn, 100,000 rows) that declares its `widest` examples,
the longest prompts its generator can draw by construction, is sized from those and a probe
of its first `PROBE` drawn rows, which checks the declaration under the run's tokenizer:
encoding every drawn row took 4.5 s at every start of the demo and 24 s with SmolLM2's chat
template (2026-12-04, shared 2-core machine), against milliseconds. Its rows cannot be
skipped: one over an explicit P is refused. Any other lazy split (a user's own sequence) is
encoded whole for `auto` only. Multi-turn tasks take their first prompt from the env's
reset, not the row, so they need an explicit P.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from locojax.envs.base import Example, Task
from locojax.envs.data import MAX_PROBLEMS_KEPT, DataError, Dataset
from locojax.envs.prompt import encode_prompt

AUTO = "auto"
"""`--rollout.max-prompt-tokens auto`: P from the data."""


PROBE = 64
"""Drawn rows of a generated split encoded next to its declared widest ones (`fit`)."""


def bucket(n: int) -> int:
    """The width P for a longest prompt of n tokens: a power of two up to 32, a multiple of
    16 up to 128, then a multiple of 128 (TPU lanes are 128 wide; on any device fewer
    distinct widths mean fewer compiles when the data changes a little). Steps of 16 below
    128 keep the real demo's chat prompts (46 tokens) at the 48 its runs were measured with,
    not 64."""
    if n <= 32:
        return max(8, 1 << max(n - 1, 0).bit_length())
    if n <= 128:
        return -(-n // 16) * 16
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


def _generated(split: Sequence[Example]) -> bool:
    """A lazily generated split that declares its widest prompts (`ProceduralSplit`)."""
    return not isinstance(split, (Dataset, tuple, list)) and bool(getattr(split, "widest", ()))


def _measure(name: str, split: Sequence[Example], tokenizer, asked: int | str, flag: str):
    """The rows `fit` encodes for a split, with their lengths (None: not sized): every row;
    a generated split's widest (for auto, once a probe of drawn rows is checked against
    them); a lazy split without a declaration only for auto."""
    if not _generated(split):
        sized = isinstance(split, (Dataset, tuple, list)) or asked == AUTO
        return _lengths(split, tokenizer) if sized else None
    widest = _lengths(split.widest, tokenizer)
    bound = max((n for _, n in widest if isinstance(n, int)), default=0)
    probe = _lengths(split[:min(PROBE, len(split))], tokenizer) if asked == AUTO else []
    for ex, n in probe:
        if isinstance(n, int) and n > bound:
            raise DataError(f"the {name} split's generator declares its longest prompts "
                            f"{bound} tokens, but {ex.id} has {n} with this tokenizer (one "
                            f"that tokenizes digits unevenly?); give {flag} a number")
    return widest


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
    measured = {name: _measure(name, split, tokenizer, asked, flags[0])
                for name, split in splits.items()}
    measured = {name: rows for name, rows in measured.items() if rows is not None}
    fits = [n for rows in measured.values() for _, n in rows if isinstance(n, int)]
    width = bucket(max(fits, default=1)) if asked == AUTO else int(asked)
    bad = {name: {i: f"{ex.id}: {_problem(n, width, flags[0])}"
                  for i, (ex, n) in enumerate(rows) if _problem(n, width, flags[0])}
           for name, rows in measured.items()}
    # One row in both splits (eval's, a file given as both) is one problem.
    problems = list(dict.fromkeys(why for rows in bad.values() for why in rows.values()))
    generated = [name for name in bad if bad[name] and _generated(splits[name])]
    if generated:  # its rows are drawn as the run goes: none can be skipped
        raise DataError(f"{next(iter(bad[generated[0]].values()))}, the longest prompt the "
                        f"generated {generated[0]} split can draw; give a wider {flags[0]} "
                        "or auto")
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
