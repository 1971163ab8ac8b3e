"""Resume checks what it resumes (train/resume.py): another run's checkpoint is refused by
name before any work, a damaged newest checkpoint falls back to the previous one, and a
resumed run still continues bitwise (with a partial log line and a lost export on the way)."""

import dataclasses
import json
import logging
import os
import shutil

import jax.numpy as jnp
import pytest

from locojax.checkpoint import Checkpointer
from locojax.model import loader
from locojax.train import resume
from locojax.train.config import EvalConfig, RolloutConfig, demo


def _cfg(tmp_path, **overrides):
    """A 2-step run of the embedded model: 4 prompts x G 2 on the session's 8 CPU devices."""
    base = demo()
    fields = dict(
        model="embedded", mode="single", steps=2, run_dir=str(tmp_path / "run"),
        progress=False, tensorboard=False, algo=dataclasses.replace(base.algo, group_size=2),
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6, max_prompt_tokens=8),
        eval=EvalConfig(every=0), checkpoint=dataclasses.replace(base.checkpoint, every=1))
    return dataclasses.replace(base, **{**fields, **overrides})


def _replace(cfg, path, value):
    """`cfg` with the dotted field `path` set to `value`."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: _replace(getattr(cfg, head), rest, value)})


def _state(seed):
    return {"w": jnp.full((4,), float(seed)), "step": jnp.asarray(seed)}


def _save_like_a_run(cfg, steps, state=_state):
    ckpt = Checkpointer(resume.checkpoint_dir(cfg))
    for s in steps:
        ckpt.save(s, state(s), {"next_step": s, **resume.recorded(cfg), "rollouts": {}})
    ckpt.close()


# --- the config and the inputs -------------------------------------------------------------


def test_differences_are_the_fields_that_may_not_change(tmp_path):
    cfg = _cfg(tmp_path)
    saved = resume.as_json(cfg)
    assert resume.differences(saved, cfg) == []
    for name, value in [("steps", 9), ("time_limit_s", 60.0), ("eval.every", 5),
                        ("checkpoint.keep", 7), ("progress", True), ("grad_accum", 2),
                        ("run_dir", "/elsewhere"), ("placement.lease_timeout_s", 9.0)]:
        assert resume.differences(saved, _replace(cfg, name, value)) == [], name
    for name, value in [("optim.lr", 3e-4), ("seed", 1), ("algo.beta", 0.04),
                        ("rollout.temperature", 0.7), ("mode", "colocated"),
                        ("placement.max_staleness", 2), ("task.level", 1)]:
        assert resume.differences(saved, _replace(cfg, name, value)) == [name], name
    # The model and the data are compared by content (fingerprints), not by path.
    assert resume.differences(saved, _replace(cfg, "model", "/moved/model")) == []
    # A field the checkpoint predates counts only when the run leaves its default.
    del saved["algo"]["beta"]
    assert resume.differences(saved, cfg) == []
    assert resume.differences(saved, _replace(cfg, "algo.beta", 0.5)) == ["algo.beta"]


def test_fingerprints_compare_content_not_path(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    moved = tmp_path / "moved.jsonl"
    shutil.copy(data, moved)
    assert resume.fingerprint_path(data) == resume.fingerprint_path(moved)
    moved.write_text('{"question": "1+1", "answer": "3"}\n')
    assert resume.fingerprint_path(data) != resume.fingerprint_path(moved)
    model = tmp_path / "model"
    shutil.copytree(loader.EMBEDDED["embedded"], model)
    whole = resume.fingerprint_path(model, resume.MODEL_FILES)
    (model / "README.md").write_text("not read by a run")
    assert resume.fingerprint_path(model, resume.MODEL_FILES) == whole
    raw = bytearray((model / "model.safetensors").read_bytes())
    raw[-1] ^= 1  # one bit of the last weight
    (model / "model.safetensors").write_bytes(bytes(raw))
    assert resume.fingerprint_path(model, resume.MODEL_FILES) != whole


def test_another_runs_checkpoint_is_refused_naming_what_differs(tmp_path, caplog):
    """Guards `check`: a changed lr, another model directory (the KL reference too) and
    other data are each refused by name; the listed fields are not; force resumes and logs."""
    model = tmp_path / "model"
    shutil.copytree(loader.EMBEDDED["embedded"], model)
    cfg = _cfg(tmp_path, model=str(model))
    _save_like_a_run(cfg, [1])
    resume.check(_replace(cfg, "steps", 5))  # may change
    with pytest.raises(ValueError, match=r"config fields optim\.lr \(0\.0001 -> 0\.0003\)") as e:
        resume.check(_replace(cfg, "optim.lr", 3e-4))
    assert "--checkpoint.resume-force" in str(e.value)
    other = tmp_path / "other"
    shutil.copytree(loader.EMBEDDED["embedded-strict"], other)
    resume._CACHE.clear()
    with pytest.raises(ValueError, match=r"inputs model \(the model directory, also the KL "):
        resume.check(_replace(cfg, "model", str(other)))
    caplog.set_level(logging.WARNING, logger="locojax")
    resume.check(_replace(_replace(cfg, "optim.lr", 3e-4), "checkpoint.resume_force", True))
    assert "resuming anyway" in caplog.text and "optim.lr" in caplog.text
    with pytest.raises(ValueError, match="pass --checkpoint.resume to continue it"):
        resume.check(_replace(cfg, "checkpoint.resume", False))


def test_changed_data_is_refused(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    cfg = _cfg(tmp_path, task=dataclasses.replace(demo().task, name="gsm8k", data=str(data)))
    resume._CACHE.clear()
    _save_like_a_run(cfg, [1])
    data.write_text('{"question": "1+1", "answer": "3"}\n')
    resume._CACHE.clear()
    with pytest.raises(ValueError, match=r"inputs task\.data \(the data\)"):
        resume.check(cfg)


# --- restore -------------------------------------------------------------------------------


def _damage(ckpt_dir, step):
    """Overwrite every array data file of checkpoint `step` (a bad disk, a partial copy)."""
    hit = 0
    for root, _, files in os.walk(os.path.join(ckpt_dir, str(step), "state")):
        if os.path.basename(root) == "d":
            for name in files:
                with open(os.path.join(root, name), "wb") as f:
                    f.write(b"damaged")
                hit += 1
    assert hit, "nothing damaged: the test would check nothing"


# Orbax leaves the damaged read's futures unretrieved; Python reports them when collected.
DAMAGE_WARNINGS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@DAMAGE_WARNINGS
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    cfg = _cfg(tmp_path)
    _save_like_a_run(cfg, [1, 2])
    directory = resume.checkpoint_dir(cfg)
    _damage(directory, 2)
    caplog.set_level(logging.WARNING, logger="locojax")
    ckpt = Checkpointer(directory)
    got = resume.restore(cfg, ckpt, _state(0), is_main=True)
    assert got.step == 1 and float(got.state["w"][0]) == 1.0
    assert "checkpoint 2 cannot be restored" in caplog.text
    assert "resumed from checkpoint 1" in caplog.text
    assert ckpt.all_steps() == [1] and os.path.isdir(os.path.join(directory, "2.unrestorable"))
    ckpt.save(2, _state(2), {"next_step": 2})  # the step can be written again
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()
    _damage(directory, 1)
    _damage(directory, 2)
    with pytest.raises(RuntimeError, match=r"no checkpoint under .* can be restored \(tried "
                                            r"\[2, 1\]"):
        resume.restore(cfg, Checkpointer(directory), _state(0), is_main=True)


def test_a_forced_resume_that_does_not_fit_names_the_fields(tmp_path):
    """Not Orbax's shape error: the fields the force went past."""
    cfg = _cfg(tmp_path)
    _save_like_a_run(cfg, [1])
    forced = _replace(_replace(cfg, "rollout.max_new_tokens", 9), "checkpoint.resume_force", True)
    like = {"w": jnp.zeros((5,)), "step": jnp.asarray(0)}  # another shape
    with pytest.raises(ValueError, match=r"checkpoint 1 .* does not fit this run "
                                         r"\(--checkpoint.resume-force went past differences "
                                         r"in rollout.max_new_tokens\)"):
        resume.restore(forced, Checkpointer(resume.checkpoint_dir(cfg)), like, is_main=True)


def test_export_is_redone_when_missing_incomplete_or_of_another_step(tmp_path, caplog):
    """Guards `export_if_missing`: an export of this step that is whole is kept as it is;
    one missing, cut short (no metadata file, written last) or of an earlier step is redone."""
    cfg, model = _cfg(tmp_path), loader.load("embedded")
    path = tmp_path / "final_model"
    caplog.set_level(logging.WARNING, logger="locojax")

    def export(step):
        caplog.clear()
        resume.export_if_missing(str(path), cfg, model.cfg, model.weights, step)
        return "exporting step" in caplog.text

    assert export(2) and loader.is_complete(path) and loader.read_meta(path)["steps"] == 2
    assert not export(2)  # whole and of this step: kept
    (path / loader.META_FILE).unlink()  # an in-place export killed before its last file
    assert export(2) and loader.is_complete(path)
    assert export(3) and loader.read_meta(path)["steps"] == 3


# --- a whole run ---------------------------------------------------------------------------


@pytest.mark.slow
@DAMAGE_WARNINGS
def test_resume_after_damage_continues_bitwise(tmp_path, caplog):
    """A 2-step run; then its newest checkpoint is damaged, its export deleted and a half
    line appended to its metrics: the resumed run restores checkpoint 1, trains step 2 again
    and ends with the same params and log, bytes for bytes. Then, resumed at its end with
    the export gone again, it only exports. A changed lr is refused before any compile."""
    from locojax.train import wiring
    from locojax.train.loop import start

    cfg = _cfg(tmp_path)
    run = tmp_path / "run"
    start(cfg, wiring.join("single")).run()
    final = (run / "final_model" / "model.safetensors").read_bytes()
    metrics = (run / "metrics.jsonl").read_bytes()
    assert final != (loader.EMBEDDED["embedded"] / "model.safetensors").read_bytes()

    _damage(str(run / "checkpoints"), 2)
    shutil.rmtree(run / "final_model")
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "rew')
    caplog.set_level(logging.INFO, logger="locojax")
    trainer = start(cfg, wiring.join("single"))
    assert trainer.start_step == 1 and "checkpoint 2 cannot be restored" in caplog.text
    trainer.run()
    assert (run / "final_model" / "model.safetensors").read_bytes() == final
    assert (run / "metrics.jsonl").read_bytes() == metrics

    shutil.rmtree(run / "final_model")
    caplog.clear()
    trainer = start(cfg, wiring.join("single"))
    assert trainer.start_step == 2 and "exporting step 2 again" in caplog.text
    assert (run / "final_model" / "model.safetensors").read_bytes() == final
    trainer.run()  # nothing left to train

    caplog.clear()
    with pytest.raises(ValueError, match=r"optim\.lr"):
        start(_replace(cfg, "optim.lr", 1.0), wiring.join("single"))
    assert "compiling" not in caplog.text
    assert json.loads((run / "final_model" / "locojax.json").read_text())["steps"] == 2


# --- I/O errors, set-aside checkpoints, the metrics log (issue 38) -------------------------


class _Flaky:
    """A Checkpointer whose first `fails` restores raise `error` (a disk or network fault)."""

    def __init__(self, ckpt, error, fails):
        self.ckpt, self.error, self.fails = ckpt, error, fails

    def __getattr__(self, name):
        return getattr(self.ckpt, name)

    def restore(self, step, like):
        if self.fails:
            self.fails -= 1
            raise self.error
        return self.ckpt.restore(step, like)


IO_ERRORS = [
    OSError(5, "Input/output error", "/ckpt/2/state/d/abc"),
    # tensorstore's form of an EIO (absl maps EIO to UNAVAILABLE), as Orbax re-raises it
    ValueError('UNAVAILABLE: Error reading local file "/ckpt/2/state/d/abc": [OS error: '
               'Input/output error]'),
]


@pytest.mark.parametrize("error", IO_ERRORS, ids=["oserror", "tensorstore"])
def test_an_io_error_is_retried_and_never_sets_a_checkpoint_aside(tmp_path, caplog,
                                                                  monkeypatch, error):
    """One transient read error used to set both good checkpoints aside. Now it is retried;
    one that persists stops the run naming the file, and both checkpoints stay listed."""
    monkeypatch.setattr(resume, "IO_RETRY_DELAY_S", 0.0)
    cfg = _cfg(tmp_path)
    _save_like_a_run(cfg, [1, 2])
    directory = resume.checkpoint_dir(cfg)
    caplog.set_level(logging.WARNING, logger="locojax")
    got = resume.restore(cfg, _Flaky(Checkpointer(directory), error, 1), _state(0), True)
    assert got.step == 2 and "I/O error reading /ckpt/2/state/d/abc" in caplog.text
    with pytest.raises(resume.CheckpointIOError,
                       match=r"checkpoint 2: reading /ckpt/2/state/d/abc failed 3 times"):
        resume.restore(cfg, _Flaky(Checkpointer(directory), error, 99), _state(0), True)
    assert Checkpointer(directory).all_steps() == [1, 2]
    assert resume.set_aside_names(directory) == []


def test_a_defect_is_not_an_io_error():
    """What `restore` sets aside: decoding and structure errors, and a missing file."""
    for e in IO_ERRORS + [TimeoutError("read timed out"), PermissionError(13, "denied")]:
        assert resume.is_io_error(e), e
    for e in [ValueError('OUT_OF_RANGE: Error reading "w/.zarray" in OCDBT database at local '
                         'file "/c/2/state/"'),
              ValueError("Requested shape: (5,) is not compatible with the stored shape"),
              FileNotFoundError(2, "No such file", "/c/1/meta/metadata"), KeyError("state")]:
        assert not resume.is_io_error(e), e


@DAMAGE_WARNINGS
def test_set_aside_checkpoints_never_start_the_run_again_from_step_0(tmp_path):
    """After every checkpoint was set aside, the next start trained from step 0 and wiped
    metrics.jsonl. Now it is refused (before any work), saying what to do."""
    from locojax.train import wiring
    from locojax.train.loop import start

    cfg = _cfg(tmp_path)
    _save_like_a_run(cfg, [1])
    directory = resume.checkpoint_dir(cfg)
    _damage(directory, 1)
    with pytest.raises(RuntimeError, match=r"tried \[1\]"):
        resume.restore(cfg, Checkpointer(directory), _state(0), is_main=True)
    assert resume.set_aside_names(directory) == ["1.unrestorable"]
    log = tmp_path / "run" / "metrics.jsonl"
    log.write_text('{"step": 1, "reward": 0.5}\n')
    for attempt in (lambda: resume.check(cfg),
                    lambda: resume.restore(cfg, Checkpointer(directory), _state(0), True),
                    lambda: start(cfg, wiring.join("single"))):
        with pytest.raises(RuntimeError, match=r"set aside: 1\.unrestorable\), and starting "
                                               r"again from step 0 would lose the run") as e:
            attempt()
        assert "rename <step>.unrestorable back to <step>" in str(e.value)
        assert "choose another --run-dir" in str(e.value)
    assert log.read_text() == '{"step": 1, "reward": 0.5}\n'


def test_the_metrics_log_is_repaired_to_the_checkpoints_step(tmp_path, caplog):
    """Lines after the restored step and a cut last line are dropped; steps up to it that
    have no line are named in a warning, not left a silent gap."""
    from locojax.metrics import METRICS_FILE, MetricsLogger

    path = tmp_path / METRICS_FILE
    rows = "".join(json.dumps({"step": s, "r": s / 10}) + "\n" for s in (0, 1, 2, 3, 4))
    logger = MetricsLogger(str(tmp_path), tensorboard=False)
    caplog.set_level(logging.WARNING, logger="locojax")
    path.write_text(rows + '{"step": 5, "r"')
    logger.truncate_after(3)
    assert path.read_text() == "".join(rows.splitlines(keepends=True)[:4])
    assert "no line for step" not in caplog.text
    path.write_text(rows[:rows.index('{"step": 3')] + '{"step": 3, "r')  # cut at step 3
    logger.truncate_after(6)
    assert path.read_text() == rows[:rows.index('{"step": 3')]
    assert "no line for step(s) 3-6, up to the checkpoint's step 6 (its last line is step 2)" \
        in caplog.text
    caplog.clear()
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 3)))
    logger.truncate_after(3)
    assert "no line for step(s) 2, up to" in caplog.text


def test_task_reward_must_match_in_any_of_its_spellings(tmp_path):
    """task.reward is what the run is trained on: a change is refused. A checkpoint written
    while it was one string ("strict", "flexible") resumes a run asking for the same reward,
    and weights left out mean 1 each."""
    cfg = _cfg(tmp_path)
    saved = resume.as_json(cfg)
    for old, now in [("strict", ()), ("strict", ("strict",)), ("flexible", ("flexible",))]:
        saved["task"]["reward"] = old
        assert resume.differences(saved, _replace(cfg, "task.reward", now)) == [], (old, now)
    saved["task"]["reward"] = "strict"
    assert resume.differences(saved, _replace(cfg, "task.reward", ("flexible",))) \
        == ["task.reward"]
    user = dataclasses.replace(cfg.task, reward=("r.py:a", "r.py:b"), reward_weights=())
    saved = resume.as_json(dataclasses.replace(cfg, task=user))
    ones = dataclasses.replace(user, reward_weights=(1.0, 1.0))
    assert resume.differences(saved, dataclasses.replace(cfg, task=ones)) == []
    other = dataclasses.replace(user, reward_weights=(1.0, 0.2))
    assert resume.differences(saved, dataclasses.replace(cfg, task=other)) \
        == ["task.reward_weights"]
    swapped = dataclasses.replace(user, reward=("r.py:b", "r.py:a"))
    assert resume.differences(saved, dataclasses.replace(cfg, task=swapped)) == ["task.reward"]


def test_an_auto_prompt_width_resumes_the_width_it_resolved_to(tmp_path):
    """A checkpoint records the resolved width (auto: from the data, which is fingerprinted):
    a run asking for auto again resumes it; another explicit width is refused."""
    cfg = _cfg(tmp_path)
    saved = resume.as_json(cfg)  # max_prompt_tokens=8, as auto resolved it
    auto = dataclasses.replace(cfg.rollout, max_prompt_tokens="auto")
    assert resume.differences(saved, dataclasses.replace(cfg, rollout=auto)) == []
    other = dataclasses.replace(cfg.rollout, max_prompt_tokens=16)
    assert resume.differences(saved, dataclasses.replace(cfg, rollout=other)) \
        == ["rollout.max_prompt_tokens"]
