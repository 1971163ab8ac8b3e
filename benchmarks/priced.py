"""`predict_programs compiled`: the step's device programs costed from the programs the run
compiles, kernel by kernel, on a machine `predict_programs calibrate` measured.

Where the run's hosts are processes on this machine (`single`, or `colocated` under
`locojax launch --hosts N`), its programs can be compiled here: a child process per distinct
host (`price_child.py`) builds the run's parts with its own builder, compiles the step's
programs through the run's memory plan, nothing run, and reads each program's kernels from
its HLO. Each program is then priced by the profile's program model (`kernel_model.py`:
weights fitted to locojax's programs on calibration decoders of other widths) on the cores
its host has: `single`'s N devices are threads of one process, each device's program on
its share of the cores; `colocated`'s hosts are processes, one device each, sharing the
machine's cores as `modes.cores_each` splits them (the cost model has no ρ(k) for their
contention: `predict_probes.py oversub` measures it, and `phases` takes it as `penalty`).

Priced: `reshard`, `prefill` (with the rollout's cache buffer, which the engine makes anew
every step, its fill kernels priced as timed alone), `decode` (the part of the decode
program outside its loop, and its loop's iteration times the iterations the cost model
expects, `Workload.decode_steps`) and `train` (the train step, and the reference pass where
β > 0). The rest stays the cost model's: host work. Where devices or hosts share the
cores, their meetings are priced as `calibrate_lockstep` measured them: a device thread's
wait at the end of every call and decode iteration, the colocated hosts' two host-side
meetings a step (`meetings`) in place of the cost model's small-collective latency, and
their joined train step (`joined`, `calibrate_joined`) in place of its gradient all-reduce.
Where completion lengths are spread, the engine compacts finished rows in waves and runs
later iterations at fewer rows; this prices every iteration at the full batch's rows (an
upper bound), and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import measure
from locojax.predict import modes
from benchmarks.kernel_model import CACHE, GRADIENTS, KernelModel, added
from locojax.predict.modes import Prediction

PRICED = ("reshard", "prefill", "decode", "train")
REPLACED = ("tp_comm", "extend")
"""Model phases inside a priced program: tensor-parallel traffic and extend in the decode."""


def host_argv(argv: list[str], mode: str, hosts: int, prompts: int) -> list[str]:
    """One colocated host's arguments: the run's, with its share of the prompts (the host
    compiles its own rows; the child is one process, not joined to others)."""
    if mode != "colocated" or hosts <= 1:
        return list(argv)
    return [*argv, f"--rollout.prompts-per-step={prompts // hosts}"]


def features(mode: str, argv: list[str], hosts: int, prompts: int, tables: dict,
             tables_all: dict, timeout: float = 1800.0) -> dict[str, dict]:
    """The child's {program: features} of one host of the run, its matmuls priced by the
    tables timed on one core and on all."""
    if mode not in measure.MEASURABLE:
        raise ValueError(f"compiled prices {' and '.join(measure.MEASURABLE)} runs here, "
                         f"not {mode!r}")
    if mode == "colocated" and prompts % hosts:
        raise ValueError(f"compiled: {prompts} prompts per step do not split over {hosts} "
                         "hosts")
    env = {k: v for k, v in os.environ.items() if k not in measure.DROP_ENV}
    env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="locojax_price_") as tmp:
        spec = {"argv": host_argv(measure.child_argv(argv), mode, hosts, prompts),
                "mode": mode, "devices": hosts if mode == "single" else 1,
                "tables": tables, "tables_all": tables_all,
                "out": str(Path(tmp) / "out.json")}
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        done = subprocess.run([sys.executable, "-m", "benchmarks.price_child",
                               str(Path(tmp) / "spec.json")], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError("compiled: the run's programs could not be compiled here; "
                               + (done.stdout + done.stderr)[-3000:])
        return json.loads(Path(spec["out"]).read_text())


PROGRAMS = {"reshard": ("reshard",), "prefill": ("prefill rollout",),
            "decode": ("decode rollout once",), "train": ("train_step", "ref_logprobs")}
"""The programs of each priced phase, by their memory-plan names (`price_child.features_of`;
the engine's rollout shape, not eval's); the decode loop's iteration and the rollout's
cache buffer are priced apart."""


def phases(feats: dict[str, dict], model: KernelModel, iterations: float, cores: float,
           penalty: float = 1.0, devices: int = 1) -> dict[str, float]:
    """Seconds of the priced phases (module docstring) of one host's step; `penalty`, the
    oversubscription ρ of hosts sharing the cores; `devices`, the simulated devices of the
    process, whose threads meet at the end of every call and loop iteration
    (`KernelModel.meeting`, "device_calls")."""
    def cost(kind: str, names: tuple[str, ...], calls: float = 1.0) -> float:
        present = [feats[n] for n in names if n in feats]
        if not present:
            return 0.0
        one = penalty * model.seconds(kind, added(*present), cores)
        return calls * (one + model.meeting("device_calls", devices, one))

    out = {phase: cost("decode_step" if phase == "decode" else phase, names)
           for phase, names in PROGRAMS.items()}
    out["decode"] += cost("decode_step", ("decode rollout iteration",), iterations)
    if CACHE in feats:  # timed alone on one core: a share of one below it
        cache = penalty * feats[CACHE]["seconds"] / min(1.0, cores)
        out["prefill"] += cache + model.meeting("device_calls", devices, cache)
    return out


ROLLOUT = ("admission", "prefill", "decode", "detokenize_reward", "env")
"""The phases between a step's first meeting of hosts and the previous step's last."""


def meetings(ph: dict[str, float], model: KernelModel, hosts: int) -> float:
    """Seconds the colocated hosts' meetings outside the train step add to a step
    (`calibrate_lockstep`): the batch widths' all-gather after the rollout and the metric
    sums' all-gather after the update (the update's own, `joined`)."""
    rollout = sum(ph.get(n, 0.0) for n in ROLLOUT)
    return (model.meeting("process_gather", hosts, rollout)
            + model.meeting("process_gather", hosts, 0.0))


def joined(feats: dict[str, dict], model: KernelModel, hosts: int) -> float:
    """Seconds a colocated host's train step takes joined with the others' over alone
    (`calibrate_joined`: a part per update and one per gradient byte, the all-reduce and the
    waits for the slowest host in it)."""
    return model.meeting("process_update", hosts, feats[GRADIENTS]["bytes"])


def apply(pred: Prediction, priced: dict[str, float], spread: bool) -> Prediction:
    """`pred` with the priced phases in place of the model's (and those inside them,
    `REPLACED`, dropped)."""
    out = {k: v for k, v in pred.phases.items() if k not in REPLACED}
    out.update(priced)
    note = (f"{', '.join(PRICED)}: the run's compiled programs, priced kernel by kernel "
            "(predict_programs compiled)")
    if spread:
        note += "; every decode iteration at the full batch's rows (lengths are spread: the "\
                "engine's later waves run fewer rows, so this is an upper bound)"
    return Prediction(pred.mode, pred.layout, out, pred.staleness, pred.wait,
                      [*pred.notes, note])


def program_model(hw) -> dict:
    """A calibrated profile's `program_model` entry, or a ValueError saying how to get one."""
    entry = hw.extra.get("program_model") if hw.kind == "calibrated" else None
    if not entry:
        raise ValueError("compiled prices programs by a calibrated profile's program model: "
                         "run `python -m benchmarks.predict_programs calibrate --out FILE` "
                         "and pass --hardware FILE")
    KernelModel.of(entry)  # a malformed one is refused here, naming what it lacks
    return entry


def predicted(ctx, mode: str, argv: list[str], prompts: int) -> tuple[Prediction, Prediction]:
    """(the cost model's prediction of the run, the same with its device phases priced from
    its compiled programs)."""
    entry = program_model(ctx.cluster.hw)
    model = getattr(modes, mode)(ctx)
    feats = features(mode, argv, ctx.cluster.chips, prompts, entry["tables"],
                     entry["tables_all"])
    colocated = mode == "colocated"
    cores = modes.cores_each(ctx, ctx.cluster.hosts if colocated else ctx.cluster.chips)
    wl, km = ctx.wl, KernelModel.of(entry)
    devices = 1 if colocated else ctx.cluster.chips
    got = phases(feats, km, wl.decode_steps(wl.rows), cores, devices=devices)
    if colocated and km.lockstep:
        got["train"] += joined(feats, km, ctx.cluster.hosts)
    out = apply(model, got, min(wl.completion.quantiles) < wl.max_new)
    return model, with_meetings(out, km, ctx.cluster.hosts if colocated else devices,
                                colocated)


def with_meetings(pred: Prediction, model: KernelModel, units: int,
                  colocated: bool) -> Prediction:
    """`pred` with the colocated hosts' meetings (`meetings`) in place of the cost model's
    small-collective latency and its gradient all-reduce (in the joined train step,
    `joined`), or a note where the profile measured no lock-step."""
    if units > 1 and not model.lockstep:
        pred.notes.append("the profile measured no lock-step (a profile from before it): "
                          "meetings of devices or hosts unpriced; predict_programs calibrate again")
    elif colocated and units > 1:
        pred.phases.pop("collectives", None)
        pred.phases.pop("allreduce", None)
        pred.phases["lockstep"] = meetings(pred.phases, model, units)
    return pred
