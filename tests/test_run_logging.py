"""Step timing, metrics logs and the plot command."""

import json
import time

import jax
import jax.numpy as jnp
import pytest

from locojax.commands.plot import plot
from locojax.metrics import METRICS_FILE, PERF_FILE, MetricsLogger, read_jsonl
from locojax import profiler
from locojax.profiler import StepTimer


def test_phase_waits_for_device_work_and_excludes_compile():
    f = jax.jit(lambda x: jnp.tanh(x @ x) @ x)
    x = jnp.ones((512, 512))
    timer = StepTimer()
    with timer.phase("train") as ph:
        ph.sync(f(x))  # first call: compiles
    with timer.phase("admission"):
        time.sleep(0.05)
    m = timer.finish_step()
    assert m["perf/compile_time"] > 0
    assert m["perf/phase/admission"] >= 0.05
    assert m["perf/step_time"] >= m["perf/phase/admission"] + m["perf/phase/train"] - 1e-6
    # The step is its phases and the time between them, which is reported, not hidden.
    phases = sum(v for k, v in m.items() if k.startswith("perf/phase/"))
    assert phases + m["perf/other"] == pytest.approx(m["perf/step_time"], rel=1e-9)
    # admission is host work; train is device work
    shares = profiler.shares(m)
    assert shares["perf/host_share"] == pytest.approx(m["perf/phase/admission"] /
                                                      m["perf/step_time"])
    assert shares["perf/network_share"] == shares["perf/wait_share"] == 0.0

    with timer.phase("train") as ph:  # cached: no compile this time
        ph.sync(f(x))
    m2 = timer.finish_step()
    assert m2["perf/compile_time"] == 0.0
    assert m2["perf/phase/train"] > 0


def test_shares_and_the_spread_over_hosts():
    """A controller host's split step: its own admission, the controller's scoring (the
    controller's decode is the hosts' generation, not host work), the all-reduce, the wait."""
    perf = {"perf/step_time": 10.0, "perf/phase/admission": 0.5, "perf/phase/train_compute": 3.0,
            "perf/phase/train_collective": 1.0, "perf/phase/train_wait": 0.5,
            "perf/phase/wait_controller": 5.0, "perf/controller/phase/decode": 3.5,
            "perf/controller/phase/detokenize_reward": 1.5}
    assert profiler.shares(perf) == {"perf/host_share": pytest.approx(0.2),
                                     "perf/network_share": pytest.approx(0.1),
                                     "perf/wait_share": pytest.approx(0.05)}
    other = {**perf, "perf/step_time": 12.0, "perf/phase/train_wait": 2.5}
    spread = profiler.spread([perf, other])
    assert spread["perf/hosts/step_time/max"] == 12.0
    assert spread["perf/hosts/step_time/spread"] == 2.0
    assert spread["perf/hosts/phase/train_wait/spread"] == 2.0
    assert "perf/hosts/controller/phase/decode/max" not in spread  # the controller's own


def test_metrics_split_and_truncate_on_resume(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=True)
    for step in range(1, 6):
        log.log(step, {"reward/mean": step / 10, "perf/step_time": 0.1, "actor/kl": float("nan")})
    log.truncate_after(3)
    log.log(4, {"reward/mean": 0.4})
    log.close()
    rows = read_jsonl(str(tmp_path / METRICS_FILE))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0] == {"step": 1, "actor/kl": "nan", "reward/mean": 0.1}
    assert all("perf/step_time" not in r for r in rows)
    assert [r["step"] for r in read_jsonl(str(tmp_path / PERF_FILE))] == [1, 2, 3]
    assert any((tmp_path / "tb").iterdir())


def test_plot_writes_png(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    for step in range(1, 4):
        log.log(step, {"reward/mean": 0.1 * step, "eval/accuracy": 0.2 * step,
                       "perf/step_time": 0.5, "perf/phase/decode": 0.3, "perf/phase/train": 0.2})
    out = plot(str(tmp_path))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_several_runs_are_compared_in_one_png(tmp_path, capsys):
    from locojax.commands import plot as plot_cmd

    for seed in (0, 1):
        log = MetricsLogger(str(tmp_path / f"s{seed}"), tensorboard=False)
        for step in (0, 10):
            log.log(step, {"reward/mean": 0.1 * step + seed, "eval/accuracy": 0.3 + seed,
                           "eval/format_rate": 0.5})
    runs = [str(tmp_path / "s0"), str(tmp_path / "s1")]
    assert plot_cmd.main(runs) == 2 and "several runs need --out" in capsys.readouterr().err
    assert plot_cmd.main([*runs, "--out", str(tmp_path / "both.png")]) == 0
    with open(tmp_path / "both.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot_cmd.main([*runs, str(tmp_path / "none"), "--out", str(tmp_path / "x.png")]) == 2


def test_plot_of_a_non_run_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a locojax run directory|metrics.jsonl"):
        plot(str(tmp_path))


def test_truncate_drops_a_partial_last_line_and_names_a_broken_one(tmp_path):
    """A run killed while appending leaves half a line: resume drops it (it crashed on it);
    a last line that lacks only its newline is whole and kept; an unreadable line anywhere
    else is an error naming the file and line, not silently dropped."""
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    for step in range(1, 4):
        log.log(step, {"reward/mean": step / 10})
    path = tmp_path / METRICS_FILE
    whole = path.read_text()
    path.write_text(whole + '{"step": 4, "reward/me')  # killed mid-append
    log.truncate_after(3)
    assert path.read_text() == whole
    path.write_text(whole.rstrip("\n"))  # killed before the newline: the line is whole
    log.truncate_after(3)
    assert path.read_text() == whole
    lines = whole.splitlines(keepends=True)
    path.write_text(lines[0] + '{"step": 2, "rew\n' + lines[2])
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}:2: not a log line"):
        log.truncate_after(3)
    assert not list(tmp_path.glob("*.tmp"))  # the rewrite goes through a temporary file


def test_truncate_killed_before_its_rename_leaves_the_log_whole(tmp_path, monkeypatch):
    """Guards the atomic rewrite: a kill before the temporary file replaces the log leaves
    the log as it was (rewritten in place, it would already be cut or empty)."""
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    for step in range(1, 5):
        log.log(step, {"reward/mean": step / 10})
    before = (tmp_path / METRICS_FILE).read_text()

    def killed(*args):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr("locojax.metrics.os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        log.truncate_after(2)
    assert (tmp_path / METRICS_FILE).read_text() == before
