"""The program model of `predict_programs calibrate`: the weights of `kernel_model.py`, fitted to
locojax's own programs on this machine.

Three calibration decoders, of widths 96, 384 and 640 (no model's and no validation
point's: TINY is d 64, SMALL d 256, SmolLM2-135M d 576), two layers each, run their GRPO
update and their engine's generate (every row to N tokens) at three shapes each, B x G x P x
N in `SHAPES`; each program is compiled, its kernels read from its HLO, and timed (median
of `REPS` calls after warm-ups), the generate's prefill and decode apart. The weights of
each kind (update, prefill, decode) are the non-negative least squares of its nine
(features, seconds) rows (`kernel_model.fit`).

All of it twice: in a child pinned to one core (what one of N local hosts on N cores has)
and in a child on every core, each timing its own matmul tables (`kernel_tables.measure`)
and pricing its rows by them: XLA:CPU splits a large matmul over the cores and a small one
not at all, so the same kernel has two prices (`kernel_model.ALL_MATMUL`). Each child is
a fresh process, so the affinity is set before JAX starts. About three and a half minutes
each on 2 cores. Then the lock-step probe (`calibrate_lockstep.py`): what meetings of
devices or hosts cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import calibrate_lockstep

DECODERS = {
    "d96": dict(hidden_size=96, intermediate_size=256, num_attention_heads=3,
                num_key_value_heads=1, head_dim=32, vocab_size=2048),
    "d384": dict(hidden_size=384, intermediate_size=1024, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=64, vocab_size=49152),
    "d640": dict(hidden_size=640, intermediate_size=1792, num_attention_heads=10,
                 num_key_value_heads=2, head_dim=64, vocab_size=16384),
}
"""Grouped-query attention, as the models locojax ships have. A d-320 decoder with five
key-value heads was tried first: two XLA:CPU fusions of its generate ran 60 and 106 times
their isolated-kernel price (its generate 0.38 s where d 640's took 0.32), a cliff of that
shape which no weight can hold and which skewed every weight of the fit. The d-384
decoder's vocabulary is SmolLM2's and Qwen's order (49152): with at most 16384, set 6
over-priced SmolLM2-135M's update by a third, its logits and log-softmax kernels far
larger than any the fit had seen."""
LAYERS = 2
SHAPES = ((2, 2, 16, 16), (4, 4, 24, 40), (8, 4, 16, 24))
REPS = 5


def rows(prices, decoders=DECODERS, shapes=SHAPES, reps=REPS) -> dict[str, list]:
    """{kind: [(features, seconds), ...]} of the calibration programs on this process."""
    import statistics

    from locojax.model import config
    from benchmarks import kernel_model, kernel_programs
    from locojax.predict import calibration_step
    from locojax.predict.calibrate_host import median_time
    from benchmarks.hlo_kernels import kernels

    out: dict[str, list] = {kind: [] for kind in kernel_model.KINDS}
    for dims in decoders.values():
        cfg = config.tiny(num_hidden_layers=LAYERS, **dims)
        for shape in shapes:
            step = calibration_step.update(cfg, *shape)
            listed = kernels(kernel_programs.compiled_update(cfg, *shape).as_text()).kernels
            out["update"].append((kernel_model.features(listed, prices),
                                  median_time(step, reps)))
            call, prefilling, decoding = kernel_programs.generate_parts(cfg, *shape)
            for _ in range(2):  # compiles, then warms
                call()
            parts = [call() for _ in range(reps)]
            for kind, kernels_of, i in (("prefill", prefilling, 0), ("decode", decoding, 1)):
                out[kind].append((kernel_model.features(kernels_of, prices),
                                  statistics.median(t[i] for t in parts)))
    return out


def child(out: str) -> None:
    """One child's part (module docstring): the tables, and the rows priced by them, on the
    cores the parent left it."""
    from benchmarks import kernel_model, kernel_tables
    from locojax.predict.calibrate_host import matmul_flops

    table = kernel_tables.measure(matmul_flops())
    measured = rows(kernel_tables.KernelPrices.of(table))
    Path(out).write_text(json.dumps({
        "tables": table, "cores": len(os.sched_getaffinity(0)),
        "weights": {kind: kernel_model.fit(r) for kind, r in measured.items()},
        "rows": {kind: [[f, t] for f, t in r] for kind, r in measured.items()}}))


def _run_child(out: Path, one_core: bool) -> dict:
    pin = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
           if one_core else "")
    code = (f"{pin}import sys; from benchmarks.calibrate_kernels import child; "
            f"child({str(out)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=1800,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def program_model() -> dict:
    """The profile's `program_model` entry: the tables and the weights on one core and on
    all, the cores of all, and each fit's rows (features and measured seconds)."""
    with tempfile.TemporaryDirectory(prefix="locojax_calibrate_kernels_") as tmp:
        one = _run_child(Path(tmp) / "one.json", True)
        every = _run_child(Path(tmp) / "all.json", False)
    return {"tables": one["tables"], "tables_all": every["tables"], "cores": every["cores"],
            "weights": {"one": one["weights"], "all": every["weights"]},
            "rows": {"one": one["rows"], "all": every["rows"]},
            "decoders": {name: {**dims, "num_hidden_layers": LAYERS}
                         for name, dims in DECODERS.items()},
            "shapes": [list(s) for s in SHAPES], "lockstep": calibrate_lockstep.lockstep()}

