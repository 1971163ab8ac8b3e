"""`locojax predict calibrate` on an accelerator (locojax/predict/calibrate_device.py) and the
device model reading its profile (`calibrated.py`), from a made-up measurement of a v5e:
nothing is timed here but the two small probes at the end, and every expected figure is
computed by hand from the numbers below."""

import json
import math

import pytest

from locojax.model import config
from locojax.predict import calibrate, calibrate_device, devices, hardware
from locojax.predict.flops import Costs
from locojax.predict.origin import Ledger

KINDS = ("prefill", "decode_step", "train")
MEASURED = {
    "cores": 13, "platform": "tpu",
    "device": {"kind": "TPU v5 lite", "chips": 1, "memory": 15.7e9},
    "matmul_rates": {"float32": 1.2e14, "bfloat16": 1.9e14}, "hbm_bandwidth": 8e11,
    "program_overhead": {
        "float32": {k: {"fixed": 4e-4, "per_layer": 5e-5} for k in KINDS},
        "bfloat16": {k: {"fixed": 3e-4, "per_layer": 4e-5} for k in KINDS}},
    "program_rates": {"float32": {k: 4e13 for k in KINDS},
                      "bfloat16": {k: 1e14 for k in KINDS}},
    "host_rates": {"admission_per_prompt": 1e-6, "reward_fixed": 3e-4,
                   "reward_per_row.arith": 2e-5, "batch_fixed": 5e-4, "batch_per_row": 3e-7,
                   "step_fixed": 1e-4},
}


@pytest.fixture
def chip_profile(tmp_path):
    path = tmp_path / "here.json"
    path.write_text(json.dumps(calibrate.profile(MEASURED, "now", "0.0")))
    return path


def _model(path, dtype):
    layers = config.tiny().num_hidden_layers  # TINY: 2 layers
    return devices.device_model(hardware.load(str(path)), dtype, layers, Ledger())


def test_a_chip_profile_is_an_accelerator_with_its_presets_links(chip_profile):
    hw = hardware.load(str(chip_profile))
    assert hw.kind == "calibrated" and hw.platform == "tpu" and not hw.is_cpu
    assert hw.peak("bfloat16").value == 1.9e14 and hw.hbm_bytes.value == 15.7e9
    v5e = hardware.load("tpu-v5e")
    for key in calibrate_device.LINKS:  # copied, and saying so
        assert getattr(hw, key).value == getattr(v5e, key).value
        assert "copied from the shipped tpu-v5e profile" in getattr(hw, key).source
    assert hw.ici_topology == v5e.ici_topology
    assert not hardware.Cluster(hw, 1).shared_cores  # a chip is not the host's cores


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_chip_program_costs_its_dtypes_overhead_and_rate(chip_profile, dtype):
    """The run's compute dtype picks its own measured rate and overhead; the host's cores do
    not scale a chip's programs, not even below one core. Exact up to f64 rounding of a few
    operations on numbers near 1e-3 (rel 1e-12 is far above it)."""
    dev = _model(chip_profile, dtype)
    over = MEASURED["program_overhead"][dtype]["train"]
    rate = MEASURED["program_rates"][dtype]["train"]
    t = dev.seconds("train", Costs(4e12, 1e6))  # compute-bound: 4e12 FLOPs
    assert t == pytest.approx(over["fixed"] + 2 * over["per_layer"] + 4e12 / rate, rel=1e-12)
    assert dev.seconds("train", Costs(4e12, 1e6), cores=0.5) == t
    assert dev.seconds("train", Costs(4e12, 1e6), cores=1) == t
    # Memory-bound: 8e9 bytes at 8e11 B/s = 10 ms against 1e6 FLOPs.
    d = MEASURED["program_overhead"][dtype]["decode_step"]
    t = dev.seconds("decode_step", Costs(1e6, 8e9))
    assert t == pytest.approx(d["fixed"] + 2 * d["per_layer"] + 8e9 / 8e11, rel=1e-12)


def test_a_dtype_the_chip_was_not_calibrated_in_is_named(chip_profile):
    with pytest.raises(ValueError, match=r"no program_overhead\.float64 \(calibrated in "
                                         r"bfloat16, float32\)"):
        _model(chip_profile, "float64").seconds("train", Costs(1, 1))


def test_the_plan_of_a_chip_profile_is_the_chips(chip_profile):
    """The memory plan takes the chip's platform: XLA:TPU keeps bf16 residuals in bf16, where
    XLA:CPU keeps an f32 copy of each (train_memory._residual_bytes). The same bf16 run's
    activations on the calibrated chip are the shipped v5e's, byte for byte, and less than a
    CPU's."""
    from locojax.predict import memory, phases
    from locojax.predict.workload import Lengths, Workload

    wl = Workload("w", 4, 4, 16, 32, Lengths.fixed(32, "test"))
    acts = [memory.plan_for(phases.Ctx(config.tiny(), "tiny", wl, cluster, dtype="bfloat16"),
                            1, 1, 1, False).parts["activations"]
            for cluster in (hardware.Cluster(hardware.load(str(chip_profile)), 1),
                            hardware.parse_cluster("v5e-1"), hardware.parse_cluster("cpu-here-1"))]
    assert acts[0] == acts[1] < acts[2]


def test_a_calibration_is_the_default_profile_once_written(chip_profile, monkeypatch):
    from locojax.commands import predict_train

    argv = ["demo", "--mode", "single"]
    assert predict_train.parse(argv).ctx.cluster.hw.name == hardware.EXAMPLE
    monkeypatch.setattr(hardware, "CALIBRATED", chip_profile)
    run = predict_train.parse(argv)
    assert run.ctx.cluster.hw.name == "here" and run.ctx.cluster.hw.path == str(chip_profile)


@pytest.mark.parametrize("kind,preset", [("TPU v5 lite", "tpu-v5e"), ("TPU v5", "tpu-v5p"),
                                         ("TPU v6 lite", "tpu-v6e"), ("TPU7x", "tpu-v7x"),
                                         ("NVIDIA H100 80GB HBM3", "h100"), ("cpu", "")])
def test_a_device_kind_names_its_shipped_profile(kind, preset):
    assert calibrate_device.preset_of(kind) == preset


def test_an_unknown_chips_links_are_assumed_and_say_why():
    links = calibrate_device._links("Some NPU", 4)
    assert links["ici_domain"]["value"] == 4
    assert all(links[k]["origin"] == "assumed" and "Some NPU" in links[k]["source"]
               for k in calibrate_device.LINKS)


@pytest.mark.accelerator  # the probes `calibrate` runs on a chip: `make test-accelerator`
def test_the_chip_probes_measure_a_finite_rate_here():
    """The probes themselves, small: on this CPU or on the accelerator set's chip. A rate is
    positive and finite whatever the machine; nothing else about it can be asserted."""
    rates = calibrate_device.matmul_rates(n=256, reps=2)
    assert set(rates) == set(calibrate_device.DTYPES)
    assert all(0 < r < math.inf for r in rates.values())
    assert 0 < calibrate_device.hbm_bandwidth(mib=16, reps=2) < math.inf
    assert calibrate_device.device()["chips"] >= 1


def test_a_chips_overhead_is_what_its_wide_programs_cost_beyond_the_roofline(monkeypatch):
    """`program_overhead` on made-up times: each program at L layers costs its roofline (the
    cost model's FLOPs and bytes at the rates given) plus fixed + L · per_layer, and the
    fit returns those two, whatever the roofline. Exact up to f64 rounding (rel 1e-9: the
    differences are of numbers near 1e-3 known to ~1e-16 relative)."""
    from locojax.predict.flops import ModelCosts

    probe = calibrate_device.ACCEL_PROBE
    rates = {"prefill": 5e13, "decode_step": 2e13, "train": 7e13}
    bw = 5e11
    over = {"prefill": (3e-4, 2e-5), "decode_step": (1e-5, 1.5e-4), "train": (1e-3, 4e-5)}

    def roofline(cfg, kind):
        mc = ModelCosts(cfg, "bfloat16")
        c = {"prefill": mc.prefill(4, 8), "decode_step": mc.decode_step(8, 8 + 136 - 1),
             "train": mc.train_step(4, 2, 8, 8)}[kind]
        fixed, per_layer = over[kind]
        return max(c.flops / rates[kind], c.bytes / bw) + fixed + cfg.num_hidden_layers * \
            per_layer

    # The timers as program_overhead must call them: the shapes `roofline` costs.
    monkeypatch.setattr(calibrate, "_generate_times", lambda cfg, reps, *shape: (
        roofline(cfg, "prefill"), roofline(cfg, "decode_step"))
        if shape == (4, 2, 8) else pytest.fail(f"generate at {shape}"))
    monkeypatch.setattr(calibrate, "_train_time", lambda cfg, reps, *shape: roofline(
        cfg, "train") if shape == (2, 2, 8, 8) else pytest.fail(f"update at {shape}"))
    got = calibrate.program_overhead(rates, bw, "bfloat16", probe)
    for kind, (fixed, per_layer) in over.items():
        assert got[kind]["fixed"] == pytest.approx(fixed, rel=1e-9)
        assert got[kind]["per_layer"] == pytest.approx(per_layer, rel=1e-9)


PLANTED = {"fixed": 3e-4, "per_layer": 6e-5, "per_block": 8e-6, "rate": 2e13}


def _chip_step(cfg, prompts: int, samples: int, prompt: int, bw: float = 8e11) -> float:
    """A made-up chip's decode iteration at PLANTED, on the engine's own cache geometry
    (`KVCache.empty`): a short cache read whole, a long one a block an iteration of a loop
    up to the last written slot (iterations 8..135 of a 136-token generate: 72 in on
    average, half a block past it)."""
    from locojax.model.attention import WHOLE_BLOCKS, KVCache
    from locojax.predict.flops import ModelCosts

    cache = KVCache.empty(cfg, 1, prompt + 135)
    slots, block = cache.v.shape[3], cache.block
    loop = 0.0 if slots // block <= WHOLE_BLOCKS else (prompt + 72 + block / 2) / block
    c = ModelCosts(cfg, cfg.compute_dtype).decode_step(prompts * samples, loop * block or slots)
    return (PLANTED["fixed"] + cfg.num_hidden_layers * (PLANTED["per_layer"] + loop *
            PLANTED["per_block"]) + c.flops / PLANTED["rate"] + c.bytes / bw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_chips_decode_fit_recovers_its_planted_latencies(dtype):
    """`decode_latency` on made-up timings returns the per-layer, per-block, fixed and FLOP
    terms they were made of: a fit that drops the per-layer term (1 against 2 layers in the
    noise, as before) or reads no loop blocks (an 8-token probe's cache) cannot. Exact up
    to the least squares' rounding (rel 1e-6)."""
    got = calibrate_device.decode_latency(
        lambda cfg, reps, *shape: (0.0, _chip_step(cfg, *shape)), 8e11, dtype, 1.9e14)
    assert got == {k: pytest.approx(v, rel=1e-6) for k, v in PLANTED.items()}


def test_a_negative_term_is_dropped_not_kept():
    """Noise that makes a coefficient negative drops it (no kernel gives time back)."""
    x = [(1.0, 2.0), (1.0, 4.0), (1.0, 8.0)]
    assert calibrate_device.nonnegative_fit(x, [5.0, 4.0, 3.0]) == pytest.approx([4.0, 0.0])


def test_a_chip_profile_with_the_decode_fit_prices_the_loop_in_series(tmp_path):
    """With `decode_latency` the chip's decode step is its fit, latency-bound: fixed + L ·
    (per_layer + blocks · per_block) + flops / rate + bytes / bandwidth, summed, not the
    larger of the two (TINY: 2 layers; the profile's bandwidth is MEASURED's 8e11)."""
    fit = {d: dict(PLANTED) for d in calibrate_device.DTYPES}
    path = tmp_path / "here.json"
    path.write_text(json.dumps(calibrate.profile({**MEASURED, "decode_latency": fit}, "now",
                                                 "0.0")))
    dev = _model(path, "bfloat16")
    t = dev.seconds("decode_step", Costs(4e9, 8e8), blocks=6.0)
    assert t == pytest.approx(PLANTED["fixed"] + 2 * (PLANTED["per_layer"] + 6 * PLANTED[
        "per_block"]) + 4e9 / PLANTED["rate"] + 8e8 / 8e11, rel=1e-12)
    prof = json.loads(path.read_text())
    assert str(calibrate_device.DECODE_GRID) in prof["program_overhead"]["bfloat16"][
        "decode_step"]["per_block"]["source"]
    # Prefill and train keep their 1-and-2-layer overheads and their max(flops, bytes).
    over = MEASURED["program_overhead"]["bfloat16"]["train"]
    assert dev.seconds("train", Costs(4e12, 1e6)) == pytest.approx(
        over["fixed"] + 2 * over["per_layer"] + 4e12 / 1e14, rel=1e-12)
