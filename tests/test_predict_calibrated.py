"""`locojax predict calibrate`'s profile and the device model that reads it
(`locojax/predict/calibrate.py`, `calibrated.py`), from a made-up measurement: nothing is
timed here, every expected figure is computed by hand from the numbers below."""

import json

import pytest

from locojax.model import config
from locojax.predict import calibrate, calibrated, devices, hardware, phases
from locojax.predict.flops import Costs
from locojax.predict.origin import Ledger

MEASURED = {
    "cores": 2, "peak_flops": 4e10, "flops_per_core": 3e10, "hbm_bandwidth": 2e10,
    "program_overhead": {"prefill": {"fixed": 1e-3, "per_layer": 2e-4},
                         "decode_step": {"fixed": 5e-5, "per_layer": 1e-5},
                         "train": {"fixed": 2e-3, "per_layer": 5e-4}},
    "program_rates": {"prefill": 2e10, "decode_step": 1e10, "train": 1e10},
    "host_rates": {"admission_per_prompt": 1e-6, "reward_fixed": 3e-4,
                   "reward_per_row.arith": 2e-5, "batch_fixed": 5e-4, "batch_per_row": 3e-7,
                   "step_fixed": 1e-4},
    "collectives": {"dcn_latency": 1e-4, "dcn_bandwidth": 1e9, "samples": {"4096": 2e-4}},
}


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "here.json"
    path.write_text(json.dumps(calibrate.profile(MEASURED, "now", "0.0")))
    return path


def _workload():
    """4 prompts x G 4, P 16, every completion 32 tokens: the host and train phases' shape."""
    from locojax.predict.workload import Lengths, Workload

    return Workload("w", 4, 4, 16, 32, Lengths.fixed(32, "test"))


def _model(path, cfg=None):
    hw = hardware.load(str(path))
    layers = (cfg or config.tiny()).num_hidden_layers
    return devices.device_model(hw, "float32", layers, Ledger())


def test_a_calibrated_profile_loads_and_picks_its_device_model(profile_file):
    dev = _model(profile_file)
    assert isinstance(dev, calibrated.Calibrated) and dev.layers == 2


def test_program_time_is_overhead_plus_the_roofline(profile_file):
    """TINY (2 layers): compute-bound, memory-bound, one core, half a core. Exact up to f64
    rounding of a few operations on numbers near 1e-3 (rel 1e-12 is far above it)."""
    dev = _model(profile_file)
    # All cores: the train rate, 1e10. 4e8 FLOPs -> 40 ms; 1e6 bytes -> 50 µs.
    t = dev.seconds("train", Costs(4e8, 1e6), cores=2)
    assert t == pytest.approx(2e-3 + 2 * 5e-4 + 4e8 / 1e10, rel=1e-12)
    # Memory-bound: 2e9 bytes at 2e10 B/s = 0.1 s against 1e6 FLOPs.
    t = dev.seconds("decode_step", Costs(1e6, 2e9), cores=2)
    assert t == pytest.approx(5e-5 + 2 * 1e-5 + 2e9 / 2e10, rel=1e-12)
    # One core: the prefill rate 2e10 scaled as the matmul scales, 3e10 / 4e10.
    one = dev.seconds("prefill", Costs(3e8, 0.0), cores=1)
    assert one == pytest.approx(1e-3 + 2 * 2e-4 + 3e8 / (2e10 * 3e10 / 4e10), rel=1e-12)
    # Half a core: time-sliced, twice that; a no-grad forward is costed as a prefill.
    assert dev.seconds("prefill", Costs(3e8, 0.0), cores=0.5) == pytest.approx(2 * one,
                                                                               rel=1e-12)
    assert dev.seconds("forward", Costs(3e8, 0.0), cores=1) == pytest.approx(one, rel=1e-12)


def test_a_profile_without_program_rates_uses_the_matmul_rate(tmp_path):
    prof = calibrate.profile(MEASURED, "now", "0.0")
    del prof["program_rates"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    t = _model(path).seconds("prefill", Costs(3e8, 0.0), cores=1)
    assert t == pytest.approx(1e-3 + 2 * 2e-4 + 3e8 / 3e10, rel=1e-12)


def test_the_measured_host_rates_replace_the_shipped_ones(profile_file):
    hw = hardware.load(str(profile_file))
    rates = calibrated.with_host_rates(phases.host_rates(), hw)
    assert float(rates["admission_per_prompt"]) == 1e-6
    assert float(rates["reward_per_row"]["arith"]) == 2e-5
    assert float(rates["step_fixed"]) == 1e-4
    shipped = phases.host_rates()  # other tasks keep the shipped rates
    assert float(rates["reward_per_row"]["gsm8k"]) == float(shipped["reward_per_row"]["gsm8k"])
    # Any other profile: unchanged.
    assert calibrated.with_host_rates(shipped, hardware.load("v5e")) is shipped


def test_host_phases_add_the_calibrated_fixed_part_to_the_rows_part(profile_file):
    """reward = reward_fixed + rows x reward_per_row; batch likewise; the shipped rates, which
    an accelerator's profile uses, have no fixed part (through-origin fits)."""
    wl = _workload()
    hw = hardware.load(str(profile_file))
    ctx = phases.Ctx(config.tiny(), "tiny", wl, hardware.Cluster(hw, 1), dtype="float32")
    assert ctx.reward(64) == pytest.approx(3e-4 + 64 * 2e-5, rel=1e-12)  # float sums only
    assert ctx.batch(64) == pytest.approx(5e-4 + 64 * 3e-7, rel=1e-12)
    shipped = phases.Ctx(config.tiny(), "tiny", wl, hardware.parse_cluster("v5e-1"),
                         dtype="float32")
    per_row = shipped.rate("batch_per_row") / shipped.hw("host_core_speed")
    assert shipped.batch(64) == pytest.approx(64 * per_row, rel=1e-12)


def test_here_without_a_calibration_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "CALIBRATED", tmp_path / "none.json")
    with pytest.raises(hardware.UnknownHardware, match="run `locojax predict calibrate`"):
        hardware.parse_cluster("here-2")


def test_here_reads_the_calibrated_profile(profile_file, monkeypatch):
    monkeypatch.setattr(hardware, "CALIBRATED", profile_file)
    cl = hardware.parse_cluster("here-2")
    assert cl.hw.kind == "calibrated" and cl.chips == 2 and cl.shared_cores == 2


def test_the_example_profile_is_announced_once(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "_noted", set())
    hardware.load("cpu-here")
    hardware.load("cpu-here")
    err = capsys.readouterr().err
    assert err.count("cpu-here is an EXAMPLE profile") == 1
    assert "locojax predict calibrate" in err


def test_a_profile_without_a_kinds_overhead_names_it(tmp_path):
    prof = calibrate.profile(MEASURED, "now", "0.0")
    del prof["program_overhead"]["train"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    with pytest.raises(ValueError, match="no program_overhead.train"):
        _model(path).seconds("train", Costs(1.0, 1.0))


def test_calibrate_refuses_an_unknown_argument(capsys):
    from locojax.commands import predict_calibrate

    assert predict_calibrate.main(["--bogus"]) == 2
    assert "unknown argument '--bogus'" in capsys.readouterr().err


def test_a_calibrated_machines_gradient_all_reduce_is_not_hidden(profile_file):
    """A calibrated profile is a CPU machine whose hosts are processes joined by gloo: the
    all-reduce runs between the step's computations, so all of it is exposed; a colocated step on two of its hosts carries the whole ring
    all-reduce of the f32 gradients (the accelerators' overlap would leave one layer's)."""
    from locojax.predict import modes

    wl = _workload()
    hw = hardware.load(str(profile_file))
    cfg = config.tiny()
    ctx = phases.Ctx(cfg, "tiny", wl, hardware.Cluster(hw, 2), dtype="float32")
    assert hw.is_cpu and ctx.exposed_collectives(1.0, 100.0) == 1.0
    ici, dcn = ctx.train_network(2, 2)
    ring = 2 * 1e-4 + 4.0 * cfg.num_params() / 1e9  # p = 2: 2 (p - 1) α + 2 (p - 1) / p · m / β
    assert ici + dcn == pytest.approx(ring, rel=1e-9)  # a few float sums
    assert modes.colocated(ctx).phases["allreduce"] == pytest.approx(ring, rel=1e-9)


def test_a_calibrated_machines_bf16_activations_carry_xla_cpus_f32_copies(profile_file):
    """On a CPU XLA upcasts both operands of a bf16 dot, so each bf16 residual the backward
    keeps has an f32 copy (train_memory._residual_bytes): a calibrated profile is a CPU, and
    its plan's activations are the shipped example's (cpu-here), byte for byte."""
    from locojax.predict import memory

    wl = _workload()
    plans = [memory.plan_for(phases.Ctx(config.tiny(), "tiny", wl, cluster, dtype="bfloat16"),
                             1, 1, 1, False).parts["activations"]
             for cluster in (hardware.Cluster(hardware.load(str(profile_file)), 1),
                             hardware.parse_cluster("cpu-here-1"))]
    assert plans[0] == plans[1] > 0
