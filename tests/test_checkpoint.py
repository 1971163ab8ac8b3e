"""Checkpoints: bitwise restore, keep-last-K, and no half-written checkpoint ever loads."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locojax.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(seed):
    k = jax.random.key(seed)
    return {
        "params": {"w": jax.random.normal(k, (8, 4)), "b": jnp.arange(3, dtype=jnp.float32) + seed},
        "step": jnp.asarray(seed, jnp.int32),
        "rng": jax.random.key_data(jax.random.fold_in(k, 1)),
    }


def _assert_bitwise(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_round_trip_is_bitwise_and_keeps_last_k(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, _state(step), {"cursor": step * 10, "config": {"lr": 1e-3}})
    assert ckpt.all_steps() == [2, 3]
    state, meta = ckpt.restore(None, _state(0))
    _assert_bitwise(state, _state(3))
    assert meta == {"cursor": 30, "config": {"lr": 1e-3}}
    key = jax.random.wrap_key_data(state["rng"])
    assert jax.random.normal(key).item() == jax.random.normal(
        jax.random.fold_in(jax.random.key(3), 1)).item()
    ckpt.close()


def test_restore_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        Checkpointer(str(tmp_path)).restore(None, _state(0))


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep must be >= 1"):
        Checkpointer(str(tmp_path), keep=0)


@pytest.mark.slow
def test_kill_mid_save_never_leaves_a_loadable_partial_checkpoint(tmp_path):
    """SIGKILL a process while it is inside `save` (after it said "begin N", before "end N"),
    at several moments; whatever `latest_step` reports afterwards must restore completely and
    hold that step's values. Kills are timed from the writer's own output, not the clock, so
    a slow or loaded machine still kills mid-save; the test fails if no kill landed there."""
    writer = textwrap.dedent(f"""
        import sys, jax, jax.numpy as jnp
        from locojax.checkpoint import Checkpointer
        ckpt = Checkpointer({str(tmp_path)!r}, keep=2)
        step = (ckpt.latest_step() or 0) + 1
        while True:
            state = {{"big": jnp.full((4096, 1024), step, jnp.float32), "step": jnp.asarray(step)}}
            print("begin", step, flush=True)
            ckpt.save(step, state, {{"step": step}})
            print("end", step, flush=True)
            step += 1
    """)
    like = {"big": jnp.zeros((4096, 1024), jnp.float32), "step": jnp.asarray(0)}
    mid_save = 0
    for delay in (0.0, 0.02, 0.1):
        proc = subprocess.Popen([sys.executable, "-c", writer], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
        seen = []
        for line in iter(proc.stdout.readline, ""):  # one save has committed, the next begun
            seen.append(line.split())
            if seen[-1][0] == "begin" and any(w[0] == "end" for w in seen):
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # What the writer had done when the kill landed is its whole output, not where this
        # reader had got to: on a loaded machine the writer may be saves ahead of the reader.
        seen += [line.split() for line in proc.stdout.read().splitlines()]
        last_end = max(int(n) for w, n in seen if w == "end")
        inside = seen[-1][0] == "begin"  # killed after "begin N", before "end N"
        mid_save += inside
        latest = Checkpointer(str(tmp_path), keep=2).latest_step()
        # The last save that returned, or the one the kill cut short if it had just committed.
        assert latest in (last_end, last_end + inside)
        state, meta = Checkpointer(str(tmp_path), keep=2).restore(latest, like)
        assert meta["step"] == latest == int(state["step"])
        assert float(state["big"].min()) == float(state["big"].max()) == latest
    assert mid_save, "no kill landed inside a save: the test checked nothing"



def test_a_checkpoint_resumes_under_another_train_mesh(tmp_path):
    """Orbax writes every array whole (each host its shards of it), so params saved sharded
    over `fsdp` restore replicated, and replicated ones restore sharded (`--train.mesh` may
    change on resume, train/resume.py): bit for bit, laid out as the resuming run asks.
    One checkpoint holds both directions' params."""
    from locojax.model import config as model_config
    from locojax.model import params as params_lib
    from locojax.model.sharding import TRAIN_DP, TRAIN_FSDP, make_mesh, weight_shardings

    cfg = model_config.tiny()
    mesh = make_mesh({"data": 2, "fsdp": 2}, jax.devices()[:4])
    fsdp, dp = (weight_shardings(cfg, mesh, rules) for rules in (TRAIN_FSDP, TRAIN_DP))
    assert any("fsdp" in s.spec for s in jax.tree.leaves(fsdp))  # really sharded
    rng = np.random.default_rng(0)  # numpy: no per-leaf compile of the initialisers
    init = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(a.dtype),
                        jax.eval_shape(lambda: params_lib.init(cfg, jax.random.key(0))))
    saved = {"sharded": jax.device_put(init, fsdp), "replicated": jax.device_put(init, dp)}
    resumed = {"sharded": dp, "replicated": fsdp}  # each restored in the other layout
    ckpt = Checkpointer(str(tmp_path))
    ckpt.save(1, saved, {})
    ckpt.wait()
    like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        saved, resumed)
    state, _ = ckpt.restore(1, like)
    for x, y, want in zip(jax.tree.leaves(saved), jax.tree.leaves(state),
                          jax.tree.leaves(resumed), strict=True):
        assert y.sharding.is_equivalent_to(want, y.ndim)
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    ckpt.close()
