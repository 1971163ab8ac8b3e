"""An adapter update reaches the sampler (issue 57), in process: `single` here, the other
modes in tests/test_lora_ray_modes.py (which compare them with this mode's run, bitwise).

The weights the engine generates step s with must be version s: the frozen base with the
adapters after s updates merged in (`Trainer.sampler_weights`), bitwise, and no longer the
base once an update has moved the adapters. A sampler left on the starting weights (the
silent failure of verl #7495) or a version behind fails it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from locojax.distributed import HostInfo
from locojax.model import lora
from locojax.profiler import StepTimer
from locojax.train import loop, wiring
from locojax.train.config import PRESETS

ARGS = ["demo", "--model", "embedded", "--mode", "single", "--steps", "3",
        "--rollout.prompts-per-step", "8", "--algo.group-size", "4",
        "--rollout.max-new-tokens", "10", "--eval.every", "0", "--optim.lr", "3e-3",
        "--optim.warmup-steps", "0", "--no-progress", "--no-tensorboard",
        "--lora.rank", "4", "--lora.targets", "q", "v", "down"]


def _config(run_dir, *extra):
    import tyro

    return tyro.extras.overridable_config_cli(PRESETS, args=[*ARGS, "--run-dir", str(run_dir),
                                                             *extra])


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    cfg = _config(tmp_path_factory.mktemp("lora_single") / "run")
    t = loop.start(cfg, wiring.Single(HostInfo(process_id=0, num_processes=1)))
    yield t
    t.lock.release()


def test_each_step_samples_its_own_version(trainer):
    seen = []
    produce = trainer.producer.produce

    def spy(step, weights, *args, **kw):
        seen.append(jax.tree.map(np.asarray, weights))
        return produce(step, weights, *args, **kw)

    trainer.producer.produce = spy
    cfg, base = trainer.parts.model_cfg, jax.tree.map(np.asarray, trainer.state.frozen)
    versions = []
    try:
        for step in range(2):
            versions.append(jax.tree.map(np.asarray, trainer.state.params))
            trainer.step(step, StepTimer())
    finally:
        trainer.producer.produce = produce
    assert len(seen) == 2
    moved = [np.any(ab["b"]) for ab in versions[1]["layers"].values()]
    assert len(moved) == 3 and all(moved), "the first update moves every B off 0"
    for weights, adapters in zip(seen, versions):
        want = jax.tree.map(np.asarray, lora.merge_jit(base, adapters, cfg))
        jax.tree.map(np.testing.assert_array_equal, weights, want)
    # Version 0 is the base itself (B = 0); version 1 is not.
    jax.tree.map(np.testing.assert_array_equal, seen[0],
                 jax.tree.map(lambda w: np.asarray(w, np.float32), base))
    differ = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(seen[1]),
                                                        jax.tree.leaves(seen[0]))]
    assert sum(differ) == 3  # wq, wv, w_down: the targets, and nothing else


def test_lora_refuses_what_it_does_not_run():
    from locojax.model.config import LoraConfig
    from locojax.train.config import RunConfig

    with pytest.raises(ValueError, match="profile-split"):
        RunConfig(lora=LoraConfig(rank=4), profile_split=True)


@pytest.mark.slow
def test_resumed_lora_run_equals_a_straight_one(tmp_path):
    """Checkpoints hold the adapters and their moments, not the base (the run's --model):
    a run stopped after step 2 and resumed to step 3 trains the straight run's adapters."""
    import os
    import subprocess
    import sys

    from pathlib import Path

    from safetensors.numpy import load_file

    from locojax.model import loader

    def cli(run_dir, steps):
        i = ARGS.index("--steps")
        argv = ARGS[:i] + ARGS[i + 2:]  # every flag but the step count
        out = subprocess.run([sys.executable, "-m", "locojax.cli", "train", *argv, "--steps",
                              str(steps), "--checkpoint.every", "1", "--run-dir", str(run_dir)],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

    cli(tmp_path / "straight", 3)
    cli(tmp_path / "resumed", 2)
    saved = sum(f.stat().st_size for f in (tmp_path / "resumed" / "checkpoints").rglob("*")
                if f.is_file())
    base = sum(f.stat().st_size for f in Path(loader.resolve_dir("embedded")).glob(
        "*.safetensors"))
    assert saved < base / 2, (saved, base)  # adapters, 2 moments, 2 checkpoints: no base
    cli(tmp_path / "resumed", 3)
    a, b = (load_file(os.path.join(tmp_path / r, "final_adapter", "adapter_model.safetensors"))
            for r in ("straight", "resumed"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
