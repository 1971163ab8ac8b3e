"""The layout-invariance harness: the objective must not depend on how the batch is split.

For every loss-aggregation mode, one update of the TINY model on a fixed global batch of
variable-length, padded responses (`layout_worker.make_batch`: 16 rows in 4 groups,
response lengths 1..10, half the rows stale, β = 0.04 with reference logprobs, global-norm
clipping on) gives the same gradients (before the optimizer), Adam moments, step counts,
params and metrics on every layout as on one device:
  2, 4 and 8 devices; grad-accum 2 and 4; extra padding columns; and 2 processes x 2
  devices joined by jax.distributed on CPU (gloo). One mode also runs on a 2 (data) x 2
  (fsdp) mesh with sharded params. The fast tier runs one mode on one layout varying
  devices, grad-accum and padding at once; `-m slow` runs the whole matrix.

"Same" is a relative error per array, ‖got - ref‖₂ ≤ 1e-6 ‖ref‖₂ in f32, and exact for
integer counts. Elementwise relative error is meaningless for entries at the float-noise
floor (Adam's first step is ≈ lr·sign(g) whatever |g| is), so arrays are compared as
vectors. A normalisation bug is ~1e-1 (see test_losses' negative control), so the
tolerance separates float reordering (~1e-7) from bugs by five orders of magnitude.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import layout_worker as lw
from locojax.model.sharding import make_mesh

RTOL = 1e-6
SCALAR_ATOL = 1e-7  # scalar metrics near 0 (a loss of cancelling terms): f32 noise floor
LAYOUTS = {  # name: (mesh shape, grad_accum, extra left columns, extra right columns)
    "2 devices": ({"data": 2}, 1, 0, 0),
    "4 devices": ({"data": 4}, 1, 0, 0),
    "8 devices": ({"data": 8}, 1, 0, 0),
    "grad-accum 2": ({"data": 1}, 2, 0, 0),
    "grad-accum 4": ({"data": 1}, 4, 0, 0),
    "padding columns": ({"data": 1}, 1, 3, 5),
}
WORKER = Path(__file__).with_name("layout_worker.py")


def mesh(shape: dict[str, int]):
    n = int(np.prod(list(shape.values())))
    return make_mesh(shape, jax.devices()[:n])


@functools.lru_cache(maxsize=None)
def reference(mode: str) -> dict[str, np.ndarray]:
    return lw.run_layout(mesh({"data": 1}), mode)


def compare(got: dict, ref: dict, where: str, mode: str) -> float:
    """Assert `got` matches `ref`; returns the worst relative error seen."""
    assert set(got) == set(ref), f"{where}: different outputs {set(got) ^ set(ref)}"
    failures, worst = [], 0.0
    for name, want in ref.items():
        have = got[name]
        assert have.shape == want.shape, f"{where}: {name} shape {have.shape} != {want.shape}"
        if want.dtype.kind in "iub":
            if not np.array_equal(have, want):
                failures.append(f"{name}: {have} != {want}")
            continue
        a, b = have.astype(np.float64), want.astype(np.float64)
        if want.ndim == 0:
            # The loss sums terms of both signs: its error is relative to Σ|terms|.
            scale = lw.pg_loss_scale(mode) if name == "actor/pg_loss" else abs(b)
            err = abs(a - b) / max(scale, 1e-30)
            ok = abs(a - b) <= RTOL * scale + SCALAR_ATOL
        else:
            err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
            ok = err <= RTOL
            worst = max(worst, err)
        if not ok or not np.isfinite(a).all():
            failures.append(f"{name}: relative error {err:.2e} (got {a.ravel()[:3]}, "
                            f"ref {b.ravel()[:3]})")
    assert not failures, f"{where}:\n  " + "\n  ".join(failures)
    return worst


def test_reference_is_a_real_update():
    """Guard against a vacuous harness: the fixed problem exercises every part of the loss."""
    ref = reference("seq-mean-token-mean")
    assert int(ref["step"]) == 1
    assert ref["actor/is_weight_max"] == 2.0 and 1.0 < ref["actor/is_weight_mean"] < 2.0
    assert ref["actor/kl"] > 0 and ref["rollout/logprob_mismatch"] > 0
    grads = [v for k, v in ref.items() if k.startswith("grads")]
    assert all(np.isfinite(g).all() for g in grads)
    assert sum(float(np.abs(g).sum()) for g in grads) > 1e-2
    assert ref["actor/grad_norm"] > 1.0  # so global-norm clipping (at 1.0) is active


def test_layout_invariance_quick():
    """The fast tier: one layout varying everything at once, on the subtlest mode (a per-row
    token mean inside a global sequence mean). The slow tier varies one thing at a time."""
    mode = "seq-mean-token-mean"
    got = lw.run_layout(mesh({"data": 4}), mode, grad_accum=2, extra_left=2, extra_right=3)
    compare(got, reference(mode), f"{mode} on 4 devices x grad-accum 2 x padding", mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", lw.MODES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_invariance(mode, layout):
    shape, accum, left, right = LAYOUTS[layout]
    got = lw.run_layout(mesh(shape), mode, accum, left, right)
    compare(got, reference(mode), f"{mode} on {layout}", mode)


@pytest.mark.slow
def test_fsdp_mesh_matches():
    """Params sharded over `fsdp` as well as the batch over `data` (2 x 2 devices); the step
    keeps the params' shardings (checked inside `run_layout`)."""
    mode = "seq-mean-token-sum-norm"
    got = lw.run_layout(mesh({"data": 2, "fsdp": 2}), mode, rules="train_fsdp")
    compare(got, reference(mode), f"{mode} on a 2x2 data x fsdp mesh", mode)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)  # 12 compiles on 2 shared cores: ~1 min idle, ~5 min under load
def test_two_processes_two_devices_each(tmp_path):
    """2 jax.distributed processes x 2 CPU devices, each contributing only its own rows."""
    out = tmp_path / "results.npz"
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen(
        [sys.executable, str(WORKER), str(port), str(i), "2", "2", str(out), *lw.MODES],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        for i in range(2)]
    deadline = time.monotonic() + 780  # under the 900 s above, with room for the comparison
    try:
        refs = {mode: reference(mode) for mode in lw.MODES}  # overlaps with the workers
        logs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {i} exited with {p.returncode}:\n{log[-4000:]}"
    results = np.load(out)
    for mode in lw.MODES:
        got = {k.split("|", 1)[1]: results[k] for k in results.files if k.startswith(mode + "|")}
        compare(got, refs[mode], f"{mode} on 2 processes x 2 devices", mode)


def test_layout_invariance_with_multi_turn_masks(monkeypatch):
    """The fixed problem with observations cut into its responses (`multiturn_batch`): the
    environment tokens are attended to but are not targets, so every normaliser counts
    only model tokens, on every layout alike (the fast tier's layout, the subtlest mode)."""
    from multiturn_batch import to_multi_turn

    mode = "seq-mean-token-mean"
    single_turn = reference(mode)
    make_batch = lw.make_batch
    monkeypatch.setattr(lw, "make_batch", lambda *a, **kw: to_multi_turn(make_batch(*a, **kw)))
    ref = lw.run_layout(mesh({"data": 1}), mode)
    got = lw.run_layout(mesh({"data": 4}), mode, grad_accum=2, extra_left=2, extra_right=3)
    compare(got, ref, f"{mode} with multi-turn masks on 4 devices x grad-accum 2 x padding",
            mode)
    # Not vacuous: the masks changed the update (a different objective from the same rows).
    g = np.concatenate([np.ravel(v) for k, v in ref.items() if k.startswith("grads")])
    g0 = np.concatenate([np.ravel(v) for k, v in single_turn.items() if k.startswith("grads")])
    assert np.linalg.norm(g - g0) > 1e-2 * np.linalg.norm(g0)
