"""What crosses from producer to learner: one small typed record (STYLE.md 13).

    RolloutRecord(step, version, batch, stats, token_versions)

- `batch`: the host-local rows of the training batch (numpy `TrainBatch`), prompt-major;
- `token_versions` (async with in-flight updates, `fleet/inflight.py`): [B, T] the version
  that sampled each target token, -1 elsewhere; None: every token is `version`'s;
- `stats`: `RolloutStats`, the sums behind the step's logged rollout metrics. Sums, not
  means, so that a step's units (leased to different workers) and hosts add up exactly
  with `+`, and the metrics are the ratios of the totals (`RolloutStats.metrics`).

The raw rows (texts, per-part rewards) never travel: a producer dumps them where it made
them (`producer.py`, `--dump-rollouts`). A record goes into the checkpoint as numpy arrays
plus JSON (`to_state` / `from_state`), which is how the Ray modes' buffer survives a
restart.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from locojax.rl import logprob_gap
from locojax.rl.batch import SharedPrefix, TrainBatch
from locojax.rollout.multi_turn import EnvStats
from locojax.sums import Sums
from locojax.train.dynamic_sampling import RefillStats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutStats(Sums):
    """Sums over some rows of one step: a leased unit, a host's share, a whole step."""

    rows: float = 0.0
    groups: float = 0.0
    reward: float = 0.0
    correct: float = 0.0  # rows whose reward before any shaping is ≥ 1
    response_tokens: float = 0.0
    zero_std_groups: float = 0.0  # groups whose rewards are all equal (no signal)
    truncated: float = 0.0  # responses cut off at max_new_tokens
    reward_parts: dict[str, float] = dataclasses.field(default_factory=dict)
    reward_errors: float = 0.0
    reward_timeouts: float = 0.0
    env: EnvStats | None = None  # multi-turn tasks
    refill: RefillStats | None = None  # dynamic sampling
    decode_iterations: float = 0.0  # decode-loop iterations the rows took, every call summed
    logprob_gap: float = 0.0  # Σ |sampler − trainer| logprob over the tokens checked ...
    logprob_tokens: float = 0.0  # ... by rollout workers, at each row's own version
    logprob_gap_hist: tuple[float, ...] = ()  # those tokens per |gap| bin (rl/logprob_gap.py)
    # Units whose gap passed the rounding bound: {"version v, step s unit u": its largest
    # gap} and {same key: the bound}; one key per unit, so sums keep each value.
    logprob_gap_past: dict[str, float] = dataclasses.field(default_factory=dict)
    logprob_gap_bounds: dict[str, float] = dataclasses.field(default_factory=dict)
    staleness: tuple[float, ...] = ()  # rows per staleness 0..k (the buffer fills it in)
    token_staleness: tuple[float, ...] = ()  # target tokens per staleness 0..k (likewise)
    units: float = 0.0  # leased units, each with the worker figures below
    pull_bytes: float = 0.0
    pull_seconds: float = 0.0
    worker_seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # StepTimer's

    def zeros(self) -> RolloutStats:
        """The same fields, all 0: a host's share that adds nothing (hosts sum their stats
        with one collective, so every host must hold the same fields)."""
        return jax.tree.map(lambda _: 0.0, self)

    def metrics(self) -> dict[str, float]:
        """The logged metrics, from the stats summed over every host of the step."""
        n = self.rows
        m = {"reward/mean": self.reward / n, "rollout/accuracy": self.correct / n,
             "rollout/response_length/mean": self.response_tokens / n,
             "rollout/frac_zero_std": self.zero_std_groups / self.groups,
             "rollout/frac_truncated": self.truncated / n,
             "reward/errors": self.reward_errors, "reward/timeouts": self.reward_timeouts}
        m.update({f"reward/{k}/mean": v / n for k, v in self.reward_parts.items()})
        m["rollout/decode_iterations"] = self.decode_iterations
        if self.env is not None:
            m.update(self.env.metrics(n))
        if self.refill is not None:
            m.update(self.refill.metrics(self.groups))
        if self.logprob_tokens:
            m["rollout/logprob_mismatch"] = self.logprob_gap / self.logprob_tokens
        if sum(self.logprob_gap_hist):  # the workers' histogram (the learner's: train_step)
            m.update(logprob_gap.quantiles(self.logprob_gap_hist))
            m["rollout/logprob_gap/units_past_bound"] = float(
                sum(v > self.logprob_gap_bounds.get(k, 0.0)
                    for k, v in self.logprob_gap_past.items()))
        if self.staleness:
            counts = np.asarray(self.staleness)
            m["rollout/staleness/mean"] = float(np.arange(len(counts)) @ counts / counts.sum())
            m["rollout/staleness/max"] = float(np.flatnonzero(counts).max())
            m.update({f"rollout/staleness/frac_{s}": c / counts.sum()
                      for s, c in enumerate(self.staleness)})
        if sum(self.token_staleness):  # per token: fresher than its row after a swap
            counts = np.asarray(self.token_staleness)
            m["rollout/token_staleness/mean"] = float(np.arange(len(counts)) @ counts
                                                      / counts.sum())
            m.update({f"rollout/token_staleness/frac_{s}": c / counts.sum()
                      for s, c in enumerate(self.token_staleness)})
        if self.units:  # wall-clock figures of the rollout workers: perf.jsonl
            m["perf/sync/pull_seconds"] = self.pull_seconds
            m["perf/net/weight_sync_pull_bytes"] = self.pull_bytes
            m.update({f"perf/rollout/{k}": v / self.units
                      for k, v in self.worker_seconds.items()})
        return m

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> RolloutStats:
        d = dict(d, staleness=tuple(d["staleness"]),
                 token_staleness=tuple(d.get("token_staleness", ())),
                 logprob_gap_hist=tuple(d.get("logprob_gap_hist", ())))
        if d["env"] is not None:
            d["env"] = EnvStats(**d["env"])
        if d["refill"] is not None:
            d["refill"] = RefillStats(**d["refill"])
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class RolloutRecord:
    """One share (a unit, or a host's rows) of one step's rollouts, ready for the learner."""

    step: int  # the step whose prompts these are
    version: int  # the weight version (learner updates applied) that generated them
    batch: TrainBatch  # host-local numpy rows, prompt-major
    stats: RolloutStats
    token_versions: np.ndarray | None = None  # [B, T] int32, -1 off target; None: `version`

    def share(self, host: int, num_hosts: int) -> RolloutRecord:
        """Host `host` of `num_hosts`'s rows (a contiguous slice of whole groups); the stats
        ride on host 0 and the others get zeros, so that summing over the hosts, as the
        loop does, counts every row once."""
        rows = len(self.batch.tokens)
        lo, hi = host * rows // num_hosts, (host + 1) * rows // num_hosts
        group_id = np.asarray(self.batch.group_id)
        if rows % num_hosts or any(0 < b < rows and group_id[b - 1] == group_id[b]
                                   for b in range(0, rows, rows // num_hosts or 1)):
            raise ValueError(f"{rows} rows of step {self.step} do not split into whole groups "
                             f"over {num_hosts} hosts")
        batch = jax.tree.map(lambda x: x[lo:hi], self.batch)  # shared_prefix is static
        versions = None if self.token_versions is None else self.token_versions[lo:hi]
        return dataclasses.replace(self, batch=batch, token_versions=versions,
                                   stats=self.stats.zeros() if host else self.stats)

    def to_state(self) -> tuple[dict, dict]:
        """(numpy arrays, JSON) for a checkpoint; `from_state` inverts it exactly."""
        arrays = {f.name: getattr(self.batch, f.name) for f in dataclasses.fields(TrainBatch)
                  if f.name != "shared_prefix" and getattr(self.batch, f.name) is not None}
        if self.token_versions is not None:
            arrays["token_versions"] = self.token_versions
        prefix = self.batch.shared_prefix
        return arrays, {"step": self.step, "version": self.version,
                        "stats": self.stats.to_json(),
                        "shared_prefix": prefix and dataclasses.asdict(prefix)}

    @classmethod
    def from_state(cls, arrays: dict, meta: dict) -> RolloutRecord:
        prefix = meta["shared_prefix"] and SharedPrefix(**meta["shared_prefix"])
        arrays = dict(arrays)
        versions = arrays.pop("token_versions", None)
        batch = TrainBatch(**{k: np.asarray(v) for k, v in arrays.items()},
                           shared_prefix=prefix)
        return cls(int(meta["step"]), int(meta["version"]), batch,
                   RolloutStats.from_json(meta["stats"]),
                   None if versions is None else np.asarray(versions, np.int32))
