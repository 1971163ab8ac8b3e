"""Ray-mode settings: each bad one is refused, with the flag named, before anything starts."""

import os
import subprocess
import sys

import pytest

from locojax.fleet.placement import place
from locojax.train.placement_config import PlacementConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_disaggregated_splits_the_hosts_by_the_fraction():
    p = place("disaggregated", PlacementConfig(hosts=4, rollout_fraction=0.75), 6, 1)
    assert (p.learner_hosts, p.workers, p.prompts_per_lease) == (1, 3, 2)
    assert p.schedule.max_staleness == 1 and not p.schedule.newest
    assert p.schedule.versions_kept == 2


@pytest.mark.parametrize("b,workers,per_lease", [(8, 2, 4), (32, 3, 8), (8, 3, 2), (2, 3, 1)])
def test_default_lease_is_the_largest_divisor_that_feeds_every_worker(b, workers, per_lease):
    p = place("async", PlacementConfig(workers=workers, hosts=workers + 1), b, 1)
    assert p.prompts_per_lease == per_lease


def test_verifier_deadline_defaults_to_half_the_lease():
    plan = place("async", PlacementConfig(workers=2, hosts=3, lease_timeout_s=30), 8, 1)
    assert (plan.verifier_timeout_s, plan.max_attempts, plan.stall_warning_s) == (15, 3, 60)
    plan = place("async", PlacementConfig(workers=2, hosts=3, verifier_timeout_s=4), 8, 1)
    assert plan.verifier_timeout_s == 4


def test_async_takes_the_newest_version_and_default_leases():
    p = place("async", PlacementConfig(workers=2, max_staleness=4, hosts=4), 8, 2)
    assert (p.learner_hosts, p.workers, p.prompts_per_lease) == (1, 2, 4)
    assert p.schedule.newest and p.schedule.versions_kept == 5 and p.devices_per_host == 2


@pytest.mark.parametrize("mode,kw,b,message", [
    ("disaggregated", dict(hosts=4, rollout_fraction=0.1), 8,
     "--rollout-fraction 0.1 of --hosts 4 leaves no rollout worker"),
    ("disaggregated", dict(hosts=4, rollout_fraction=0.9), 8,
     "--rollout-fraction 0.9 of --hosts 4 leaves no learner host"),
    ("disaggregated", dict(rollout_fraction=1.0), 8, "--rollout-fraction must be in (0, 1)"),
    ("async", dict(max_staleness=-1), 8, "--max-staleness must be >= 0"),
    ("async", dict(workers=4, hosts=4), 8,
     "--workers 4 + --learner-hosts 1 need 5 hosts of 1 device(s), more than the devices allow"),
    ("async", dict(workers=0), 8, "--workers and --learner-hosts must be >= 1"),
    ("async", dict(max_staleness=2, versions_kept=2), 8, "--versions-kept 2 is fewer than"),
    ("async", dict(prompts_per_lease=3), 8, "--prompts-per-lease 3 does not divide"),
    ("async", dict(lease_timeout_s=0), 8, "--lease-timeout-s must be > 0"),
    ("async", dict(max_attempts=0), 8, "--max-attempts must be >= 1"),
    ("async", dict(start_timeout_s=0), 8, "--start-timeout-s must be > 0"),
    ("async", dict(stall_warning_s=0), 8, "--stall-warning-s must be > 0"),
    ("async", dict(lease_timeout_s=10, verifier_timeout_s=10), 8,
     "--verifier-timeout-s must be >= 0 (0: half the lease) and below --lease-timeout-s 10"),
    ("async", dict(hosts=1), 8, "--hosts must be >= 2"),
])
def test_bad_settings_are_refused(mode, kw, b, message):
    with pytest.raises(ValueError) as e:
        place(mode, PlacementConfig(**kw), b, 1)
    assert message in str(e.value)


@pytest.mark.parametrize("args,message", [
    (["--mode", "disaggregated", "--rollout-fraction", "0.1"], "leaves no rollout worker"),
    (["--mode", "async", "--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--mode", "async", "--workers", "9"], "more than the devices allow"),
    (["--mode", "disaggregated", "--hosts", "3", "--rollout-fraction", "0.34"],
     "does not split over 2 hosts"),  # the learner group, by the usual check
])
def test_cli_refuses_before_ray_starts(args, message, tmp_path):
    run_dir = tmp_path / "r"
    out = subprocess.run([sys.executable, "-m", "locojax.cli", "train", "demo", "--model", "tiny",
                          "--run-dir", str(run_dir), "--rollout.prompts-per-step", "5",
                          "--algo.group-size", "3", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert "learner host(s)" not in out.stdout  # the plan is printed once Ray is up
    assert not run_dir.exists()


def _bad_inputs(tmp_path):
    """A data file holding one JSON array (not JSON Lines), and a model directory whose
    config is fine but whose weights are missing."""
    data = tmp_path / "train.json"
    data.write_text('[{"question": "1+1?", "answer": "#### 2"}]\n')
    model = tmp_path / "model"
    model.mkdir()
    from locojax.model.loader import EMBEDDED

    (model / "config.json").write_bytes((EMBEDDED["embedded"] / "config.json").read_bytes())
    (model / "locojax.json").write_bytes((EMBEDDED["embedded"] / "locojax.json").read_bytes())
    return str(data), str(model)


@pytest.mark.parametrize("mode,which,message", [
    (["--mode", "disaggregated", "--hosts", "3", "--rollout-fraction", "0.67"], "data",
     "train.json: holds a JSON array of rows, but locojax reads JSON Lines"),
    (["--mode", "async", "--hosts", "3", "--workers", "2"], "model",
     "no model.safetensors or model.safetensors.index.json in"),
    (["--mode", "controller", "--hosts", "2"], "data",
     "train.json: holds a JSON array of rows, but locojax reads JSON Lines"),
])
def test_bad_files_are_refused_before_any_actor_starts(mode, which, message, tmp_path):
    """Issue 23, Build 8: each actor would have failed in its constructor while Ray
    restarted it (about 60 s, then a traceback); refused here in seconds, naming the file."""
    data, model = _bad_inputs(tmp_path)
    inputs = ["--task.name", "gsm8k", "--task.data", data] if which == "data" else \
        ["--model", model]
    run_dir = tmp_path / "r"
    out = subprocess.run([sys.executable, "-m", "locojax.cli", "train", "demo",
                          "--run-dir", str(run_dir), "--rollout.prompts-per-step", "4",
                          "--algo.group-size", "2", "--eval.every", "0", *inputs, *mode],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert (data if which == "data" else model) in out.stderr
    assert "learner host(s)" not in out.stdout and "controller:" not in out.stdout
    assert not run_dir.exists()
