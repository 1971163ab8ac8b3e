"""--report-to (locojax/trackers.py): each tracker gets what metrics.jsonl gets, under the same
names, read back here from the files the tracker wrote: TensorBoard's event files (TFRecord
framing of tensorboardX's Event protos) and W&B's offline run file (its LevelDB-log framing
of wandb's Record protos). W&B runs offline, with its server address pointed at a closed
local port, so a test can never reach the network."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from locojax import trackers
from locojax.metrics import MetricsLogger, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = {1: {"actor/pg_loss": 0.5, "reward/mean": 0.25, "perf/timing": "label"},
         2: {"actor/pg_loss": -1.5, "reward/mean": 0.75, "perf/step_s": 2.0}}
"""Values exact in float32 (TensorBoard stores float32), and a label that is not a scalar."""


def _log(run_dir, **kwargs):
    log = MetricsLogger(str(run_dir), tensorboard=False, **kwargs)
    for step, metrics in STEPS.items():
        log.log(step, metrics)
    log.close()


def _scalars_expected():
    return {s: {k: v for k, v in m.items() if not isinstance(v, str)} for s, m in STEPS.items()}


def _tensorboard_scalars(directory):
    """{step: {tag: value}} of every scalar in the event files under `directory`."""
    from tensorboardX.proto import event_pb2

    out = {}
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        data, pos = open(path, "rb").read(), 0
        while pos < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 16 + n
            for v in event.summary.value:
                out.setdefault(event.step, {})[v.tag] = v.simple_value
    return out


def test_tensorboard_gets_the_jsonl_metrics_by_the_same_names(tmp_path):
    _log(tmp_path, report_to="tensorboard")
    assert _tensorboard_scalars(tmp_path / "tb") == _scalars_expected()
    logged = read_jsonl(str(tmp_path / "metrics.jsonl")) + read_jsonl(str(tmp_path / "perf.jsonl"))
    assert {k for r in logged for k in r if k != "step"} >= {"actor/pg_loss", "reward/mean"}


def test_none_writes_no_tracker_files(tmp_path):
    _log(tmp_path, report_to="none")
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "perf.jsonl"]


def test_an_unknown_tracker_is_refused():
    with pytest.raises(ValueError, match="--report-to must be one of none, tensorboard, wandb"):
        trackers.make("mlflow", "unused")


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ValueError, match=r"needs the wandb package: pip install 'locojax\[wandb\]'"):
        MetricsLogger(str(tmp_path), tensorboard=False, report_to="wandb")


def _wandb_records(path):
    """The Record protos of a .wandb file: a 7-byte header, then LevelDB-log records (u32
    crc, u16 length, u8 type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, part = open(path, "rb").read(), 7, 32768, b""
    while pos < len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        part += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(part)
            part = b""


def test_wandb_offline_gets_the_jsonl_metrics_by_the_same_names(tmp_path):
    """In a subprocess: W&B starts a service process and keeps global state."""
    script = (f"from tests.test_trackers import _log; _log({str(tmp_path / 'run')!r}, "
              "report_to='wandb', config={'seed': 3})")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_BASE_URL"] = "http://127.0.0.1:9"  # offline must not need it; nothing listens
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=300)
    (path,) = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert trackers.run_id(str(tmp_path / "run")) in path  # one id per run dir: resume appends
    history = {}
    for rec in _wandb_records(path):
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item}
            history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    assert history == _scalars_expected()


def test_train_refuses_wandb_without_the_package_before_any_work(tmp_path, monkeypatch,
                                                                 capsys):
    from locojax.commands.train import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["demo", "--report-to", "wandb", "--run-dir", str(tmp_path / "r")]) == 2
    assert "needs the wandb package" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
