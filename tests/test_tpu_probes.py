"""The chip's probes on the CPU: benchmarks/tpu/decode_blocks.py at a toy size (every arm
decodes, the arms' tokens are compared, the JSON holds each arm's token step and roofline
share), benchmarks/tpu/decode_profile.py at a toy size (each knob's arm is traced and its
ops summed, the knobs restored after; an arm that fails to compile is reported and the
others run) and benchmarks/tpu/peak_probe.py (its program's temporaries as XLA names them). The
figures are the chip's to measure; here only that the probes run and report."""

import json
import sys

import pytest

from benchmarks.tpu import decode_blocks, decode_profile, peak_probe
from locojax.model import attention, decode_kernel

CONFIG = {"model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
          "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True}


def test_decode_blocks_runs_every_arm_and_compares_their_tokens(tmp_path, monkeypatch, capsys):
    config, out = tmp_path / "config.json", tmp_path / "out.json"
    config.write_text(json.dumps(CONFIG))
    monkeypatch.setattr(sys, "argv", [
        "decode_blocks", "--config", str(config), "--rows", "4", "--prompt", "16",
        "--n1", "2", "--n2", "6", "--blocks", "8", "0", "--runs", "1", "--out", str(out)])
    decode_blocks.main()
    printed = capsys.readouterr().out
    assert "block 8:" in printed and "block whole:" in printed
    arms = json.loads(out.read_text())["arms"]
    assert [a["block"] for a in arms] == [8, 0]
    # Blocks of 8 slots and one whole read fold the same keys in another order: in bf16 a
    # token may differ, so only that the comparison was made is asserted, not its outcome.
    assert all(isinstance(a["same_tokens"], bool) and a["ms_per_token_step"] != 0
               for a in arms)


def test_decode_profile_traces_every_arm_and_restores_the_knobs(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    monkeypatch.setattr(sys, "argv", [
        "decode_profile", "--config", str(config), "--rows", "4", "--prompt", "8", "--n1", "2",
        "--n2", "6", "--rounds", "1", "--top", "3", "--out", str(tmp_path),
        "--arms", "default", "dots", "pallas"])
    decode_profile.main()
    arms = json.loads((tmp_path / "decode_profile.json").read_text())["arms"]
    assert [a["arm"] for a in arms] == ["default", "dots", "pallas"]
    for a in arms:  # the trace's kernels were found and summed: at most the whole trace
        assert 0 < len(a["top"]) <= 3 and a["device_s"] > 0, a["arm"]
        assert sum(op["share"] for op in a["top"]) <= 1 + 1e-9
        assert isinstance(a["same_tokens_as_default"], bool)
    assert "pallas:" in capsys.readouterr().out
    assert all(getattr(attention, k) == v for k, v in decode_profile.ARMS["default"].items())


def test_decode_profile_reports_an_arm_that_fails_and_runs_the_others(tmp_path, monkeypatch,
                                                                       capsys):
    """A kernel the chip's compiler refuses (here: one that raises) is that arm's result,
    reported with its error, not the end of the run."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))

    def refused(*args, **kwargs):
        raise RuntimeError("Mosaic failed to compile the kernel (a stand-in)")

    monkeypatch.setattr(decode_kernel, "read_cache", refused)
    monkeypatch.setattr(sys, "argv", [
        "decode_profile", "--config", str(config), "--rows", "4", "--prompt", "8", "--n1", "2",
        "--n2", "6", "--rounds", "1", "--top", "2", "--out", str(tmp_path),
        "--arms", "pallas", "default"])
    decode_profile.main()
    arms = {a["arm"]: a for a in json.loads((tmp_path / "decode_profile.json").read_text())["arms"]}
    assert "Mosaic failed" in arms["pallas"]["failed"]
    assert arms["default"]["ms_per_token_step"] != 0 and arms["default"]["top"]
    assert "pallas: FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("dies_in", [1, 2], ids=["first-trace", "second-trace"])
def test_decode_profile_keeps_the_timings_when_a_trace_kills_the_process(dies_in, tmp_path,
                                                                        monkeypatch):
    """On the chip a profiler trace has ended the process (docs/results/tpu_decode.md): the
    arms' timings are on disk before the first trace starts, and each trace as it ends."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    calls = []

    def dies(generate, n, top):
        calls.append(n)
        if len(calls) == dies_in:
            raise SystemExit("the process died in a trace (a stand-in)")
        return {"device_s": 1.0, "top": []}

    monkeypatch.setattr(decode_profile, "traced", dies)
    monkeypatch.setattr(sys, "argv", [
        "decode_profile", "--config", str(config), "--rows", "4", "--prompt", "8", "--n1", "2",
        "--n2", "6", "--rounds", "1", "--out", str(tmp_path), "--arms", "default", "dots"])
    with pytest.raises(SystemExit):
        decode_profile.main()
    arms = json.loads((tmp_path / "decode_profile.json").read_text())["arms"]
    assert [a["arm"] for a in arms] == ["default", "dots"]
    assert all(a["ms_per_token_step"] != 0 for a in arms)
    assert [a.get("device_s") for a in arms] == [1.0 if dies_in == 2 else None, None]


def test_peak_probe_reports_the_programs_temporaries():
    row = peak_probe.probe(64)
    # What XLA:CPU calls temporaries here is its business (it reported 0 for this program);
    # the probe's job is to report XLA's figures beside the device's, which is checked.
    assert set(row["analysis"]) == set(peak_probe.ANALYSIS)
    assert all(isinstance(v, int) for v in row["analysis"].values())
    assert row["expected_temp_bytes"] == 3 * 64 * 64 * 4 and "peak_rise_bytes" in row
