"""`locojax predict`: what it prints for a shipped profile, and what it refuses (unknown
hardware, listing the profiles; a config it cannot cost, naming the field)."""

import json

from locojax.commands import predict
from locojax.predict import hardware


def run(capsys, *argv):
    code = predict.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_refuses_unknown_hardware_listing_the_profiles(capsys):
    code, _, err = run(capsys, "workload", "gsm8k", "--cluster", "tpu-v9-8")
    assert code == 2
    assert "unknown hardware 'tpu-v9'" in err
    for name in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7x", "h100", "h200"):
        assert name in err and name in hardware.known()


def test_refuses_a_config_it_cannot_cost_naming_the_field(capsys, tmp_path):
    moe = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
           "num_hidden_layers": 24, "num_attention_heads": 16, "vocab_size": 151936,
           "num_experts": 128}
    (tmp_path / "config.json").write_text(json.dumps(moe))
    code, _, err = run(capsys, "workload", "gsm8k", "--model", str(tmp_path), "--cluster",
                       "v5e-16")
    assert code == 2 and "num_experts=128" in err
    del moe["num_experts"], moe["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(moe))
    code, _, err = run(capsys, "workload", "gsm8k", "--model", str(tmp_path), "--cluster",
                       "v5e-16")
    assert code == 2 and "'vocab_size'" in err


def test_prints_memory_phases_and_placement_for_a_pod(capsys):
    code, out, _ = run(capsys, "workload", "gsm8k", "--model", "qwen3-0.6b", "--cluster",
                       "v5e-64", "--constants")
    assert code == 0
    assert "memory per device" in out and "fits" in out
    for mode in ("| controller |", "| colocated |", "| disaggregated |", "| async |"):
        assert mode in out
    assert "best placement (" in out and "rollout fraction" in out and "staleness mean" in out
    # Constants carry origins; each source is printed once, in the legend.
    assert "tpu-v5e.hbm_bandwidth = 8.19e+11 bytes/s (spec [1])" in out
    assert "[1] https://cloud.google.com/tpu/docs/v5e (System architecture table)\n" in out
    assert out.count("benchmarks/calibrate_predict.py --points gsm8k") == 1


def test_train_arguments_and_an_explicit_mode(capsys):
    code, out, _ = run(capsys, "train", "demo", "--model", "tiny", "--mode", "colocated",
                       "--cluster", "h100-16")
    assert code == 0
    assert "| colocated |" in out and "| controller |" not in out
    assert "B 32 x G 8 = 256 rows" in out  # the demo preset's batch


def test_the_studies_are_benchmarks_now(capsys):
    """`predict paper` and `--sweep` moved to benchmarks/ (paper_report, predict_sweep): the
    old spellings are refused, the first naming where it went."""
    code, _, err = run(capsys, "paper")
    assert code == 2 and "python -m benchmarks.paper_report" in err
    code, _, err = run(capsys, "workload", "gsm8k", "--cluster", "v7x-64", "--sweep", "sizes")
    assert code == 2 and "'--sweep'" in err
