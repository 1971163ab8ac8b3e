"""benchmarks/carried_profile.py: a made-up v5e calibration (tests/test_predict_calibrated_chip.py's)
carried to a v7x. Every expected figure is the measured one times the ratio of the two shipped
profiles' published figures, computed here from those files."""

import json
import subprocess
import sys

import pytest

from benchmarks.carried_profile import carry
from locojax.model import config
from locojax.predict import calibrate, devices, hardware
from locojax.predict.flops import Costs
from locojax.predict.origin import Ledger
from tests.test_predict_calibrated_chip import MEASURED

V5E, V7X = hardware.load("tpu-v5e"), hardware.load("tpu-v7x")


@pytest.fixture
def v5e_profile():
    return calibrate.profile(MEASURED, "now", "0.0")


def test_rates_scale_by_the_published_peaks_and_latencies_stay(v5e_profile, tmp_path):
    """A program of either kind keeps its share of the peak, the bandwidth its share of the
    published HBM figure; the overheads are the v5e's. Ratios of f64 numbers: rel 1e-12."""
    path = tmp_path / "v7x.json"
    path.write_text(json.dumps(carry(v5e_profile, "tpu-v7x")))
    hw = hardware.load(str(path))
    assert hw.platform == "tpu" and hw.name == "tpu-v7x-from-tpu-v5e"
    for dtype in ("float32", "bfloat16"):
        r = V7X.peak(dtype).value / V5E.peak(dtype).value
        assert hw.peak(dtype).value == pytest.approx(MEASURED["matmul_rates"][dtype] * r,
                                                     rel=1e-12)
        rate = hw.extra["program_rates"][dtype]["train"]  # a JSON entry, read when used
        assert rate["value"] == pytest.approx(MEASURED["program_rates"][dtype]["train"] * r,
                                              rel=1e-12)
        assert rate["origin"] == "assumed" and "published" in rate["source"]
    bw = MEASURED["hbm_bandwidth"] * V7X.hbm_bandwidth.value / V5E.hbm_bandwidth.value
    assert hw.hbm_bandwidth.value == pytest.approx(bw, rel=1e-12)
    for key in ("hbm_bytes", "ici_bandwidth", "ici_domain", "chips_per_host", "dcn_bandwidth"):
        assert getattr(hw, key) == getattr(V7X, key), key  # the target's own, spec
    dev = devices.device_model(hw, "bfloat16", config.tiny().num_hidden_layers, Ledger())
    over = MEASURED["program_overhead"]["bfloat16"]["decode_step"]
    t = dev.seconds("decode_step", Costs(1.0, 8e9))  # memory-bound
    assert t == pytest.approx(over["fixed"] + 2 * over["per_layer"] + 8e9 / bw, rel=1e-12)


def test_only_a_chips_calibration_of_a_known_chip_is_carried(v5e_profile):
    cpu = dict(v5e_profile, platform="cpu")
    with pytest.raises(ValueError, match="not a cpu one"):
        carry(cpu, "tpu-v7x")
    with pytest.raises(ValueError, match="no shipped profile for 'TPU v9'"):
        carry(dict(v5e_profile, device_kind="TPU v9"), "tpu-v7x")
    with pytest.raises(hardware.UnknownHardware):
        carry(v5e_profile, "tpu-v99")


def test_the_command_writes_a_profile_predict_reads(v5e_profile, tmp_path):
    src, out = tmp_path / "here.json", tmp_path / "v6e.json"
    src.write_text(json.dumps(v5e_profile))
    subprocess.run([sys.executable, "-m", "benchmarks.carried_profile", "--profile", str(src),
                    "--to", "v6e", "--out", str(out)], check=True, capture_output=True,
                   timeout=120)
    pred = subprocess.run([sys.executable, "-m", "locojax.cli", "predict", "train", "demo",
                           "--hardware", str(out), "--cluster", "4"], capture_output=True,
                          text=True, timeout=300)
    assert pred.returncode == 0, pred.stderr[-2000:]
    assert "tpu-v6e-from-tpu-v5e" in pred.stdout + pred.stderr


def test_the_paper_studies_run_on_a_carried_profile_and_move_its_scaled_rates(
        v5e_profile, tmp_path, monkeypatch):
    """`paper_report --hardware` runs the studies on the carried v7x: the sensitivity table
    then moves the constants the carry scaled (origin `assumed`), by name."""
    from benchmarks import paper, paper_sensitivity

    path = tmp_path / "v7x.json"
    path.write_text(json.dumps(carry(v5e_profile, "tpu-v7x")))
    monkeypatch.setattr(paper, "PROFILE", str(path))
    paper._plan.cache_clear()  # plans are cached by profile name; a fresh start either way
    moved = paper_sensitivity.constants()
    paper._plan.cache_clear()
    assert "tpu-v7x-from-tpu-v5e.hbm_bandwidth" in moved, moved
    assert any(n.startswith("tpu-v7x-from-tpu-v5e.program_rates.bfloat16.") for n in moved)
