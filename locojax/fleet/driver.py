"""`locojax train --mode disaggregated | async`: start the actors, supervise, clean up.

    run(cfg) ── plan (checked before anything starts) ── Ray: local cluster or --ray-address
        ├─ ParameterServer (newest K versions)         ├─ Verifier × V (reward pool)
        ├─ RolloutWorker × W (engine on own devices)   ├─ Dispatcher (leases + buffer)
        └─ Learner × L (jax.distributed group running the `Trainer` loop)

Ray restarts a dead worker, verifier or parameter server by itself (`max_restarts=-1`); the
dispatcher and the learner deal with what they lost (leases, versions). A learner host that
dies takes its whole jax.distributed group with it, so the driver kills the survivors,
pauses the dispatcher and starts a new group, which resumes from the newest checkpoint:
the params, optimizer state, buffer, leases and kept versions (at most `MAX_LEARNER_RESTARTS`
times). Every actor this run started is killed when it ends, however it ends; a local
cluster it started is shut down.

Whatever can be checked without Ray is checked before any actor starts (`check_settings`):
the placement, the data and model files (read as every actor would, the weights by their
headers), and whether the run directory's checkpoints are of this run (`train/resume.py`).
A run that the dispatcher stops (a unit that fails every worker, a worker that cannot
start, a version whose bytes do not match) ends in `RunFailed` with its message.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from locojax import distributed
from locojax.fleet.actors import LIGHT_CPUS, forwarded_env, host_cpus
from locojax.fleet.dispatcher import Dispatcher
from locojax.fleet.faults import Faults
from locojax.fleet.learner import Handles, Learner
from locojax.fleet.parameter_server import ParameterServer
from locojax.fleet.placement import PlacementPlan, place
from locojax.fleet.rollout_worker import RolloutWorker
from locojax.fleet.verifier import Verifier
from locojax.model import loader
from locojax.train import meshes, resume
from locojax.train.build import RunParts
from locojax.train.config import RunConfig, check_run

log = logging.getLogger(__name__)

MAX_LEARNER_RESTARTS = 3
PLACEMENT_TIMEOUT_S = 120


class RunFailed(RuntimeError):
    """The run stopped on an error the dispatcher named (its message says where and why)."""


def check_settings(cfg: RunConfig) -> PlacementPlan:
    """Every check that needs no Ray; raises ValueError (or FileNotFoundError) naming the
    file or flag before any actor starts."""
    if os.environ.get(distributed.ENV_NUM_PROCESSES, "1") not in ("", "1"):
        raise ValueError(f"mode {cfg.mode!r} places its own hosts through Ray: run it as one "
                         "process, not under `locojax launch`")
    plan = place(cfg.mode, cfg.placement, cfg.rollout.prompts_per_step, cfg.devices_per_host)
    check_run(cfg, plan.learner_hosts, plan.learner_hosts * plan.devices_per_host)
    # What every actor builds first: the task (its data files), the model's config.json and
    # tokenizer; then the weight files' headers. A bad file fails here, once, not in each
    # actor's constructor while Ray restarts it.
    parts = RunParts.of(cfg)
    loader.check_weights(cfg.model, parts.model_cfg)
    meshes.check_tp_model(cfg.rollout.tp, parts.model_cfg)  # the workers' engines
    # The learner group's view of the config (`GroupHost._run`), as its checkpoints hold it.
    resume.check(dataclasses.replace(cfg, run_dir=os.path.abspath(cfg.run_dir),
                                     devices_per_host=plan.devices_per_host))
    return plan


def run(cfg: RunConfig, faults: Faults = Faults()) -> dict[str, float]:
    """Train `cfg` in a Ray mode; returns learner host 0's final metrics (as `Trainer.run`)."""
    plan = check_settings(cfg)
    cfg = dataclasses.replace(cfg, run_dir=os.path.abspath(cfg.run_dir))
    started = connect(cfg)
    cluster = None
    try:
        _check_cluster(plan)
        print(f"locojax train: {plan.describe()}", flush=True)
        cluster = _Cluster(cfg, plan, faults)
        return cluster.train()
    finally:
        if cluster is not None:
            cluster.stop()
        if started:
            ray.shutdown()


def connect(cfg: RunConfig) -> bool:
    """Join `--ray-address`, or start a local cluster; True if this call started one."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # workers print alike lines: keep them all
    runtime_env = {"env_vars": forwarded_env(), **user_modules(cfg)}
    if ray.is_initialized():  # e.g. a test's cluster
        return False
    if cfg.placement.ray_address:
        ray.init(address=cfg.placement.ray_address, runtime_env=runtime_env,
                 logging_level=logging.WARNING)
        return False
    ray.init(num_cpus=cfg.placement.ray_cpus or os.cpu_count(), include_dashboard=False,
             runtime_env=runtime_env, logging_level=logging.WARNING)
    return True


def user_modules(cfg: RunConfig) -> dict:
    """The runtime_env entry shipping the user's task and reward modules (`--task.name
    mod:fn`, `--task.reward file.py:fn`) to every actor, on any node (`user.shipped_modules`);
    empty when the run names none."""
    from locojax.envs.user import is_ref, shipped_modules

    refs = [*([cfg.task.name] if is_ref(cfg.task.name) else []), *cfg.task.user_rewards]
    modules = shipped_modules(refs)
    return {"py_modules": modules} if modules else {}


def _check_cluster(plan: PlacementPlan) -> None:
    """On a cluster with GPUs every host takes --devices-per-host of them."""
    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus and plan.hosts * plan.devices_per_host > gpus:
        raise ValueError(f"{plan.learner_hosts} learner host(s) + {plan.workers} worker(s) x "
                         f"{plan.devices_per_host} device(s) need "
                         f"{plan.hosts * plan.devices_per_host} GPUs, more than the devices "
                         f"allow: the cluster has {gpus:g}")


class _Cluster:
    """The actors of one run, and the supervision of its learner group."""

    def __init__(self, cfg: RunConfig, plan: PlacementPlan, faults: Faults):
        self.cfg, self.plan, self.faults = cfg, plan, faults
        cpus = ray.cluster_resources().get("CPU", 1.0)
        self.host_cpus = host_cpus(cpus, plan.hosts, plan.verifiers + 2)
        gpus = plan.devices_per_host if ray.cluster_resources().get("GPU", 0) else 0
        self.gpus = gpus
        light = {"num_cpus": LIGHT_CPUS, "max_restarts": -1}
        self.actors, self.learners, self.group = [], [], None
        try:
            self._start(cfg, plan, faults, gpus, light)
        except BaseException:
            self.stop()
            raise

    def _start(self, cfg, plan, faults, gpus, light) -> None:
        self.server = ParameterServer.options(**light).remote(
            plan.schedule.versions_kept, cfg.run_dir, faults)
        # No automatic retries: a call is made again by the pool (verifier.py), elsewhere,
        # and never replayed on the verifier it got stuck on.
        self.verifiers = [Verifier.options(**light, max_task_retries=0).remote(
            i, cfg.reward, cfg.run_dir, faults) for i in range(plan.verifiers)]
        self.workers = [
            RolloutWorker.options(num_cpus=self.host_cpus, num_gpus=gpus, max_restarts=-1,
                                  max_task_retries=0).remote(
                i, cfg, plan.devices_per_host, self.server, self.verifiers, faults,
                plan.verifier_timeout_s, plan.max_attempts)
            for i in range(plan.workers)]
        self.actors = [self.server, *self.verifiers, *self.workers]
        self.dispatcher = Dispatcher.options(num_cpus=LIGHT_CPUS).remote(
            plan, cfg.rollout.prompts_per_step, cfg.steps, self.workers)
        self.actors.append(self.dispatcher)
        self.group = gang(plan.learner_hosts, self.host_cpus, gpus, "learner")

    def train(self) -> dict[str, float]:
        cfg = self.cfg
        for attempt in range(MAX_LEARNER_RESTARTS + 1):
            ray.get(self.dispatcher.pause.remote())
            self.learners = group_hosts(Learner, self.group, self.host_cpus, self.gpus)
            coordinator = ray.get(self.learners[0].address.remote())
            handles = Handles(self.dispatcher, self.server)
            runs = [a.run.remote(cfg, coordinator, handles, self.plan, self.faults)
                    for a in self.learners]
            try:
                return first_failure_or_all(runs)[0]
            except ray.exceptions.RayTaskError:
                stopped = self._stopped()
                if stopped is not None:  # the learners failed because the dispatcher stopped
                    raise RunFailed(stopped) from None
                raise
            except ray.exceptions.RayActorError as e:
                kill(self.learners)
                if attempt == MAX_LEARNER_RESTARTS:
                    raise RuntimeError(f"the learner group died {attempt + 1} times") from e
                log.warning("a learner host died (%s); restarting the learner group from "
                            "the newest checkpoint", type(e).__name__)
                print("locojax train: a learner host died; restarting the learner group from "
                      "the newest checkpoint", flush=True)
                # A restarted group resumes this run's own checkpoints.
                cfg = dataclasses.replace(cfg, checkpoint=dataclasses.replace(
                    cfg.checkpoint, resume=True))
        raise AssertionError("unreachable")

    def _stopped(self) -> str | None:
        try:
            return ray.get(self.dispatcher.failure.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - the dispatcher is gone too: report the learner's
            return None

    def stop(self) -> None:
        if getattr(self, "dispatcher", None) is not None:
            try:
                ray.get(self.dispatcher.stop.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        kill(self.learners + self.actors)
        if self.group is not None:
            remove_placement_group(self.group)


def gang(hosts: int, cpus: float, gpus: int, role: str):
    """A placement group of `hosts` bundles: a jax.distributed group is gang-scheduled, all
    of its hosts or none."""
    group = placement_group([{"CPU": cpus, **({"GPU": gpus} if gpus else {})}] * hosts,
                            strategy="SPREAD")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(f"the cluster cannot place {hosts} {role} host(s) of {cpus} CPU(s) "
                           "each") from None
    return group


def group_hosts(actor_class, group, cpus: float, gpus: int) -> list:
    """One `actor_class` host per bundle of `group` (host i on bundle i)."""
    n = len(group.bundle_specs)
    return [actor_class.options(num_cpus=cpus, num_gpus=gpus, max_restarts=0,
                                scheduling_strategy=PlacementGroupSchedulingStrategy(
                                    group, placement_group_bundle_index=i)).remote(i, n)
            for i in range(n)]


def kill(actors) -> None:
    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def first_failure_or_all(refs: list) -> list:
    """Wait for every ref, but raise as soon as any of them fails (a dead learner host would
    otherwise leave the others blocked in a collective until the heartbeat timeout)."""
    pending, done = list(refs), {}
    while pending:
        # A bounded wait, so the interpreter gets back control every second: a signal
        # (Ctrl-C, a test's timeout) is handled while the run goes on.
        ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for r in ready:
            done[r] = ray.get(r)  # raises the first failure
    return [done[r] for r in refs]
