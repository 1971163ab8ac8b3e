"""Exact resume after kill -9, wherever the optimizer state lives (issue 55 item 5).

A single-mode run of the demo at β 0.04 is killed with SIGKILL in its third step (right after
the step-2 checkpoint is committed) and started again with the same command: its final params
and its metrics log must be bitwise those of the run that never stopped. Once with every
buffer on the device (`--offload off`), once with the reference and AdamW's moments in host
memory (`--offload host`), as the plan keeps them for Qwen3-0.6B on one v5e chip.

In the CPU suite the runs are XLA:CPU processes. Under `make test-accelerator` they run on the
accelerator (`tests/backend.py` `child_env`), while this pytest process stays on the CPU: one
process at a time can hold a TPU chip, and the killed run must release it for its resumption.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from locojax import float_context
from locojax.checkpoint import Checkpointer
from tests import backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, EVERY = 4, 2


def _argv(run_dir, offload: str) -> list[str]:
    return [sys.executable, "-m", "locojax.cli", "train", "demo", "--mode", "single",
            "--steps", str(STEPS), "--checkpoint.every", str(EVERY), "--run-dir", str(run_dir),
            "--offload", offload, "--algo.beta", "0.04", "--rollout.prompts-per-step", "4",
            "--algo.group-size", "4", "--rollout.max-new-tokens", "8", "--eval.every", "0",
            "--optim.warmup-steps", "0", "--no-progress", "--no-tensorboard"]


def _run(run_dir, offload, env) -> str:
    out = subprocess.run(_argv(run_dir, offload), cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    return out.stdout


def _kill_in_step_after(run_dir, offload, env, step: int) -> None:
    """Start the run and SIGKILL it as soon as checkpoint `step` is committed: it is then
    inside step `step + 1` (the next rollout), with nothing of it saved."""
    proc = subprocess.Popen(_argv(run_dir, offload), cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ckpt, deadline = os.path.join(run_dir, "checkpoints"), time.monotonic() + 900
    while not (os.path.isdir(ckpt) and Checkpointer(ckpt).latest_step() == step):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before checkpoint {step}:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, f"no checkpoint {step} in 900 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # `train` runs in this one process in single mode
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # One compilation cache (the suite's, else this module's): the resumed run loads what the
    # others compiled. A cache hit is the same executable, so it cannot change a bit.
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    return backend.child_env(JAX_COMPILATION_CACHE_DIR=cache)


@pytest.mark.slow
@pytest.mark.accelerator_children
@pytest.mark.parametrize("offload", ["off", "host"])
def test_killed_mid_step_and_resumed_is_bitwise_the_straight_run(tmp_path, env, offload):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    said = _run(straight, offload, env)
    _kill_in_step_after(resumed, offload, env, EVERY)
    assert Checkpointer(str(resumed / "checkpoints")).latest_step() == EVERY
    _run(resumed, offload, env)

    kept_on_host = "AdamW's moments in host memory" in said
    assert kept_on_host == (offload == "host"), said  # the plan did what was asked
    context = float_context.same_or_raise(str(straight), str(resumed))
    if backend.children_on_accelerator():
        assert context["platform"] != "cpu", context
    a = load_file(str(straight / "final_model" / "model.safetensors"))
    b = load_file(str(resumed / "final_model" / "model.safetensors"))
    assert a.keys() == b.keys() and len(a) > 0
    # Bitwise: the same programs from a bitwise-restored state (params, both moments, the
    # step, the data cursor, the RNG), on the same backend and float context.
    for name in a:
        assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name
    assert (straight / "metrics.jsonl").read_bytes() == (resumed / "metrics.jsonl").read_bytes()
