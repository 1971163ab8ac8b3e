"""LoRA in the multi-process modes: an adapter update reaches every sampler (issue 57).

Every mode's LoRA run trains the adapters, bitwise, that the in-process run trains
(tests/test_lora_modes.py checks that one samples each step from its own version): a
colocated pair of hosts those of `single` on two devices; the controller, disaggregated and
async (k = 0) those of `single` on one device, each rollout unit generated as one batch of
the same rows on one device. Step 2's rollouts depend on the adapters of version 1, so a
sampler that kept the base (verl #7495), or ran a version behind, trains other adapters:
the comparison fails when the sync is removed (checked by hand, commit message).

In the Ray modes a version is the adapters alone: the pushed bytes are 4 x the adapters'
parameters, and a version whose bytes do not match its checksum stops the run.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ray = pytest.importorskip("ray")

from test_ray_modes import cluster, config, jsonl  # noqa: E402,F401  (the shared fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LORA = ["--lora.rank", "4", "--lora.alpha", "8", "--lora.targets", "q", "v", "o", "up",
        "--optim.lr", "3e-3"]
PRESET = ("demo", "--model", "embedded", "--rollout.prompts-per-step", "8",
          "--algo.group-size", "4", "--eval.every", "0", "--optim.warmup-steps", "0",
          "--no-progress", "--no-tensorboard", "--steps", "3", *LORA)


def cli(*args, timeout=600):
    out = subprocess.run([sys.executable, "-m", "locojax.cli", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def train(run_dir, *args, faults=None):
    from locojax.fleet import controller, driver
    from locojax.fleet.faults import Faults

    cfg = config(run_dir, *args, preset=PRESET)
    return (controller if cfg.mode == "controller" else driver).run(cfg, faults or Faults())


def adapters(run_dir):
    from safetensors.numpy import load_file

    return load_file(os.path.join(run_dir, "final_adapter", "adapter_model.safetensors"))


def assert_same_adapters(a, b):
    from locojax import float_context

    float_context.same_or_raise(str(a), str(b))  # the precondition of bitwise
    ta, tb = adapters(a), adapters(b)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].tobytes() == tb[name].tobytes(), name


@pytest.mark.timeout(1500)
def test_every_mode_trains_the_adapters_single_trains(cluster, tmp_path):
    one = tmp_path / "single1"
    cli("train", *PRESET, "--mode", "single", "--devices-per-host", "1", "--run-dir", str(one))
    b = [x for k, x in adapters(one).items() if "lora_B" in k]
    assert b and all(np.any(x) for x in b), "the updates moved every B off 0"
    train(tmp_path / "controller", "--mode", "controller", "--hosts", "1")
    assert_same_adapters(one, tmp_path / "controller")
    for mode, flags in (("da", ("--mode", "disaggregated", "--hosts", "2",
                                "--rollout-fraction", "0.5")),
                        ("async", ("--mode", "async", "--workers", "1", "--learner-hosts", "1",
                                   "--hosts", "2"))):
        train(tmp_path / mode, *flags, "--max-staleness", "0", "--prompts-per-lease", "8")
        assert_same_adapters(one, tmp_path / mode)
        n = sum(x.size for x in adapters(one).values())
        pushes = [p["perf/net/weight_sync_push_bytes"]
                  for p in jsonl(tmp_path / mode / "perf.jsonl")
                  if "perf/net/weight_sync_push_bytes" in p]
        assert pushes and all(p == 4 * n for p in pushes), (pushes, n)  # adapters only
    two = tmp_path / "single2"
    cli("train", *PRESET, "--mode", "single", "--devices-per-host", "2", "--run-dir", str(two))
    # unpinned, as every bitwise reference (design.md): a pinned host has one intra-op
    # thread where single's process has the machine's cores (same_or_raise checks it)
    cli("launch", "--hosts", "2", "--heartbeat-s", "10", "--no-pin-cpus", "--", "train",
        *PRESET, "--mode", "colocated", "--run-dir", str(tmp_path / "colocated"))
    assert_same_adapters(two, tmp_path / "colocated")


def test_a_corrupted_adapter_version_stops_the_run(cluster, tmp_path):
    from locojax.fleet.faults import Faults

    with pytest.raises(Exception, match="checksum .* expected .*corrupted or mixed"):
        train(tmp_path, "--mode", "disaggregated", "--hosts", "2", "--rollout-fraction", "0.5",
              faults=Faults(corrupt_version=0))
    assert not (tmp_path / "final_adapter").exists()
