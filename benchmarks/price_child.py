"""One host's programs of a `locojax train` run, compiled by the run's memory plan and read
kernel by kernel, nothing run: what `benchmarks/predict_programs.py compiled` starts in a child
process (`priced.py` prices what it writes).

    python -m benchmarks.price_child SPEC.json

SPEC: {"argv": the run's train arguments, "mode", "devices": the process's devices,
"tables": the profile's matmul tables, "out": where the features go (JSON)}. The child
builds the run's parts with its own builder (`RunParts.of`), joins its wiring as one process
and compiles the step's programs through `loop.plan_memory`, exactly as a run does before
its first step; then it writes, per program of the plan, the kernel features of
`kernel_model.features` (the tables price the matmuls): the train step (and the reference
pass where β > 0), each prefill, the reshard where there is one, each decode split into
its part outside the loop (`once`) and one iteration of its loop (`iteration`), the
rollout's cache buffer (`cache rollout`, `Engine.allocation`: made anew every step), as
seconds: its kernels priced alone by the tables, and the bytes of the trained params
(`gradients`: what the hosts' gradient all-reduce sums).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from benchmarks.kernel_model import CACHE, GRADIENTS


def features_of(plan, prices, every=None) -> dict[str, dict]:
    """{program name: features} of a memory plan's programs, their matmuls priced by the
    one-core tables `prices` and the all-core ones `every`; a decode as two entries,
    `NAME once` and `NAME iteration`."""
    from benchmarks import kernel_model
    from benchmarks.hlo_kernels import kernels

    out = {}
    for program in plan.programs:
        listed = kernels(program.compiled.as_text())
        if program.name.startswith("decode"):
            once, loop = listed.split()
            out[f"{program.name} once"] = kernel_model.features(once, prices, every=every)
            # one iteration: its kernels, no call of its own (the program's is in `once`)
            out[f"{program.name} iteration"] = {**kernel_model.features(loop, prices, every=every),
                                                "call": 0.0}
        else:
            out[program.name] = kernel_model.features(listed.kernels, prices, every=every)
    return out


def run(spec: dict) -> dict:
    import tyro

    from locojax.engine.engine import generate_slots
    from benchmarks.hlo_kernels import kernels
    from benchmarks.kernel_tables import KernelPrices
    from locojax.train import wiring as wiring_lib
    from locojax.train.build import RunParts
    from locojax.train.config import PRESETS
    from locojax.train.loop import plan_memory

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=spec["argv"], prog="price")
    parts = RunParts.of(cfg)
    if parts.task.multi_turn:
        raise ValueError(f"compiled prices single-turn steps; {cfg.task.name!r} is "
                         "multi-turn")
    wiring = wiring_lib.join(spec["mode"], spec["devices"], cfg.train, cfg.rollout.tp)
    engine = parts.engine(wiring.rollout_mesh, wiring.rollout_rules)
    plan = plan_memory(parts, wiring, engine)
    plan.check()
    prices = KernelPrices.of(spec["tables"])
    out = features_of(plan, prices, KernelPrices.of(spec["tables_all"]))
    resolved = parts.cfg  # its prompt width resolved (`plan_memory` reads the same)
    start, stop = wiring.host_slice(resolved.rollout.prompts_per_step)
    cache = engine.allocation((stop - start) * resolved.group_size, generate_slots(
        resolved.rollout.max_prompt_tokens, parts.sampling)).lower().compile()
    # its kernels timed alone (fills): the fit's fill weight carries other kernels' time
    out[CACHE] = {"seconds": prices.seconds(kernels(cache.as_text()).kernels)}
    out[GRADIENTS] = {"bytes": float(plan.held["params"])}  # one device: all of them
    return out


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    Path(spec["out"]).write_text(json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main(sys.argv[1:]))
