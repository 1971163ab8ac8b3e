"""The Ray modes refuse bad inputs before any actor starts (issue 23, "Bad input").

A missing or malformed data file, a missing model directory, or damaged weights used to
reach every actor's constructor: each one failed, Ray restarted it, and the run ended in an
actor traceback about a minute later; another run's checkpoint was found only by the
learners. `driver.check_settings`
(disaggregated, async) and `controller.check_settings` read what every actor would read
first, so the refusal names the file at once. Here joining Ray at all fails the test: no
cluster starts, so this file runs in the in-process phase.
"""

import dataclasses
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("ray")

from locojax.checkpoint import Checkpointer
from locojax.fleet import controller, driver
from locojax.model import loader
from locojax.train import resume
from locojax.train.config import PRESETS

MODES = {
    "disaggregated": ("--mode", "disaggregated", "--hosts", "2", "--rollout-fraction", "0.5"),
    "async": ("--mode", "async", "--hosts", "2", "--workers", "1"),
    "controller": ("--mode", "controller", "--hosts", "2"),
}
GOOD_ROW = {"question": "1+1", "answer": "#### 2"}


def _config(tmp_path, mode, *args):
    import tyro

    return tyro.extras.overridable_config_cli(PRESETS, args=[
        "demo", "--run-dir", str(tmp_path / "run"), "--model", "embedded", "--steps", "1",
        "--rollout.prompts-per-step", "4", "--algo.group-size", "2", "--eval.every", "0",
        *MODES[mode], *args])


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    """Connecting to Ray is the first thing a run does after its checks: here it fails."""
    def connect(cfg):
        raise AssertionError("the run joined Ray: an actor could have started")

    monkeypatch.setattr(driver, "connect", connect)


def _run(cfg):
    return (controller if cfg.mode == "controller" else driver).run(cfg)


def _gsm8k(path):
    return ("--task.name", "gsm8k", "--task.data", str(path))


def _corrupt_model(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(loader.EMBEDDED["embedded"], model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # an interrupted download
    return model, weights


@pytest.mark.parametrize("mode", sorted(MODES))
def test_bad_inputs_are_refused_before_any_actor_starts(tmp_path, mode):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ValueError, match=f"data file '{missing}' does not exist"):
        _run(_config(tmp_path, mode, *_gsm8k(missing)))
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([GOOD_ROW, GOOD_ROW]))
    with pytest.raises(ValueError, match=rf"{array}: holds a JSON array of rows"):
        _run(_config(tmp_path, mode, *_gsm8k(array)))
    with pytest.raises(ValueError, match=r"model '/nonexistent/model' is neither"):
        _run(_config(tmp_path, mode, "--model", "/nonexistent/model"))
    model, weights = _corrupt_model(tmp_path)
    with pytest.raises(ValueError, match=rf"{weights}: not a readable safetensors file"):
        _run(_config(tmp_path, mode, "--model", str(model)))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_another_runs_checkpoint_is_refused_before_any_actor_starts(tmp_path, mode):
    cfg = _config(tmp_path, mode)
    other = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=0.5))
    ckpt = Checkpointer(resume.checkpoint_dir(other))
    ckpt.save(1, {"w": np.zeros(2)}, {"next_step": 1, **resume.recorded(other)})
    ckpt.close()
    with pytest.raises(ValueError, match=r"checkpoint 1 under .* is of another run: config "
                                         r"fields .*optim\.lr \(0\.5 -> "):
        _run(cfg)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_layouts_that_do_not_fit_are_refused_before_any_actor_starts(tmp_path, mode):
    """`--train.mesh` and `--rollout.tp` run in every mode (issue 26); settings that do not
    cover the learner's devices, or split a host's devices or the model's heads unevenly,
    are refused naming the setting. The hosts here have 1 device each, so FSDP 4 cannot
    cover the learner's (1 or 2) devices and tp 2 cannot split a host's."""
    learner = 2 if mode == "controller" else 1  # of 2 hosts, the Ray modes' other is a worker
    with pytest.raises(ValueError, match=rf"--train.mesh 'data=1,fsdp=4' covers data x fsdp = "
                                         rf"1 x 4 = 4 devices, but the learner has {learner}"):
        _run(_config(tmp_path, mode, "--train.mesh", "data=1,fsdp=4"))
    with pytest.raises(ValueError, match=r"--rollout.tp 2 does not divide this host's 1 "):
        _run(_config(tmp_path, mode, "--rollout.tp", "2"))
    with pytest.raises(ValueError, match=r"--rollout.tp 8 does not divide the model's "
                                         r"num_attention_heads"):
        _run(_config(tmp_path, mode, "--rollout.tp", "8", "--devices-per-host", "8",
                     "--rollout.prompts-per-step", "8"))  # 16 rows: 1 per device
