"""Step time per coordination mode, from the phase equations (`phases.py`).

Synchronous modes: the step is the sum of its phases on the critical path.
- colocated (LoCoJAX-CO): every host admits, generates and scores its own B/H prompts, then
  one data-parallel update over all chips; the step waits for the longest row of all R.
- controller (Pathways, verl's driver; issue 24): one controller admits every prompt, sends
  each host its rows, runs the decode loop in rounds of `decode_chunk` iterations (a round
  trip each), gathers, detokenizes and scores all R rows, builds and scatters the batch;
  then the hosts train as in colocated. Host work is central, bytes cross its NIC.
- single: one process drives every local device, host work for all rows in it, no
  cross-process collective (one host only; on cpu-here, N simulated devices).
The buffered modes (disaggregated, async) run the discrete-event simulation (`placement.py`).

Where every simulated host is a process on one machine (`shared_cores`: cpu-here, here), N
concurrent processes get cores / N each, and every host's env processes share them too.
"""

from __future__ import annotations

import dataclasses
import math

from locojax.predict.phases import Ctx

DEVICE = ("prefill", "decode", "extend", "train")
HOST = ("admission", "env", "detokenize_reward", "batch", "dispatch", "other")
NETWORK = ("allreduce", "collectives", "tp_comm", "dispatch_latency", "gather", "scatter",
           "weight_sync")


@dataclasses.dataclass
class Prediction:
    """One mode's predicted step: phases on the critical path (seconds) and their sum."""

    mode: str
    layout: str
    phases: dict[str, float]
    staleness: list[float] | None = None  # share of samples at staleness 0..k
    wait: float = 0.0  # learner idle per step (buffered modes)
    notes: list[str] = dataclasses.field(default_factory=list)
    step_override: float | None = None  # buffered modes: the simulation's step time

    @property
    def step(self) -> float:
        if self.step_override is not None:
            return self.step_override
        return sum(self.phases.values())

    def share(self, names) -> float:
        return sum(self.phases.get(n, 0.0) for n in names) / self.step if self.step else 0.0

    @property
    def shares(self) -> dict[str, float]:
        """compute / host / network shares of the step (the paper's split)."""
        return {"compute": self.share(DEVICE), "host": self.share(HOST),
                "network": self.share(NETWORK)}


def cores_each(ctx: Ctx, processes: float) -> float:
    """Cores per busy process: shared cores split N ways on cpu-here, else the host's own."""
    if ctx.cluster.shared_cores:
        return ctx.cluster.shared_cores / max(processes, 1.0)
    return float(ctx.cluster.hw.host_cores.value)


def rollout_phases(ctx: Ctx, prompts: float, rows: float, chips: float, steps: float,
                   cores: float, host_cores: float) -> dict[str, float]:
    """A host's rollout phases for its prompts/rows (device phases on `cores` per process,
    host phases and env on `host_cores`)."""
    decode = ctx.decode(rows, chips, steps, cores)
    groups = max(1.0, chips / ctx.model_parallel())
    tp = ctx.waves * ctx.wl.turns * steps * ctx.tp_comm(rows / groups / ctx.waves,
                                                        ctx.model_parallel())
    return {"admission": ctx.admission(prompts, host_cores),
            "prefill": ctx.prefill(prompts, chips, cores),
            "decode": decode - tp, "tp_comm": tp,
            "extend": ctx.extend(rows, chips, cores),
            "env": ctx.env(rows, host_cores),
            "detokenize_reward": ctx.reward(rows, host_cores),
            "batch": ctx.batch(rows, host_cores)}


def train_phases(ctx: Ctx, rows_per_host: float, chips_per_host: float, chips: int,
                 hosts: int, cores: float) -> dict[str, float]:
    """A learner host's train phases: its rows' update on its chips (`cores` per process),
    and the gradient all-reduce over all `chips` of `hosts` hosts (ICI, then DCN): the part
    the compute does not hide (`Ctx.exposed_collectives`); each epoch trains every row once,
    and every mini-batch ends in an all-reduce."""
    ici, dcn = ctx.train_network(chips, hosts)
    train = ctx.epochs * ctx.train_compute(rows_per_host, chips_per_host, cores)
    comm = ctx.epochs * ctx.minibatches * (ici + dcn)
    return {"train": train, "allreduce": ctx.exposed_collectives(comm, train)}


def central_host(ctx: Ctx) -> dict[str, float]:
    """The host phases of all the step's rows in one process (single, the controller): on a
    whole core, its env processes on the whole machine where the hosts share one."""
    wl = ctx.wl
    return {"admission": ctx.admission(wl.prompts, 1.0),
            "env": ctx.env(wl.rows, ctx.cluster.shared_cores or 1.0),
            "detokenize_reward": ctx.reward(wl.rows, 1.0), "batch": ctx.batch(wl.rows, 1.0)}


def colocated(ctx: Ctx) -> Prediction:
    cl, wl = ctx.cluster, ctx.wl
    h = cl.hosts
    per_host = min(cl.chips, cl.chips_per_host)
    c = cores_each(ctx, h)
    steps = wl.decode_steps(wl.rows)  # the step waits for the longest row of any host
    ph = rollout_phases(ctx, wl.prompts / h, wl.rows / h, per_host, steps, c, c)
    ph.update(train_phases(ctx, wl.rows / h, per_host, cl.chips, h, c))
    ph["collectives"] = ctx.small_collectives(h, 2)  # metric sums, non-finite flags
    ph["other"] = ctx.step_fixed(c)
    return Prediction("colocated", cl.describe(), ph)


def single(ctx: Ctx) -> Prediction:
    cl, wl = ctx.cluster, ctx.wl
    if cl.hosts > 1 and not cl.shared_cores:
        return Prediction("single", cl.describe(), {}, notes=[
            f"single is one process on one host; {cl.chips} chips span {cl.hosts} hosts"])
    n = cl.chips
    c = cores_each(ctx, n)  # N device programs at once in one process
    steps = wl.decode_steps(wl.rows)
    if cl.shared_cores:  # simulated devices: one per "chip", each its share of rows
        ph = rollout_phases(ctx, wl.prompts / n, wl.rows / n, 1, steps, c, c)
        ph["train"] = ctx.train_compute(wl.rows / n, 1, c)
    else:
        ph = rollout_phases(ctx, wl.prompts, wl.rows, n, steps, c, c)
        ph["train"] = ctx.train_compute(wl.rows, n, c)
    ph.update(central_host(ctx))  # all rows in the one process, its devices idle meanwhile
    ici, _ = ctx.train_network(n, 1)
    ph["allreduce"] = 0.0 if cl.shared_cores else ici  # in-process sum on cpu-here
    ph["other"] = ctx.step_fixed(1.0)
    return Prediction("single", cl.describe() + ", one process", ph)


def controller(ctx: Ctx, decode_chunk: int | None = None) -> Prediction:
    """decode_chunk: decode iterations per controller round trip (0: the whole loop; None:
    the run's, `ctx.decode_chunk`)."""
    decode_chunk = ctx.decode_chunk if decode_chunk is None else decode_chunk
    cl, wl = ctx.cluster, ctx.wl
    h = cl.hosts
    per_host = min(cl.chips, cl.chips_per_host)
    # The controller's process waits while the hosts run their device phases (it blocks on
    # their generate and train calls; its own work, scoring and the batch, runs while the
    # hosts wait), so the hosts' device phases share the cores h ways, not h + 1.
    c = cores_each(ctx, h)
    steps = wl.decode_steps(wl.rows)
    ph = rollout_phases(ctx, wl.prompts / h, wl.rows / h, per_host, steps, c, c)
    ph.update(central_host(ctx))  # the hosts wait, the controller's process runs
    rounds = 1 if decode_chunk <= 0 else math.ceil(max(steps, 1.0) / decode_chunk)
    # Per round (the decode rounds, the prefill call, the train call): the controller's
    # dispatch to each host (host orchestration) and a round trip on the wire (network).
    dispatch = h * ctx.c("host.controller_dispatch_s", ctx.rates["controller_dispatch_s"])
    ph["dispatch"] = (rounds + 2) * dispatch
    ph["dispatch_latency"] = (rounds + 2) * 2 * ctx.hw("dcn_latency")
    nic, a = ctx.hw("dcn_bandwidth"), ctx.hw("dcn_latency")
    cols = wl.prompt_columns + wl.response_columns
    ph["scatter"] = (2 * a + wl.prompts * wl.prompt_columns * 4 / nic  # prompts out
                     + wl.rows * cols * 18 / nic)  # batch out: ids, positions, masks, logprobs
    ph["gather"] = a + wl.rows * wl.response_columns * 8 / nic  # tokens and logprobs back
    ph.update(train_phases(ctx, wl.rows / h, per_host, cl.chips, h, c))
    ph["other"] = ctx.step_fixed(1.0)
    chunk = "whole loop" if decode_chunk <= 0 else f"{decode_chunk} iteration(s)"
    return Prediction("controller", f"1 controller + {cl.describe()}, decode dispatch per "
                      f"{chunk}", ph, notes=_dispatch_note(ctx))


def _dispatch_note(ctx: Ctx) -> list[str]:
    """Say so where a dispatch cost measured on this machine is used for another."""
    const = ctx.rates["controller_dispatch_s"]
    if ctx.cluster.hw.is_cpu or const.origin != "measured":
        return []
    return [f"its dispatch, {const.value * 1e6:.0f} us per host per round trip, is a Ray call "
            f"round trip measured on this machine (host_rates.json), not on "
            f"{ctx.cluster.hw.name}'s hosts; benchmarks/paper_report.py compares it with "
            "the value fitted to the paper"]
