"""A run's own programs beside `locojax predict`'s cost model, on this machine: the step's
device phases timed as the run's own code runs them (`measure`: `measure.py`,
`measure_child.py`), or priced from the programs the run compiles here, kernel by kernel
(`compiled`, issue 37's program model: `priced.py`, `price_child.py`, `kernel_model.py`),
each next to the cost model's figure for the same phase.

Both need the machine the run runs on (the programs are built there; the program model is
fitted there, about twelve minutes on 2 cores), so they are a laboratory, not the
prediction `locojax predict` makes before launch (issue 58, which moved them here from
`locojax predict train ... --measure` and `--compiled`). Their validations on pre-registered
held-out points are `benchmarks/validate_heldout.py --method measure|compiled`
(docs/results/predict_validation.md, docs/results/predict_compiled.md).

Usage:
    .venv/bin/python -m benchmarks.predict_programs measure TRAIN_ARGS [--hardware FILE] \
        [--cluster N]
    .venv/bin/python -m benchmarks.predict_programs calibrate --out FILE
    .venv/bin/python -m benchmarks.predict_programs compiled TRAIN_ARGS --hardware FILE \\
        --cluster N

`calibrate` writes `locojax predict calibrate`'s profile with the program model added
(`program_model`: `calibrate_kernels.py`, `calibrate_lockstep.py`, `calibrate_joined.py`).
`measure` and `compiled` take `locojax train`'s arguments, as `locojax predict train` does,
for a single-turn `single` or `colocated` run that fits this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import harness, measure as measure_lib, priced


def beside(model, pred, how: str, done: tuple, inside: tuple) -> list[str]:
    """Each phase of `pred` beside the cost model's (`model`): `how` (timed, priced) for the
    phases in `done`, "inside a ... phase" for those in `inside`, else "model"."""
    out = []
    for name in sorted(set(model.phases) | set(pred.phases), key=lambda k: -pred.phases.get(k, 0)):
        got, est = pred.phases.get(name, 0.0), model.phases.get(name, 0.0)
        said = how if name in done else f"inside a {how} phase" if name in inside else "model"
        out.append(f"  {name:<18} {1e3 * got:10.1f}  ({said}; the cost model: {1e3 * est:.1f})")
    out.append(f"  {'step':<18} {1e3 * pred.step:10.1f}  (the cost model: {1e3 * model.step:.1f})")
    return out


def run_of(argv: list[str]):
    """(`predict_train.parse`'s run, the train arguments) of
    `TRAIN_ARGS --hardware F --cluster N`."""
    from locojax.commands import predict_train

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--hardware", default="")
    ap.add_argument("--cluster", default="")
    own, rest = ap.parse_known_args(argv)
    return predict_train.parse(rest, own.cluster, own.hardware), rest


def measure(argv: list[str]) -> int:
    """The run's mode with its step's work timed as the run's own code runs it."""
    from locojax.predict import modes

    run, rest = run_of(argv)
    cfg, ctx = run.cfg, run.ctx
    if cfg.mode not in measure_lib.MEASURABLE:
        raise ValueError(f"measure times {' and '.join(measure_lib.MEASURABLE)} runs here; "
                         f"--mode {cfg.mode} is predicted by the model only")
    model = getattr(modes, cfg.mode)(ctx)
    prompts, group = cfg.rollout.prompts_per_step, cfg.group_size
    timed = measure_lib.measure(cfg.mode, rest, ctx.cluster.chips, prompts, group,
                                measure_lib.limits_of(ctx, prompts * group))
    pred = measure_lib.apply(model, timed)
    print(f"{cfg.mode} on {ctx.cluster.describe()} [{ctx.cluster.hw.path}], step time per "
          f"phase (milliseconds; timed here, {measure_lib.REPS} repetitions after warm-ups, "
          "the slowest host's step; model: the cost model's):")
    print("\n".join(beside(model, pred, "timed", measure_lib.TIMED, measure_lib.REPLACED)))
    return 0


def compiled(argv: list[str]) -> int:
    """The run's mode with its device programs priced from their compiled kernels."""
    run, rest = run_of(argv)
    cfg, ctx = run.cfg, run.ctx
    priced.program_model(ctx.cluster.hw)  # refused before anything is compiled
    model, pred = priced.predicted(ctx, cfg.mode, rest, cfg.rollout.prompts_per_step)
    print(f"{cfg.mode} on {ctx.cluster.describe()} [{ctx.cluster.hw.path}], step time per "
          "phase (milliseconds; priced: the run's compiled programs by the profile's "
          "program model; model: the cost model's):")
    print("\n".join(beside(model, pred, "priced", priced.PRICED, priced.REPLACED)))
    for note in pred.notes:
        print(f"  note: {note}")
    return 0


def calibrate(argv: list[str]) -> int:
    """`locojax predict calibrate`'s profile at --out, with the program model added."""
    from benchmarks import calibrate_kernels
    from locojax.commands import predict_calibrate

    ap = argparse.ArgumentParser(prog="predict_programs calibrate")
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args(argv).out)
    predict_calibrate.run(out)
    print("  program_model: about twelve minutes on 2 cores", flush=True)
    profile = json.loads(out.read_text())
    profile["program_model"] = calibrate_kernels.program_model()
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {out} with its program model")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ("measure", "calibrate", "compiled"):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    print(harness.header("predict_programs"))
    print(harness.command_line(), flush=True)
    try:
        return {"measure": measure, "calibrate": calibrate,
                "compiled": compiled}[argv[0]](argv[1:])
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"predict_programs: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
