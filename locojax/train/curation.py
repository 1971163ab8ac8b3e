"""Pass-rate curation (RLAX): admit the prompts that still teach something.

A prompt that the policy always solves, or never solves, gives a group of equal rewards and
so no gradient. The curator keeps a running pass rate per training prompt from the rollouts
(`samples`, `solved`: counts that decay by λ = `memory` at each new observation) and holds
back a prompt whose rate is ≥ `too_easy` or ≤ `too_hard`: admission skips it (or admits it
with probability `keep_prob`: down-weighting) for `readmit_after` steps, after which it is
admissible again and re-scored when next drawn. Held prompts wait in a re-admission queue
ordered by release step.

Admission stays exact under resume and on any layout (docs/design.md):
- the table is identical on every host: each host reports the pass counts of its own groups
  (`observations`), the wiring gathers them, and every host folds in all of them sorted by
  (slot, round);
- `admit(step)` reads the table and the data cursor and returns the step's B prompt indices
  without changing anything, so every host computes the same admission and takes its own
  slots; `update(admission, observations)` then moves the cursor past the draws it used;
- the state (table, queue, cursor) is plain JSON in the checkpoint (`state` / `load_state`).
With curation off nothing is ever held, so step s admits draws [s·B, (s+1)·B) of the
stream, exactly what `PromptStream.take` gives, and any step can be admitted in any order.

Observations are int32 rows (global slot, round, prompt index, solved, samples): one per
group a slot used (round 0, and each refill round it took part in; see dynamic_sampling.py).
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from locojax.train.data import PromptStream

OBS_COLUMNS = ("slot", "round", "index", "solved", "samples")
"""The int32 columns of an observation row; slot -1 marks a padding row."""

MAX_SKIPS_PER_SLOT = 16
"""At most this many held draws are skipped per admitted prompt in one step; past that the
step admits what it draws (counted as `curation/forced`), so a table that holds nearly the
whole dataset slows admission down but cannot stall it."""

REFILL_TRIES = 64
"""Random draws a refill tries for a prompt that is not held before it takes the last one."""

_KEEP_SALT, _REFILL_SALT = 0x6B656570, 0x72666C6C  # separate seeded streams: "keep", "rfll"

HIST_EDGES = (0.25, 0.5, 0.75)
HIST_NAMES = ("0", "0-0.25", "0.25-0.5", "0.5-0.75", "0.75-1", "1")
"""Pass-rate histogram bins: exactly 0, the four quarters of (0, 1) (right-closed), exactly 1."""


@dataclasses.dataclass(frozen=True)
class CurationConfig:
    """Pass-rate curation of the training prompts (RLAX): hold back prompts that teach nothing."""

    enabled: bool = False
    """Keep a per-prompt pass rate from the rollouts and hold back extreme prompts."""
    too_easy: float = 1.0
    """Hold back a prompt whose running pass rate is ≥ this (1.0: only always-solved ones)."""
    too_hard: float = 0.0
    """Hold back a prompt whose running pass rate is ≤ this (0.0: only never-solved ones;
    negative: never)."""
    readmit_after: int = 50
    """Steps a held prompt waits in the re-admission queue before it may be drawn again."""
    keep_prob: float = 0.0
    """Probability that a draw of a held prompt is admitted anyway: 0 drops held prompts,
    a value in (0, 1) down-weights them."""
    memory: float = 0.0
    """λ: weight of a prompt's earlier observations in its running pass rate (its counts
    decay by λ at each new observation; 0 = the latest group alone)."""

    def __post_init__(self):
        if not self.too_hard < self.too_easy:
            raise ValueError(f"curation needs too_hard < too_easy, got {self.too_hard} and "
                             f"{self.too_easy}")
        if self.readmit_after < 1:
            raise ValueError(f"curation.readmit_after must be >= 1, got {self.readmit_after}")
        if not 0.0 <= self.keep_prob <= 1.0 or not 0.0 <= self.memory < 1.0:
            raise ValueError(f"curation needs keep_prob in [0, 1] and memory in [0, 1): {self}")


@dataclasses.dataclass(frozen=True)
class Admission:
    """The admission of one step: its B prompt indices and the draws they used."""

    step: int
    indices: tuple[int, ...]  # [B] training-split index of each global slot
    cursor: int  # the first draw of the stream this admission read
    end: int  # one past the last draw it read: the cursor after this step
    skipped: int  # held draws skipped
    forced: int  # held draws admitted because the skip budget ran out


@dataclasses.dataclass(frozen=True)
class Feedback:
    """What a host's share of a step tells the curator: the step's admission and the pass
    counts of the host's groups (`OBS_COLUMNS` rows, slot -1 pads)."""

    admission: Admission
    observations: np.ndarray  # [slots · (1 + refill rounds), 5] int32


class Curator:
    """The pass-rate table, the re-admission queue and the data cursor of one run.

    Every host holds an identical copy (see the module docstring); it is advanced once per
    step by `update`, in step order.
    """

    def __init__(self, cfg: CurationConfig, stream: PromptStream, prompts_per_step: int,
                 seed: int):
        self.cfg, self.stream, self.b, self.seed = cfg, stream, prompts_per_step, seed
        self.step = 0  # the next step to admit
        self.cursor = 0  # the next draw of the stream
        self.samples: dict[int, float] = {}  # prompt index -> decayed sample count
        self.solved: dict[int, float] = {}  # prompt index -> decayed solved count
        self.held: dict[int, int] = {}  # prompt index -> last step it is held back at
        self._queue: list[tuple[int, int]] = []  # heap of (held until, index)

    # --- admission (pure) --------------------------------------------------------------------

    def is_held(self, index: int, step: int) -> bool:
        return self.held.get(index, -1) >= step

    def admit(self, step: int) -> Admission:
        """The prompt indices of step `step`'s B global slots; changes nothing."""
        if not self.cfg.enabled:
            c = step * self.b
            return Admission(step, tuple(self.stream.index(i) for i in range(c, c + self.b)),
                        c, c + self.b, 0, 0)
        if step != self.step:
            raise ValueError(f"curation admits step by step: asked for step {step}, the table "
                             f"is at step {self.step}")
        out: list[int] = []
        c, skipped, forced = self.cursor, 0, 0
        while len(out) < self.b:
            index = self.stream.index(c)
            if self.is_held(index, step) and not self._keep(c):
                if skipped < MAX_SKIPS_PER_SLOT * self.b:
                    skipped, c = skipped + 1, c + 1
                    continue
                forced += 1
            out.append(index)
            c += 1
        return Admission(step, tuple(out), self.cursor, c, skipped, forced)

    def _keep(self, draw: int) -> bool:
        if self.cfg.keep_prob <= 0.0:
            return False
        u = np.random.default_rng([self.seed, _KEEP_SALT, draw]).random()
        return bool(u < self.cfg.keep_prob)

    def refill_index(self, step: int, slot: int, round_: int) -> int:
        """The candidate prompt of global `slot` in refill round `round_` ≥ 1 of `step`:
        a seeded uniform draw from the training split that is not held (with replacement:
        refills do not move the cursor)."""
        rng = np.random.default_rng([self.seed, _REFILL_SALT, step, slot, round_])
        n = len(self.stream.examples)
        index = int(rng.integers(n))
        for _ in range(REFILL_TRIES - 1):
            if not self.is_held(index, step):
                break
            index = int(rng.integers(n))
        return index

    # --- the step's outcome ------------------------------------------------------------------

    def pass_rate(self, index: int) -> float | None:
        n = self.samples.get(index)
        return None if not n else self.solved[index] / n

    def update(self, admission: Admission, observations: np.ndarray) -> dict[str, float]:
        """Advance past `admission` (the step just run) and fold in every host's
        `observations` [n, 5] (padding rows have slot -1). Returns the step's `curation/*`
        metrics."""
        if self.cfg.enabled and admission.step != self.step:
            raise ValueError(f"curation update for step {admission.step}, expected {self.step}")
        self.step, self.cursor = admission.step + 1, admission.end
        if not self.cfg.enabled:
            return {}
        obs = np.asarray(observations, np.int64).reshape(-1, len(OBS_COLUMNS))
        obs = obs[obs[:, 0] >= 0]
        obs = obs[np.lexsort((obs[:, 1], obs[:, 0]))]  # by slot, then round: host order is gone
        lam = self.cfg.memory
        for _, _, index, solved, samples in obs.tolist():
            self.samples[index] = lam * self.samples.get(index, 0.0) + samples
            self.solved[index] = lam * self.solved.get(index, 0.0) + solved
        for index in dict.fromkeys(obs[:, 2].tolist()):  # each prompt once, in slot order
            rate = self.solved[index] / self.samples[index]
            if rate >= self.cfg.too_easy or rate <= self.cfg.too_hard:
                self.held[index] = admission.step + self.cfg.readmit_after
                heapq.heappush(self._queue, (self.held[index], index))
            else:
                self.held.pop(index, None)
        while self._queue and self._queue[0][0] < self.step:  # released: admissible again
            until, index = heapq.heappop(self._queue)
            if self.held.get(index) == until:
                del self.held[index]
        rates = obs[:, 3] / np.maximum(obs[:, 4], 1)
        return {"curation/frac_filtered": admission.skipped / (admission.skipped + self.b),
                "curation/forced": float(admission.forced), "curation/held": float(len(self.held)),
                "curation/table_size": float(len(self.samples)),
                **{f"curation/pass_rate_hist/{k}": v for k, v in histogram(rates).items()}}

    # --- checkpoint --------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able state; floats survive a JSON round trip exactly (repr round-trips)."""
        table = sorted(self.samples)
        held = sorted(self.held)
        return {"step": self.step, "cursor": self.cursor,
                "table": {"index": table, "samples": [self.samples[i] for i in table],
                          "solved": [self.solved[i] for i in table]},
                "held": {"index": held, "until": [self.held[i] for i in held]}}

    def load_state(self, state: dict) -> None:
        self.step, self.cursor = int(state["step"]), int(state["cursor"])
        t, h = state["table"], state["held"]
        self.samples = {int(i): float(x) for i, x in zip(t["index"], t["samples"])}
        self.solved = {int(i): float(x) for i, x in zip(t["index"], t["solved"])}
        self.held = {int(i): int(u) for i, u in zip(h["index"], h["until"])}
        self._queue = sorted((u, i) for i, u in self.held.items())


def histogram(rates: np.ndarray) -> dict[str, float]:
    """Fractions of `rates` in each `HIST_NAMES` bin (all zeros for no rates)."""
    rates = np.asarray(rates, np.float64)
    if rates.size == 0:
        return dict.fromkeys(HIST_NAMES, 0.0)
    inner = (rates > 0) & (rates < 1)
    bins = np.digitize(rates[inner], HIST_EDGES, right=True)  # 0..3 for the quarters
    counts = [np.sum(rates == 0), *[np.sum(bins == q) for q in range(4)], np.sum(rates == 1)]
    return {name: float(c) / rates.size for name, c in zip(HIST_NAMES, counts)}
