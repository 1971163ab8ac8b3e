"""`--train.mesh data=D,fsdp=F` and `--rollout.tp N`: the settings, the reshard between the
two layouts, and FSDP runs of `locojax train` end to end.

Guards: bad settings are refused naming the setting (while parsing, or before any work when
they depend on the devices); the wiring lays the learner out as the setting says (params
really sharded over `fsdp`) and the rollout as `--rollout.tp` says; the reshard from the
one to the other moves the weights without changing a bit; and a 2-step FSDP run trains,
logs `perf/phase/reshard`, and is bitwise the same run as single and as colocated (the mode
equivalence of tests/test_train_loop.py with FSDP on).
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from fsdp_run import FSDP_ARGS, FSDP_STEPS, tokens_by_step

from locojax import float_context
from locojax.distributed import HostInfo
from locojax.model import config as model_config
from locojax.model import params as params_lib
from locojax.model.sharding import weight_shardings
from locojax.train import meshes, wiring
from locojax.train.config import RolloutConfig, RunConfig
from locojax.train.meshes import TrainConfig, parse_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text, sizes", [
    ("", {}),
    ("data=2,fsdp=4", {"data": 2, "fsdp": 4}),
    (" fsdp = 8 ", {"fsdp": 8}),
    ("fsdp=2,data=1", {"data": 1, "fsdp": 2}),  # laid out data-major whatever the order
])
def test_mesh_setting_parses(text, sizes):
    assert parse_mesh(text) == sizes


@pytest.mark.parametrize("text, message", [
    ("data=0,fsdp=2", "data='0' must be a whole number >= 1"),
    ("data=2,fsdp=-1", "fsdp='-1' must be a whole number >= 1"),
    ("data=two", "data='two' must be a whole number >= 1"),
    ("tensor=2", "unknown axis 'tensor'; the axes are data, fsdp"),
    ("data=2,data=2", "axis 'data' is given twice"),
    ("data2", "'data2' is not AXIS=SIZE"),
    (",", "no axis given"),
])
def test_bad_mesh_setting_is_refused_naming_it(text, message):
    with pytest.raises(ValueError, match="--train.mesh") as e:
        TrainConfig(mesh=text)
    assert message in str(e.value)


def test_mesh_must_cover_the_learners_devices():
    assert TrainConfig("data=2,fsdp=4").shape(8) == {"data": 2, "fsdp": 4}
    assert TrainConfig("data=8").shape(8) == {"data": 8}  # fsdp 1: plain data parallel
    assert TrainConfig("").shape(8) == {"data": 8}
    with pytest.raises(ValueError, match=r"data x fsdp = 1 x 2 = 2 devices, but the learner "
                                         r"has 8: the product must equal 8"):
        TrainConfig("fsdp=2").shape(8)
    assert TrainConfig("data=4,fsdp=2").rules == "train_fsdp"
    assert TrainConfig("data=8,fsdp=1").rules == TrainConfig().rules == "train_dp"


def test_run_config_wires_fsdp_into_the_learner_in_every_mode():
    """Every mode takes both settings (the Ray modes' refusals of layouts that do not fit:
    tests/test_fleet_refusals.py)."""
    for mode in ("single", "colocated", "controller", "disaggregated", "async"):
        cfg = RunConfig(mode=mode, train=TrainConfig("data=1,fsdp=2"),
                        rollout=RolloutConfig(tp=2))
        assert cfg.learner_config().rules == "train_fsdp"
    assert RunConfig(mode="single").learner_config().rules == "train_dp"
    with pytest.raises(ValueError, match="rollout.tp must be >= 1"):
        RolloutConfig(tp=0)
    with pytest.raises(ValueError, match="--profile-split times a data-parallel step"):
        RunConfig(mode="single", train=TrainConfig("fsdp=2"), profile_split=True)


def test_tp_must_divide_the_hosts_devices_and_the_model():
    with pytest.raises(ValueError, match="--rollout.tp 3 does not divide this host's 8"):
        meshes.check_tp(3, 8)
    cfg = model_config.tiny()  # 4 heads, ffn 128
    meshes.check_tp_model(4, cfg)
    with pytest.raises(ValueError, match=r"--rollout.tp 8 does not divide the model's "
                                         r"num_attention_heads \(4\)"):
        meshes.check_tp_model(8, cfg)


def _host():
    return HostInfo(process_id=0, num_processes=1)


def test_export_refuses_a_shard_for_the_weight(tmp_path):
    """`loader.save` of FSDP-sharded params would write one shard as the whole weight."""
    from locojax.model import loader

    w = wiring.Single(_host(), TrainConfig("fsdp=8"))
    cfg = model_config.tiny()
    params = jax.device_put(params_lib.init(cfg, jax.random.key(0)),
                            weight_shardings(cfg, w.train_mesh, w.train_rules))
    with pytest.raises(ValueError, match="is sharded"):
        loader.save(tmp_path / "m", cfg, params, "tiny")


def locojax(*args, timeout=900, check=True):
    out = subprocess.run([sys.executable, "-m", "locojax.cli", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"locojax {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


@pytest.mark.parametrize("args, message", [
    (["--train.mesh", "data=0"], "--train.mesh 'data=0': data='0' must be a whole number"),
    (["--train.mesh", "data=1,fsdp=4", "--devices-per-host", "2"],
     "--train.mesh 'data=1,fsdp=4' covers data x fsdp = 1 x 4 = 4 devices, but the learner "
     "has 2"),
    (["--rollout.tp", "2", "--devices-per-host", "1"],
     "--rollout.tp 2 does not divide this host's 1 device(s)"),
])
def test_cli_refuses_bad_layout_settings_before_any_work(args, message, tmp_path):
    out = locojax("train", "demo", "--model", "tiny", "--mode", "single", "--run-dir",
                  str(tmp_path / "r"), *args, check=False, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in " ".join(out.stderr.replace("│", " ").split())
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.fixture(scope="module")
def fsdp_runs(fsdp_colocated, tmp_path_factory):
    """The FSDP reference run (tests/fsdp_run.py: 2 colocated hosts x 1 device, the fsdp axis
    spanning the hosts) and the same setting as one process x 2 devices (single)."""
    single = tmp_path_factory.mktemp("fsdp_single") / "single"
    locojax("train", "demo", *FSDP_ARGS, "--mode", "single", "--devices-per-host", "2",
            "--run-dir", str(single))
    return single, fsdp_colocated


def _final(run_dir):
    from locojax.model.loader import load

    return load(os.path.join(run_dir, "final_model"), param_dtype="float32").weights


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp_run_trains_and_single_and_colocated_agree(fsdp_runs):
    """`--train.mesh data=1,fsdp=2` trains 2 steps with `--devices-per-host 2`, times the
    reshard each step, and gives bitwise the same rollouts and params as the same setting
    over 2 colocated hosts. Bitwise, as tests/test_train_loop.py argues for data parallel:
    both run one SPMD program over the same 2-device mesh; FSDP's collectives are all-gathers
    (copies) and a 2-way reduce-scatter (one IEEE add, commutative); only the transport
    differs (in-process or gloo)."""
    from locojax.model.loader import load

    single, colo = fsdp_runs
    perf = [json.loads(line) for line in open(single / "perf.jsonl")]
    assert len(perf) == FSDP_STEPS and all(p["perf/phase/reshard"] > 0 for p in perf)
    ta, tb = tokens_by_step(str(single)), tokens_by_step(str(colo))
    assert sorted(ta) == sorted(tb) and len(ta) == FSDP_STEPS
    for step in ta:
        np.testing.assert_array_equal(ta[step], tb[step])
    float_context.same_or_raise(str(single), str(colo))  # the precondition of bitwise
    pa, pb = _final(str(single)), _final(str(colo))
    p0 = load("embedded", param_dtype="float32").weights
    moved = False
    for a, b, c in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), jax.tree.leaves(p0),
                       strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        moved |= not np.array_equal(np.asarray(a), np.asarray(c))
    assert moved, "the steps did not change the params: the comparison would be vacuous"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp_run_resumes_bitwise(fsdp_runs, tmp_path):
    """The single FSDP run (`--train.mesh data=1,fsdp=2`, a checkpoint every step), its last
    checkpoint and export lost: resumed from checkpoint 1, it trains step 2 again and ends
    with the same params and metrics log, byte for byte (the data-parallel version is
    tests/test_resume.py's `test_resume_after_damage_continues_bitwise`). The checkpoint
    holds the params whole, each host writing its shards (tests/test_checkpoint.py)."""
    single, _ = fsdp_runs
    run = tmp_path / "run"
    shutil.copytree(single, run)
    shutil.rmtree(run / "checkpoints" / str(FSDP_STEPS))
    shutil.rmtree(run / "final_model")
    locojax("train", "demo", *FSDP_ARGS, "--mode", "single", "--devices-per-host", "2",
            "--run-dir", str(run))
    float_context.same_or_raise(str(single), str(run))
    for name in ("final_model/model.safetensors", "metrics.jsonl"):
        assert (run / name).read_bytes() == (single / name).read_bytes(), name
    # Resumed, not run again from the start: step 1's timings are the first run's line.
    first, again = ((d / "perf.jsonl").read_text().splitlines() for d in (single, run))
    assert len(again) == FSDP_STEPS and again[0] == first[0]
