"""`--mode controller`: the single-controller baseline (Pathways on TPU, verl's Ray driver).

One controller (this process, the Ray driver) and N host actors, each owning its local
devices. The hosts join jax.distributed and run colocated's `Trainer` loop, so the train
step and its all-reduce are colocated's exactly (`controller_host.py`). The data path is
the controller's:

    controller  admit + tokenize every prompt ──► host p: its rows ──┐  one round trip
    host p      prefill + the whole jitted decode loop, its devices  │  per host and
    controller  ◄── gather every host's tokens and logprobs ◄────────┘  generate call
                (--controller.decode-chunk K: K decode iterations per round trip, the
                rows and KV cache staying on the host in between)
                detokenize + score every row, advantages, the global batch
                ──► scatter host p's shard (the step's stats on host 0) ──► hosts train

The controller runs the same `Producer` every mode runs (admission, curation, dynamic
sampling, scoring, advantages), with `HostEngines` as its engine: a generate call sends
host p the p-th contiguous share of the prompts with its global first row, so host p
samples exactly the rows colocated's host p samples, and a run is colocated's bitwise.
The controller's own costs go to host 0 with its shard and into perf.jsonl as
`perf/controller/*`: its phases (admission, prefill = dispatch, decode = wait and gather,
detokenize_reward = central scoring, batch, scatter) and round trips, and its bytes each
way as `perf/net/{dispatch,gather,scatter}_bytes` (`Traffic`).

A host that dies fails the run with its name; the others are then killed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax
import numpy as np
import ray

from locojax.engine.extend import TurnOutput
from locojax.envs.rewards import RewardRunner
from locojax.fleet import driver
from locojax.fleet.actors import host_cpus
from locojax.fleet.controller_host import ControllerHost
from locojax.fleet.faults import Faults
from locojax.model import loader
from locojax.profiler import StepTimer
from locojax.train import meshes, resume
from locojax.train.build import RunParts
from locojax.train.config import RunConfig, check_run

log = logging.getLogger(__name__)


class HostsEnded(Exception):
    """A host's loop ended before the controller's (the run's time limit): nothing is wrong,
    there is nothing more to produce."""


@dataclasses.dataclass
class Traffic:
    """Round trips and bytes of one step's data path, both ways. Bytes are the payload's
    (the numpy arrays sent), not Ray's framing of it."""

    round_trips: int = 0  # calls on a host, each answered (one per host and decode chunk)
    round_trip_s: float = 0.0  # dispatch to answer, summed over the calls
    dispatch_bytes: int = 0  # controller -> hosts: prompt tokens and masks, row limits
    gather_bytes: int = 0  # hosts -> controller: generated tokens, masks, logprobs
    scatter_bytes: int = 0  # controller -> hosts: the training batch's shards

    def metrics(self) -> dict[str, float]:
        return {"perf/controller/round_trips": float(self.round_trips),
                "perf/controller/round_trip_s": self.round_trip_s,
                **{f"perf/net/{k}": float(getattr(self, k))
                   for k in ("dispatch_bytes", "gather_bytes", "scatter_bytes")}}


@dataclasses.dataclass
class _Pending:
    refs: list
    dispatched: float
    prefilled: None = None  # what `single_turn.rollout` syncs on: nothing device-side here


class HostEngines:
    """The engine of the controller's `Producer`: each call runs on every host's devices."""

    def __init__(self, hosts: list, runs: list, model_cfg, decode_chunk: int = 0):
        self.hosts, self.runs, self.model_cfg = hosts, runs, model_cfg
        self.decode_chunk = decode_chunk  # K decode iterations per round trip (0: all)
        self.step = 0  # the step being produced: hosts generate with the params before it
        self.traffic = Traffic()

    def prefill(self, weights, prompts, key, sampling, num_samples: int = 1, prompt_mask=None,
                first_row: int = 0, limits=None) -> _Pending:
        """Dispatch host p's share of the [B, P] prompts (weights: unused, each host uses
        its own params). `limits` (`Engine.prefill`'s, which only benchmarks pass) is not
        sent to the hosts: refused rather than ignored."""
        if limits is not None:
            raise ValueError("the controller's generate does not take per-row limits")
        tokens, mask = np.asarray(prompts, np.int32), np.asarray(prompt_mask, bool)
        n = len(self.hosts)
        if len(tokens) % n:
            raise ValueError(f"{len(tokens)} prompts do not split over {n} hosts")
        share, key_data = len(tokens) // n, np.asarray(jax.random.key_data(key))
        refs = [h.generate.remote(self.step, tokens[p * share:(p + 1) * share],
                                  mask[p * share:(p + 1) * share], key_data,
                                  first_row + p * share * num_samples, sampling, num_samples,
                                  self.decode_chunk)
                for p, h in enumerate(self.hosts)]
        self.traffic.round_trips += n
        self.traffic.dispatch_bytes += tokens.nbytes + mask.nbytes
        return _Pending(refs, time.perf_counter())

    def decode(self, pending: _Pending):
        """Gather every host's rows, in host order: the rows of the whole batch. With a
        decode chunk, every host not yet done is asked for K more iterations per round."""
        parts: dict[int, tuple] = {}
        refs, ids, dispatched = pending.refs, list(range(len(self.hosts))), pending.dispatched
        while refs:
            answers = gather(refs, self.hosts, self.runs, ids)
            self.traffic.round_trip_s += (time.perf_counter() - dispatched) * len(refs)
            parts.update({p: a for p, a in zip(ids, answers) if a is not None})
            ids = [p for p in ids if p not in parts]
            refs = [self.hosts[p].generate_more.remote(self.decode_chunk) for p in ids]
            self.traffic.round_trips += len(refs)
            dispatched = time.perf_counter()
        parts = [parts[p] for p in range(len(self.hosts))]
        self.traffic.gather_bytes += sum(x.nbytes for p in parts for x in p)
        tokens, mask, logprobs = (np.concatenate(xs) for xs in zip(*(p[:3] for p in parts)))
        return _Generation(tokens, mask, logprobs, sum(int(p[3]) for p in parts))


    def conversation(self, sampling, slots: int, stops=(), max_block: int = 64,
                     compact: bool = True) -> HostConversation:
        """Multi-turn rows on the hosts (the `Conversation` interface)."""
        return HostConversation(self, dict(sampling=sampling, slots=slots, stops=tuple(stops),
                                           max_block=max_block, compact=compact))


class HostConversation:
    """`Conversation` over the hosts: host p holds rows [p·R/N, (p+1)·R/N) in a conversation
    on its own engine. `begin` goes to every host; `extend` and `decode` to the hosts whose
    rows they name, each with its rows in the order named, so host p runs exactly the calls
    colocated's host p runs on its own rows. The environment turns between them are the
    controller's (`multi_turn.rollout`, on its pool)."""

    def __init__(self, engines: HostEngines, args: dict):
        self.engines, self.args = engines, args
        self.pending = None  # what `multi_turn.rollout` syncs on: the calls return when done

    def _call(self, calls: dict[int, tuple]) -> dict:
        """{host: result} of `conversation(method, *args)` on each host named."""
        e = self.engines
        refs = [e.hosts[p].conversation.remote(*call) for p, call in calls.items()]
        e.traffic.round_trips += len(refs)
        e.traffic.dispatch_bytes += sum(np.asarray(x).nbytes for call in calls.values()
                                        for x in call[1:] if isinstance(x, np.ndarray))
        start = time.perf_counter()
        out = dict(zip(calls, gather(refs, e.hosts, e.runs, list(calls))))
        e.traffic.round_trip_s += (time.perf_counter() - start) * len(refs)
        return out

    def begin(self, weights, prompt_tokens, prompt_mask, key, num_samples: int = 1,
              first_row: int = 0, limits=None, active=None) -> None:
        tokens, mask = np.asarray(prompt_tokens, np.int32), np.asarray(prompt_mask, bool)
        n = len(self.engines.hosts)
        if len(tokens) % n:
            raise ValueError(f"{len(tokens)} prompts do not split over {n} hosts")
        share = len(tokens) // n
        self.rows = rows = share * num_samples
        limits = np.full(len(tokens) * num_samples, self.args["sampling"].max_new_tokens) \
            if limits is None else np.asarray(limits)
        active = np.ones(len(limits), bool) if active is None else np.asarray(active, bool)
        key_data = np.asarray(jax.random.key_data(key))
        self._call({p: ("begin", self.engines.step, self.args, tokens[p * share:(p + 1) * share],
                        mask[p * share:(p + 1) * share], key_data, num_samples,
                        first_row + p * rows, limits[p * rows:(p + 1) * rows],
                        active[p * rows:(p + 1) * rows]) for p in range(n)})
        self.asked = list(range(len(limits)))  # global rows of the next decode, in order

    def extend(self, rows, keep, appended, limits) -> None:
        by_host: dict[int, list] = {}
        for row, k, app, lim in zip(rows, keep, appended, limits):
            by_host.setdefault(int(row) // self.rows, []).append((int(row) % self.rows, k,
                                                                  list(app), lim))
        self._call({p: ("extend", *map(list, zip(*calls))) for p, calls in by_host.items()})
        self.asked = [int(r) for r in rows]

    def decode(self) -> TurnOutput:
        hosts = sorted({r // self.rows for r in self.asked})
        outs = self._call({p: ("decode",) for p in hosts})
        self.engines.traffic.gather_bytes += sum(o.tokens.nbytes + o.logprobs.nbytes
                                                 for o in outs.values())
        index: dict[int, tuple[int, int]] = {}  # global row -> (host, row of its output)
        for p in hosts:
            mine = [r for r in self.asked if r // self.rows == p]
            index.update({r: (p, i) for i, r in enumerate(mine)})
        at = [index[r] for r in self.asked]
        return TurnOutput(np.stack([outs[p].tokens[i] for p, i in at]),
                          np.stack([outs[p].logprobs[i] for p, i in at]),
                          np.asarray([outs[p].lengths[i] for p, i in at], np.int32),
                          sum(o.steps for o in outs.values()))

    def close(self) -> None:
        self._call({p: ("close",) for p in range(len(self.engines.hosts))})


@dataclasses.dataclass
class _Generation:
    tokens: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    steps: int  # decode-loop iterations, summed over the hosts (as colocated's stats sum)


def gather(refs: list, hosts: list, runs: list, ids: list[int] | None = None) -> list:
    """The results of calls on the hosts, in order; ids: the host of each call (default:
    call i on host i mod N). A host that died, or whose run failed or ended meanwhile,
    stops the controller with the host's name and the run's own error."""
    pending, done = list(refs), {}
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for r in ready:
            try:
                done[r] = ray.get(r)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                _check_runs(runs, wait_s=10.0)  # the run's failure says more than the call's
                i = refs.index(r)
                host = i % len(hosts) if ids is None else ids[i]
                raise RuntimeError(f"controller host {host} failed ({type(e).__name__}): "
                                   f"{e}") from e
        _check_runs(runs)
    return [done[r] for r in refs]


def _check_runs(runs: list, wait_s: float = 0.0) -> None:
    """Raise if a host's loop has ended (waiting up to `wait_s` for the first to end): a
    dead host first, by name; else a failed run, with its error; else `HostsEnded` (the
    run's time limit stopped the hosts early)."""
    ray.wait(runs, num_returns=1, timeout=wait_s)
    ended, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
    found = []
    for r in ended:
        i = runs.index(r)
        try:
            ray.get(r)
            found.append((2, HostsEnded(f"controller host {i} has finished its run"), None))
        except ray.exceptions.RayActorError as e:
            found.append((0, RuntimeError(f"controller host {i} died ({type(e).__name__}); "
                                          "the run stops"), e))
        except ray.exceptions.RayTaskError as e:
            found.append((1, RuntimeError(f"controller host {i}'s run failed: {e}"), e))
    if found:
        _, error, cause = min(found, key=lambda f: f[0])
        raise error from cause


def control(parts: RunParts, hosts: list, runs: list) -> None:
    """The controller's loop: each step's data path, until the last step or the hosts end."""
    cfg = parts.cfg
    engines = HostEngines(hosts, runs, parts.model_cfg, cfg.controller.decode_chunk)
    dump_dir = os.path.join(cfg.run_dir, "rollouts") if cfg.dump_rollouts else None
    runner = RewardRunner(cfg.reward)
    producer = parts.producer(engines, runner, dump_dir)
    first, saved = gather([hosts[0].resume_point.remote()], hosts, runs)[0]
    if saved.get("curation"):
        producer.curator.load_state(saved["curation"])
    b, n = cfg.rollout.prompts_per_step, len(hosts)
    try:
        for step in range(first, cfg.steps):
            timer, engines.step, engines.traffic = StepTimer(), step, Traffic()
            record, feedback = producer.produce(step, None, 0, b, timer)
            with timer.phase("admission"):  # every row's pass counts are here already
                curation = producer.curator.update(feedback.admission, feedback.observations)
            with timer.phase("scatter"):
                shards = [ray.put(record.share(p, n)) for p in range(n)]
            engines.traffic.scatter_bytes += sum(x.nbytes for x in jax.tree.leaves(record.batch))
            metrics = {**curation, **engines.traffic.metrics(),
                       **{f"perf/controller/{k[len('perf/'):]}": v
                          for k, v in timer.finish_step().items()}}
            admission = producer.curator.state()
            gather([h.put.remote(step, shard, admission, metrics if p == 0 else {})
                    for p, (h, shard) in enumerate(zip(hosts, shards))], hosts, runs)
    except HostsEnded as e:
        log.info("controller stops: %s", e)
    finally:
        runner.close()


def check_settings(cfg: RunConfig) -> RunParts:
    """The controller's parts (task, tokenizer, sampling; no weights), after every check
    that needs no Ray, as `driver.check_settings` makes them: the settings, the data and
    model files (the weights by their headers) and whether the run directory's checkpoints
    are of this run. Raises ValueError naming the file or field before any actor starts."""
    if os.environ.get("LOCOJAX_NUM_PROCESSES", "1") not in ("", "1"):
        raise ValueError("mode 'controller' places its own hosts through Ray: run it as one "
                         "process, not under `locojax launch`")
    n = cfg.placement.hosts
    check_run(cfg, n, n * (cfg.devices_per_host or 1))
    parts = RunParts.of(cfg)
    loader.check_weights(cfg.model, parts.model_cfg)
    meshes.check_tp_model(cfg.rollout.tp, parts.model_cfg)  # the hosts' engines
    # The hosts' view of the config (`GroupHost._run`), as their checkpoints hold it.
    resume.check(dataclasses.replace(cfg, run_dir=os.path.abspath(cfg.run_dir),
                                     devices_per_host=cfg.devices_per_host or 1))
    if cfg.controller.decode_chunk and parts.task.multi_turn:
        raise ValueError(f"--controller.decode-chunk runs single-turn tasks so far; task "
                         f"{cfg.task.name!r} is multi-turn (set it to 0)")
    return parts


def run(cfg: RunConfig, faults: Faults = Faults()) -> dict[str, float]:
    """Train `cfg` with a central controller; host 0's final metrics (as `Trainer.run`)."""
    cfg = dataclasses.replace(cfg, run_dir=os.path.abspath(cfg.run_dir))
    parts = check_settings(cfg)
    n, d = cfg.placement.hosts, cfg.devices_per_host or 1
    started = driver.connect(cfg)
    group, hosts = None, []
    try:
        gpus = d if ray.cluster_resources().get("GPU", 0) else 0
        cpus = host_cpus(ray.cluster_resources().get("CPU", 1.0), n, 0)
        print(f"locojax train: controller: 1 controller + {n} host(s) x {d} device(s)",
              flush=True)
        group = driver.gang(n, cpus, gpus, "controller")
        hosts = driver.group_hosts(ControllerHost, group, cpus, gpus)
        coordinator = ray.get(hosts[0].address.remote())
        runs = [h.run.remote(cfg, coordinator, d, faults) for h in hosts]
        control(parts, hosts, runs)
        return driver.first_failure_or_all(runs)[0]
    finally:
        driver.kill(hosts)
        if group is not None:
            ray.util.remove_placement_group(group)
        if started:
            ray.shutdown()
