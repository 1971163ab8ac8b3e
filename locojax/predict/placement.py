"""Disaggregated (LoCoJAX-DA) and async (RLAX-style) step times by simulation, and the best
placement: the DA rollout fraction f, and async workers and k with the staleness to expect.

Layout (locojax/fleet, `placement.plan`): DA splits H hosts into round(f H) rollout workers
and the rest one learner group; async has `workers` workers and `learner_hosts` learners.
A lease is `per_lease` prompts (default: the largest divisor of B up to B / W, one unit per
worker per step when they divide). Each lease's time is drawn: its decode loop runs to the
longest of its per_lease x G rows, drawn from the workload's completion lengths.
The learner's update trains all R rows over the learner chips, then pushes the new version.
Per lease a fixed dispatch cost is paid (`lease_fixed_s`: a Ray call and its result's
transfer; two DCN latencies plus a controller dispatch where the profile has none), and the
worker's logprob check, a trainer forward over the lease's rows (locojax/fleet).
A lease's env turns are a task of their own, run by the worker's env processes: where the
hosts share one machine they take their share of the cores as processes, beside the
learner's and the other workers' (`phases.env_seconds`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from locojax.predict import simulate
from locojax.predict.modes import Prediction, cores_each, rollout_phases, train_phases
from locojax.predict.phases import Ctx


@dataclasses.dataclass(frozen=True)
class Window:
    """The run simulated and the steps its step time is the median of: `steps` in all, the
    first `skip` and the last left out (bench_placement's steady steps). The default is a
    long run's steady state. A short run differs at its end: its last k steps' leases may
    start k versions early, so those steps' rollouts are already in before the learner
    reaches them, and it trains with the cores to itself. Predicting a given run (the
    validation's 6-step runs) simulates that run's steps."""

    steps: int = 12  # a long run: 12 simulated steps, the first 3 and the last left out
    skip: int = 3

    def __post_init__(self):
        if self.steps < self.skip + 2:
            raise ValueError(f"a window of {self.steps} steps leaves no steady step after "
                             f"skipping {self.skip} and the last")


STEADY = Window()


def per_lease(prompts: int, workers: int) -> int:
    return max(n for n in range(1, max(prompts // workers, 1) + 1) if prompts % n == 0)


def lease_fixed(ctx: Ctx) -> float:
    hw = ctx.cluster.hw
    if "lease_fixed_s" in hw.extra:
        return ctx.c(f"{hw.name}.lease_fixed_s", hw.extra["lease_fixed_s"])
    return 2 * ctx.hw("dcn_latency") + ctx.c("host.controller_dispatch_s",
                                             ctx.rates["controller_dispatch_s"])


def _spec(ctx: Ctx, workers: int, learners: int, k: int, newest: bool, seed: int,
          steps: int) -> tuple[simulate.Spec, dict]:
    cl, wl = ctx.cluster, ctx.wl
    per_host = min(cl.chips, cl.chips_per_host)
    u = ctx.lease_prompts or per_lease(wl.prompts, workers)
    rows = u * wl.group
    fixed = lease_fixed(ctx)
    shared = cl.shared_cores

    env_procs = ctx.env_processes(rows) if shared else 1

    def lease(rng):
        steps_ = min(wl.max_new - 1, max(0.0, float(wl.completion.sample(rng, rows).max()) - 1))

        def seconds(c: float) -> float:
            c = c or cores_each(ctx, 1)
            ph = rollout_phases(ctx, u, rows, per_host, steps_, c, c)
            ph.pop("env")
            return fixed + sum(ph.values()) + ctx.logprob_check(rows, per_host, c)

        def env(c: float) -> float:  # each of the env processes gets c
            return ctx.env(rows, env_procs * c if c else cores_each(ctx, 1))
        then = simulate.Task(env, env_procs) if wl.turns > 1 else None
        return simulate.Task(seconds, 1, then)

    learner_chips = learners * per_host

    def train(rng):
        def seconds(c: float) -> float:
            c = c or cores_each(ctx, 1)
            ph = train_phases(ctx, wl.rows / learners, per_host, learner_chips, learners, c)
            return (sum(ph.values()) + ctx.batch(wl.rows / learners, c)
                    + ctx.small_collectives(learners, 2) + ctx.step_fixed(c))
        return simulate.Task(seconds, learners)

    push = ctx.weight_push(workers)

    def sync(rng):
        return simulate.Task.fixed(push, 1)

    spec = simulate.Spec(steps, wl.prompts // u, workers, k, newest, lease, train, sync,
                         shared_cores=shared, seed=seed)
    return spec, {"per_lease": u, "weight_sync": push}


def buffered(ctx: Ctx, mode: str, workers: int, learners: int, k: int, seed: int = 0,
             window: Window = STEADY) -> Prediction:
    """`disaggregated` (deterministic versions) or `async` (newest) by simulation."""
    spec, info = _spec(ctx, workers, learners, k, mode == "async", seed, window.steps)
    res = simulate.run(spec)
    kept = slice(window.skip, window.steps - 1)
    step = float(np.median(res.step_times()[kept]))
    wait = float(np.median(res.wait[kept]))
    train = float(np.median(res.train_s[kept]))
    phases = {"wait_rollouts": wait, "train": train, "weight_sync": info["weight_sync"]}
    phases["other"] = max(0.0, step - sum(phases.values()))
    layout = (f"{learners} learner host(s) + {workers} rollout worker(s) on "
              f"{ctx.cluster.describe()}, k={k}, {info['per_lease']} prompt(s) per lease")
    return Prediction(mode, layout, phases, staleness=res.staleness_hist(k), wait=wait,
                      step_override=step)


def disaggregated(ctx: Ctx, fraction: float, k: int = 1, seed: int = 0,
                  window: Window = STEADY) -> Prediction:
    h = ctx.cluster.hosts
    workers = int(np.floor(fraction * h + 0.5))
    if workers < 1 or workers >= h:
        return Prediction("disaggregated", f"f={fraction:g} of {h} hosts", {}, notes=[
            f"rollout fraction {fraction:g} of {h} hosts leaves no worker or no learner"])
    p = buffered(ctx, "disaggregated", workers, h - workers, k, seed, window)
    p.notes.append(f"f={fraction:g}")
    return p


def async_(ctx: Ctx, workers: int, learners: int, k: int, seed: int = 0,
           window: Window = STEADY) -> Prediction:
    return buffered(ctx, "async", workers, learners, k, seed, window)


@dataclasses.dataclass
class Advice:
    da: list[tuple[float, Prediction]]
    best_da: tuple[float, Prediction] | None
    asyncs: list[tuple[int, int, Prediction]]
    best_async: tuple[int, int, Prediction] | None


def advise(ctx: Ctx, fractions=(0.25, 0.375, 0.5, 0.625, 0.75, 0.875),
           ks=(1, 2, 4)) -> Advice:
    """Every DA fraction that gives both sides a host, and async with W workers (1 learner
    group of the rest) at each k: the fastest of each."""
    h = ctx.cluster.hosts
    da = [(f, disaggregated(ctx, f)) for f in fractions if 1 <= round(f * h) < h]
    da = [(f, p) for f, p in da if p.phases]
    seen, asyncs = set(), []
    for f in fractions:
        w = int(np.floor(f * h + 0.5))
        if 1 <= w < h and w not in seen:
            seen.add(w)
            asyncs += [(w, k, async_(ctx, w, h - w, k)) for k in ks]
    best_da = min(da, key=lambda x: x[1].step) if da else None
    best_async = min(asyncs, key=lambda x: x[2].step) if asyncs else None
    return Advice(da, best_da, asyncs, best_async)


def predict_modes(ctx: Ctx, only: str | None = None, placement=None) -> list[Prediction]:
    """The step of every mode the cluster can run (`only`: that mode alone), at the run's
    placement settings (a PlacementConfig, or None for its defaults)."""
    from locojax.predict import modes

    cl, preds = ctx.cluster, []
    want = lambda m: only in (None, m)  # noqa: E731
    if want("single") and (cl.hosts == 1 or cl.shared_cores):
        preds.append(modes.single(ctx))
    if want("controller"):
        preds.append(modes.controller(ctx))
    if want("colocated"):
        preds.append(modes.colocated(ctx))
    k = getattr(placement, "max_staleness", 1)
    if cl.hosts >= 2 and want("disaggregated"):
        preds.append(disaggregated(ctx, getattr(placement, "rollout_fraction", 0.75), k))
    if cl.hosts >= 2 and want("async"):
        w = getattr(placement, "workers", max(1, cl.hosts - 1))
        lh = getattr(placement, "learner_hosts", 1)
        if w + lh <= cl.hosts:
            preds.append(async_(ctx, w, lh, k))
    return preds
