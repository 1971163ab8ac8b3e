"""HF checkpoint I/O: bitwise save → load → save round trips, interop with transformers in
both directions, config.json in transformers 4 and 5 forms, clear errors for malformed
checkpoints and configs, and loading straight into mesh shardings."""

import collections
import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from locojax.model import decoder, hf_io, params, sharding
from locojax.model.hf_config import config_from_dict, config_to_dict, load_config, save_config
from tests.hf_reference import hf_config, logit_tol, paired, random_hf_model, tiny_cfg


def _random_weights(cfg, seed=0):
    """Random weights of `cfg` at hf_reference's scale: N(0, 0.1) matrices, 1 + N(0, 0.1)
    norm scales (so no tensor is all ones)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda d: jax.numpy.asarray((d.init == "ones") + rng.normal(0, 0.1, d.shape),
                                    cfg.weight_dtype),
        params.declare(cfg), is_leaf=params.is_decl)


def _tensors(model_dir):
    """{name: (dtype, shape, bytes)} of every tensor in every safetensors file."""
    out = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = (path.name, str(t.dtype), t.shape, t.tobytes())
    return out


def _logits(weights, cfg, tokens):
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    hidden, _ = decoder.forward(weights, tokens, positions, cfg)
    return np.asarray(decoder.logits(weights, hidden, cfg))


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(np.asarray(tokens, np.int64))).logits.numpy()


def _assert_trees_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


TOKENS = np.random.default_rng(0).integers(0, 512, (2, 9)).astype(np.int32)


# ---- round trips -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("max_shard_bytes", [None, 40_000], ids=["single", "sharded"])
def test_save_load_save_is_bitwise(tmp_path, dtype, max_shard_bytes):
    cfg = tiny_cfg(tie_word_embeddings=False)
    w = _random_weights(cfg)
    first, second = tmp_path / "a", tmp_path / "b"
    hf_io.save_weights(w, cfg, first, dtype=dtype, max_shard_bytes=max_shard_bytes)
    files = sorted(p.name for p in first.iterdir())
    if max_shard_bytes:
        assert (first / hf_io.INDEX_FILE).exists() and len(files) > 4
        index = json.loads((first / hf_io.INDEX_FILE).read_text())
        assert set(index["weight_map"].values()) == {f for f in files if f.endswith(".safetensors")}
    else:
        assert files == ["config.json", "model.safetensors"]

    cfg1, w1 = hf_io.load_model(first)
    assert cfg1 == dataclasses.replace(cfg, param_dtype=dtype, max_position_embeddings=40960)
    # Loaded values equal the originals (rounded to the checkpoint dtype).
    _assert_trees_equal(w1, jax.tree.map(lambda x: x.astype(dtype), w))

    hf_io.save_weights(w1, cfg1, second, max_shard_bytes=max_shard_bytes)
    a, b = _tensors(first), _tensors(second)
    assert len(a) == 2 + 11 * cfg.num_hidden_layers + 1  # embed, norm, lm_head + layers
    assert a == b
    assert all(d == ("bfloat16" if dtype == "bfloat16" else "float32") for _, d, _, _ in
               a.values())
    for name in files:  # whole files too: headers, index and config are deterministic
        assert (first / name).read_bytes() == (second / name).read_bytes(), name

    if dtype == "bfloat16":  # an f32 master copy of a bf16 checkpoint saves back identically
        cfg32, w32 = hf_io.load_model(first, param_dtype="float32")
        assert jax.tree.leaves(w32)[0].dtype == np.float32
        hf_io.save_weights(w32, cfg32, tmp_path / "c", dtype="bfloat16",
                           max_shard_bytes=max_shard_bytes)
        assert _tensors(tmp_path / "c") == a


def test_resave_removes_stale_shards(tmp_path):
    cfg = tiny_cfg()
    w = _random_weights(cfg)
    hf_io.save_weights(w, cfg, tmp_path, max_shard_bytes=40_000)
    hf_io.save_weights(w, cfg, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    _assert_trees_equal(hf_io.load_model(tmp_path)[1], w)


# ---- interop with transformers -----------------------------------------------------------

@pytest.mark.parametrize("tied", [True, False])
def test_locojax_checkpoint_loads_in_transformers(tmp_path, tied):
    cfg = tiny_cfg(tie_word_embeddings=tied)
    w = _random_weights(cfg, seed=1)
    hf_io.save_weights(w, cfg, tmp_path)
    model, info = Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.rope_parameters["rope_theta"] == cfg.rope_theta
    assert model.config.tie_word_embeddings == tied
    ref = _hf_logits(model.eval(), TOKENS)  # a layout slip in the files is O(1) off
    np.testing.assert_allclose(ref, _logits(w, cfg, TOKENS), atol=logit_tol("float32", ref),
                               rtol=0)


@pytest.mark.parametrize("tied", [True, False])
def test_transformers_checkpoint_loads_in_locojax(tmp_path, tied):
    cfg = tiny_cfg(tie_word_embeddings=tied, rope_theta=5000.0)
    model = random_hf_model(cfg, seed=2)
    model.save_pretrained(tmp_path)
    cfg1, w = hf_io.load_model(tmp_path)
    assert cfg1 == dataclasses.replace(cfg, max_position_embeddings=cfg1.max_position_embeddings)
    ref = _hf_logits(model, TOKENS)
    np.testing.assert_allclose(_logits(w, cfg1, TOKENS), ref, atol=logit_tol("float32", ref),
                               rtol=0)
    # The same tensors as converting the in-memory state dict.
    ref = hf_io.from_state_dict({k: v.numpy() for k, v in model.state_dict().items()}, cfg1)
    _assert_trees_equal(w, ref)


# ---- config.json ---------------------------------------------------------------------

# Qwen3-0.6B's config.json as published (transformers 4.51), and the same model as
# transformers 5 writes it.
V4 = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
V5 = {k: v for k, v in V4.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
V5.update(rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, dtype="bfloat16",
          layer_types=["full_attention"] * 28, transformers_version="5.24.0")


def test_config_v4_and_v5_forms_agree(tmp_path):
    a, b = config_from_dict(V4), config_from_dict(V5)
    assert a == b
    assert (a.hidden_size, a.num_hidden_layers, a.head_dim, a.num_key_value_heads) == \
        (1024, 28, 128, 8)
    assert a.rope_theta == 1e6 and a.tie_word_embeddings and a.param_dtype == "bfloat16"
    assert a.max_position_embeddings == 40960
    # What transformers 5 itself writes parses to the same thing.
    Qwen3Config(**{k: v for k, v in V5.items() if k not in ("architectures", "model_type",
                                                            "transformers_version", "dtype")},
                dtype="bfloat16").save_pretrained(tmp_path)
    assert load_config(tmp_path) == a
    assert load_config(tmp_path, param_dtype="float32", compute_dtype="bfloat16") == \
        dataclasses.replace(a, param_dtype="float32", compute_dtype="bfloat16")


def test_config_defaults_follow_hf():
    """Absent optional keys mean what transformers would run, not ModelConfig's defaults."""
    d = {k: V4[k] for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                            "num_hidden_layers", "num_attention_heads")}
    cfg = config_from_dict(d)
    assert not cfg.tie_word_embeddings and cfg.rope_theta == 10000.0 and cfg.head_dim == 128
    assert cfg.num_key_value_heads == 16 and cfg.param_dtype == "float32"


def test_saved_config_round_trips_and_loads_in_transformers(tmp_path):
    cfg = tiny_cfg(rope_theta=12345.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    save_config(cfg, tmp_path, "bfloat16")
    assert load_config(tmp_path) == dataclasses.replace(cfg, param_dtype="bfloat16")
    hf = Qwen3Config.from_pretrained(tmp_path)
    ref = hf_config(cfg)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "tie_word_embeddings", "rope_parameters", "layer_types", "hidden_act"):
        assert getattr(hf, key) == getattr(ref, key), key
    assert hf.dtype == torch.bfloat16
    d = config_to_dict(cfg)
    assert d["rope_theta"] == d["rope_parameters"]["rope_theta"] == 12345.0  # both spellings
    assert d["torch_dtype"] == d["dtype"] == "float32"


_DROP = object()


@pytest.mark.parametrize("change, words", [
    (dict(model_type="mistral"), "model_type='mistral' is not supported (qwen3, qwen2"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling.rope_type='yarn'"),
    (dict(rope_scaling={"type": "linear"}), "rope_scaling of rope_type 'linear' lacks ['factor']"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "lacks ['low_freq_factor'"),
    (dict(rope_parameters={"rope_theta": 1e6, "rope_type": "dynamic"}),
     "rope_parameters.rope_type='dynamic'"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(use_sliding_window=True, sliding_window=4096, max_window_layers=20),
     "layer 20 uses 'sliding_attention'"),
    (dict(layer_types=["full_attention"] * 27 + ["sliding_attention"]), "layer 27"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(torch_dtype="int8"), "dtype='int8'"),
    (dict(rope_parameters={"rope_theta": 5.0}), "disagrees"),
    (dict(num_key_value_heads=3), "num_key_value_heads=3"),
    (dict(hidden_size=_DROP), "missing required key(s) ['hidden_size']"),
])
def test_config_rejects_unsupported(change, words):
    d = {k: v for k, v in {**V4, **change}.items() if v is not _DROP}
    with pytest.raises(ValueError) as e:
        config_from_dict(d)
    assert words in str(e.value)


def test_sliding_window_config_that_slides_no_layer_is_accepted():
    # Sliding window switched on but starting at layer 28 of 28: every layer is full.
    cfg = config_from_dict({**V4, "use_sliding_window": True, "sliding_window": 4096})
    assert cfg.num_hidden_layers == 28


# ---- malformed checkpoints -------------------------------------------------------------

def _saved(tmp_path, cfg, **kw):
    hf_io.save_weights(_random_weights(cfg), cfg, tmp_path, **kw)
    return tmp_path


def _edit(path, fn):
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path):
    cfg = tiny_cfg()
    d = _saved(tmp_path, cfg)
    f = d / "model.safetensors"
    name = "model.layers.1.mlp.up_proj.weight"

    _edit(f, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=f"missing tensor '{name}' in .*model.safetensors"):
        hf_io.load_model(d)

    _saved(d, cfg)
    bias = "model.layers.0.self_attn.q_proj.bias"
    _edit(f, lambda t: t.update({bias: np.zeros(64, np.float32)}))
    with pytest.raises(ValueError, match=f"unexpected tensor '{bias}' in .*model.safetensors"):
        hf_io.load_model(d)

    _saved(d, cfg)
    _edit(f, lambda t: t.update({name: t[name][:, :-1].copy()}))
    with pytest.raises(ValueError, match=rf"tensor '{name}' in .*model.safetensors has shape "
                                         r"\[128, 63\], expected \[128, 64\]"):
        hf_io.load_model(d)


def test_sharded_checkpoint_errors_name_the_shard(tmp_path):
    cfg = tiny_cfg()
    d = _saved(tmp_path, cfg, max_shard_bytes=40_000)
    index = json.loads((d / hf_io.INDEX_FILE).read_text())
    name = "model.layers.1.self_attn.k_norm.weight"
    shard = d / index["weight_map"][name]
    _edit(shard, lambda t: t.update({name: np.ones(8, np.float32)}))
    with pytest.raises(ValueError, match=f"tensor '{name}' in .*{shard.name} has shape"):
        hf_io.load_model(d)
    _edit(shard, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=f"maps tensor '{name}' to {shard.name}"):
        hf_io.load_model(d)
    (d / hf_io.INDEX_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf_io.load_model(d)


def test_corrupt_config_index_and_weights_name_the_file(tmp_path):
    """json and safetensors report a bad file without naming it; these errors do, with the
    line and column of a JSON error."""
    cfg = tiny_cfg()
    d = _saved(tmp_path, cfg, max_shard_bytes=40_000)
    config = d / "config.json"
    good = config.read_text()
    config.write_text('{\n  "hidden_size": 64,\n  "num_hidden_layers": ,\n}')
    with pytest.raises(ValueError, match=rf"{config}:3:24: invalid JSON \(Expecting value\)"):
        load_config(d)
    config.write_bytes(b'{"model_type": "qwen3\xff"}')
    with pytest.raises(ValueError, match=rf"{config}: not UTF-8"):
        hf_io.load_model(d)
    config.write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"{config}: must hold a JSON object, not a list"):
        load_config(d)
    config.write_text(good)
    index = d / hf_io.INDEX_FILE
    text = index.read_text()
    index.write_text(text[: len(text) // 2])  # an interrupted copy
    with pytest.raises(ValueError, match=rf"{index}:\d+:\d+: invalid JSON"):
        hf_io.load_model(d)
    index.write_text(text)
    shard = d / sorted(set(json.loads(text)["weight_map"].values()))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # a truncated shard
    with pytest.raises(ValueError, match=rf"{shard}: not a readable safetensors file"):
        hf_io.load_model(d)


def test_lm_head_presence_follows_tying(tmp_path):
    tied = tiny_cfg()
    w = _random_weights(tied)
    d = _saved(tmp_path, tied)
    # A tied checkpoint that also stores the head (as some exporters do) loads; it is unused.
    _edit(d / "model.safetensors", lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    _assert_trees_equal(hf_io.load_weights(d, tied), w)
    _edit(d / "model.safetensors", lambda t: t.update(
        {"lm_head.weight": np.zeros((512, 32), np.float32)}))
    with pytest.raises(ValueError, match="tensor 'lm_head.weight' .* has shape"):
        hf_io.load_weights(d, tied)
    # An untied config needs it.
    _saved(d, tied)
    with pytest.raises(ValueError, match="missing tensor 'lm_head.weight'"):
        hf_io.load_weights(d, dataclasses.replace(tied, tie_word_embeddings=False))
    # And an untied checkpoint is not a tied model.
    untied = tiny_cfg(tie_word_embeddings=False)
    _saved(d, untied)
    with pytest.raises(ValueError, match="unexpected tensor 'lm_head.weight'.*differs.*untied"):
        hf_io.load_weights(d, tied)


# ---- loading into shardings ------------------------------------------------------------

@pytest.mark.parametrize("mesh_shape, rules", [
    ({"tensor": 4}, sharding.ROLLOUT_TP),
    ({"data": 2, "fsdp": 2}, sharding.TRAIN_FSDP),
    ({"tensor": 2}, sharding.ROLLOUT_TP),
], ids=["tp4", "fsdp2x2", "tp2"])
def test_load_into_mesh_shardings(tmp_path, mesh_shape, rules):
    cfg = tiny_cfg(tie_word_embeddings=False)
    w = _random_weights(cfg)
    hf_io.save_weights(w, cfg, tmp_path, dtype="bfloat16")
    n = int(np.prod(list(mesh_shape.values())))
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:n])
    cfg1, loaded = hf_io.load_model(
        tmp_path, lambda c: sharding.weight_shardings(c, mesh, rules), param_dtype="float32")
    expected = sharding.weight_shardings(cfg1, mesh, rules)
    split = 0
    for arr, want, orig in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected),
                               jax.tree.leaves(w)):
        assert arr.sharding == want
        split += not arr.sharding.is_fully_replicated
        ref = np.asarray(orig.astype("bfloat16").astype("float32"))
        np.testing.assert_array_equal(np.asarray(arr), ref)
        for shard in arr.addressable_shards:  # each device holds exactly its slice
            np.testing.assert_array_equal(np.asarray(shard.data), ref[shard.index])
    assert split >= 3  # the rules really partition something on this mesh


def test_stacked_weights_read_only_the_requested_layers(tmp_path, monkeypatch):
    """Layers split over 2 devices: each device's callback reads only its layers, replicas
    share one read, so every tensor of the checkpoint is read exactly once."""
    cfg = tiny_cfg(num_hidden_layers=4)
    w = _random_weights(cfg)
    hf_io.save_weights(w, cfg, tmp_path, max_shard_bytes=100_000)
    mesh = sharding.make_mesh({"x": 2}, jax.devices()[:2])
    shardings = jax.tree.map(
        lambda d: NamedSharding(mesh, P("x") if d.stacked else P()),
        params.declare(cfg), is_leaf=params.is_decl)

    reads = collections.Counter()
    real_read = hf_io.Checkpoint.read
    monkeypatch.setattr(hf_io.Checkpoint, "read",
                        lambda self, name: (reads.update([name]), real_read(self, name))[1])
    loaded = hf_io.load_weights(tmp_path, cfg, shardings)
    assert set(reads) == set(_tensors(tmp_path)) and set(reads.values()) == {1}
    _assert_trees_equal(loaded, w)
    wq = loaded["layers"]["wq"]
    assert [s.data.shape[0] for s in wq.addressable_shards] == [2, 2]
    np.testing.assert_array_equal(np.asarray(wq.addressable_shards[1].data),
                                  np.asarray(w["layers"]["wq"][2:]))


def test_shardings_must_match_the_weight_tree(tmp_path):
    cfg = tiny_cfg()
    d = _saved(tmp_path, cfg)
    mesh = sharding.make_mesh({"tensor": 2}, jax.devices()[:2])
    wrong = sharding.weight_shardings(tiny_cfg(tie_word_embeddings=False), mesh,
                                      sharding.ROLLOUT_TP)
    with pytest.raises(ValueError, match="shardings do not match"):
        hf_io.load_weights(d, cfg, wrong)


def test_paired_reference_round_trips_through_files(tmp_path):
    """hf_reference's in-memory conversion and the file path agree exactly."""
    cfg = tiny_cfg()
    model, w = paired(cfg, seed=3)
    hf_io.save_weights(w, cfg, tmp_path)
    sd = {k: v.numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert set(stored) == set(sd)
    for k in sd:
        np.testing.assert_array_equal(stored[k], sd[k])
