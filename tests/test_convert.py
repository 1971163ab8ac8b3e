"""`locojax convert` on a GGUF file written here (tests/gguf_fixture.py): every tensor back
in HF layout exactly, a directory transformers loads as it is, the vocabulary's own split,
and what cannot be converted refused by name before anything is written."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from locojax.commands import convert as convert_cmd
from locojax.model import gguf_convert, hf_io, loader
from locojax.tokenizer.chat_template import with_chat_template
from tests import gguf_fixture as fx

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    truth = fx.write_llama_gguf(tmp / "tiny.gguf", fx.random_state())
    out = gguf_convert.convert(tmp / "tiny.gguf", tmp / "hf")
    return out, truth


def test_every_tensor_comes_back_in_hf_layout_exactly(converted):
    out, truth = converted
    cfg = loader.load_config(str(out))
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", fx.L, fx.D)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (fx.HEADS, fx.KV,
                                                                               fx.HEAD_DIM)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100_000.0 and cfg.rms_norm_eps == 1e-5
    got = hf_io.to_state_dict(hf_io.load_weights(out, cfg), cfg)
    assert set(got) == set(truth)
    for name, want in truth.items():
        # Exact: dequantized values are f32 and stored as f32; the permutation moves rows.
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    # The quantized tensors really went through quantization (the test would not notice a
    # converter that skipped it otherwise), and q's permutation is not the identity.
    state = fx.random_state()
    assert not np.array_equal(truth["model.layers.1.self_attn.q_proj.weight"],
                              state["model.layers.1.self_attn.q_proj.weight"])
    q0 = state["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(fx.llama_cpp_permute(q0, fx.HEADS), q0)


def test_transformers_loads_the_directory_as_it_is(converted):
    out, truth = converted
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    for name, want in truth.items():
        np.testing.assert_array_equal(sd[name], want, err_msg=name)
    # TRL builds its policy from config.architectures.
    assert model.config.architectures == ["LlamaForCausalLM"]


STRINGS = ["the 12 and 123 then", "Ġ tthe he12", "  spaces\tand\nlines ", "héllo ünïcode ✓",
           "<|im_start|>user\nhi<|im_end|>"]


def test_the_vocabulary_splits_as_its_pre_tokenizer_says(converted):
    out, _ = converted
    ours = loader.load_tokenizer_of(str(out))
    hf = AutoTokenizer.from_pretrained(out)
    for s in STRINGS:
        assert ours.encode(s) == hf(s, add_special_tokens=False).input_ids, s
        assert ours.decode(ours.encode(s), skip_special=False) == s
    vocab = fx.vocabulary()
    # smollm splits every digit: the merge "1 2" never applies, " the" merges fully.
    ids = ours.encode(" the 12")
    assert [vocab[i] for i in ids] == ["Ġthe", "Ġ", "1", "2"]
    special = ours.encode("<|im_end|>")
    assert special == [2] and ours.eos_id == 2


def test_the_chat_template_renders_as_transformers_renders_it(converted):
    out, _ = converted
    ours = with_chat_template(loader.load_tokenizer_of(str(out)), out)
    hf = AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "What is 7 + 5?"}]
    want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(msgs) == want
    assert want.startswith("<|im_start|>user\nWhat is 7 + 5?<|im_end|>")


def _refused(tmp_path, **kw) -> str:
    fx.write_llama_gguf(tmp_path / "bad.gguf", fx.random_state(), **kw)
    with pytest.raises(ValueError) as e:
        gguf_convert.convert(tmp_path / "bad.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    return str(e.value)


def test_another_architecture_is_refused_by_name(tmp_path):
    assert "general.architecture='qwen3'" in _refused(tmp_path, arch="qwen3")


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path):
    assert "tokenizer.ggml.pre='qwen35'" in _refused(tmp_path, pre="qwen35")


def test_an_unsupported_tensor_type_is_refused_by_name(tmp_path):
    extra = {"blk.0.ffn_gate_inp.weight": (np.zeros((4, 64), np.int8), Q.I8)}
    assert "I8" in _refused(tmp_path, extra_tensors=extra)


def test_a_tensor_without_an_hf_counterpart_is_refused_by_name(tmp_path):
    extra = {"blk.0.attn_sinks.weight": (np.zeros(4, np.float32), Q.F32)}
    assert "'blk.0.attn_sinks.weight'" in _refused(tmp_path, extra_tensors=extra)


def test_rope_scaling_is_refused_by_name(tmp_path):
    msg = _refused(tmp_path, extra_fields={"llama.rope.scaling.factor": 8.0})
    assert "llama.rope.scaling.factor" in msg


def test_the_command_names_a_missing_file_and_a_missing_package(tmp_path, capsys, monkeypatch):
    assert convert_cmd.main([str(tmp_path / "none.gguf"), str(tmp_path / "out")]) == 2
    assert "none.gguf: no such GGUF file" in capsys.readouterr().err
    monkeypatch.setitem(gguf_convert.NAMED_FILES, "smollm2",
                        ("locojax-no-such-distribution", "x.gguf"))
    assert convert_cmd.main(["smollm2", str(tmp_path / "out")]) == 2
    assert "locojax-no-such-distribution, which is not installed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_real_demo_converts_first_and_names_a_missing_package(tmp_path, capsys,
                                                                  monkeypatch):
    from locojax.commands import demo

    monkeypatch.setitem(gguf_convert.NAMED_FILES, "smollm2",
                        ("locojax-no-such-distribution", "x.gguf"))
    model = tmp_path / "absent"
    assert demo.main(["--real", "--model", str(model), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "locojax demo --real" in err and "locojax-no-such-distribution" in err
    assert not model.exists() and not (tmp_path / "r").exists()
