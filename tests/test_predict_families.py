"""The cost model on the families locojax runs beside Qwen3 (Qwen2's q/k/v biases, Llama,
Gemma 3 text with its sliding-window local layers): FLOP counts against XLA's
`cost_analysis()` of locojax's own compiled programs at TINY's shape, as
test_predict_flops.py checks Qwen3 (its two-sided bound and why it holds); and how a config
with local layers is read and costed.

Sliding windows: the model counts a local layer's attention over at most W keys. locojax's
decode reads a local layer's cache from the first block inside the window, but its prefill
and train step compute a local layer's masked scores densely, so there XLA counts the
masked-out reads too: 4 n h (P - W) per prompt position in each local layer, which the
prefill check adds to the model's count before the two-sided comparison.
"""

import dataclasses
import json

import pytest
from test_predict_flops import _check_train_cfg, _elementwise_bound, _within

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config
from locojax.model.config import FULL, SLIDING
from locojax.predict import spec
from locojax.predict.flops import ModelCosts
from locojax.predict.spec import UncostableModel

B, G, P, N = 8, 4, 16, 32  # TINY's canonical step (docs/design.md)


def family(model_type: str, window: int | None = None, layers: int = 2):
    """TINY with another family's switches; Gemma 3 with local layers of window W."""
    cfg = dataclasses.replace(config.tiny(), model_type=model_type, num_hidden_layers=layers)
    if window is not None:
        kinds = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
        cfg = dataclasses.replace(cfg, layer_types=kinds, sliding_window=window)
    return cfg


FAMILIES = {"qwen2": family("qwen2"), "llama": family("llama"),
            # a window beyond the context changes no count: the programs are the full ones
            "gemma3": family("gemma3_text", window=P + N)}


@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_and_decode_flops_match_xla(name):
    cfg = FAMILIES[name]
    one = dataclasses.replace(cfg, num_hidden_layers=1,
                              layer_types=cfg.layer_types[:1] if cfg.layer_types else None)
    costs = ModelCosts(one, "float32")
    s = P + N - 1  # one attention block of every slot: XLA counts a loop body once
    prefill, decode = Engine(one, block=s).compile(
        B, P, SamplingConfig(max_new_tokens=N, ignore_eos=True), G)
    _within(prefill.cost_analysis()["flops"], costs.prefill(B, P).flops,
            _elementwise_bound(one, B * P, P, B, False))
    _within(decode.cost_analysis()["flops"], costs.decode_step(B * G, s).flops,
            _elementwise_bound(one, B * G, s, B * G, False))


@pytest.mark.parametrize("name", [
    "gemma3", pytest.param("qwen2", marks=pytest.mark.slow),
    pytest.param("llama", marks=pytest.mark.slow)])
def test_train_step_flops_match_xla(name):
    """Gemma 3 differs most from Qwen3 (norms, GELU, tied head); Qwen2 and Llama differ only
    in elementwise work and are slow-marked (two train-step compiles each)."""
    _check_train_cfg(FAMILIES[name], B, G, P, N)


def test_local_layer_prefill_counts_the_window_xla_the_dense_scores():
    """One local layer, W = 4 < P: XLA's count is the model's plus the masked-out reads."""
    w = 4
    one = family("gemma3_text", window=w, layers=1)
    costs = ModelCosts(one, "float32")
    prefill, _ = Engine(one).compile(B, P, SamplingConfig(max_new_tokens=N, ignore_eos=True),
                                     G)
    masked = B * P * 4 * one.num_attention_heads * one.head_dim * (P - w)
    _within(prefill.cost_analysis()["flops"], costs.prefill(B, P).flops + masked,
            _elementwise_bound(one, B * P, P, B, False))


def test_local_layers_read_at_most_the_window():
    """Per query, a local layer's attention FLOPs and KV bytes stop growing at W keys; a
    full layer's keep growing. Counted layer by layer here, against the model's sum."""
    w = 8
    cfg = family("gemma3_text", window=w, layers=6)
    mc = ModelCosts(cfg, "bfloat16")
    n, k, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    for keys in (1, w - 1, w, w + 1, 100):
        per_layer = [min(keys, w) if kind == SLIDING else keys for kind in cfg.layer_types]
        full = ModelCosts(dataclasses.replace(cfg, layer_types=None, sliding_window=None),
                          "bfloat16")
        assert mc.token_flops(keys) == pytest.approx(
            full.token_flops(0) + 4 * n * h * sum(per_layer), rel=1e-12)
        assert mc.decode_step(3, keys).bytes == pytest.approx(
            mc.weight_bytes() + 3 * 2 * k * h * 2 * sum(per_layer), rel=1e-12)


def test_gemma3_config_is_costed_with_its_local_layers(tmp_path):
    """A Gemma 3 config.json (transformers 4 spelling: a pattern, no layer_types) is read
    with every 6th layer global, the rest local with the config's window; the refusals
    still name the field."""
    d = {"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048,
         "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
         "head_dim": 256, "vocab_size": 262144, "sliding_window": 512,
         "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh"}
    cfg = spec.from_dict(d, "gemma")
    assert cfg.model_type == "gemma3_text" and cfg.sliding_window == 512
    assert [i for i, t in enumerate(cfg.layer_types) if t == FULL] == [5, 11, 17]
    assert cfg.tie_word_embeddings  # Gemma 3's HF default
    qwen2 = spec.from_dict({**d, "model_type": "qwen2", "hidden_act": "silu",
                            "use_sliding_window": False}, "qwen2")
    assert qwen2.layer_types is None and qwen2.family.qkv_bias
    mistral = spec.from_dict({**d, "model_type": "mistral", "hidden_act": "silu",
                              "sliding_window_pattern": None}, "mistral")
    assert mistral.model_type == "llama" and set(mistral.layer_types) == {SLIDING}
    with pytest.raises(UncostableModel, match=r"layer_types\[1\]='chunked_attention'"):
        spec.from_dict({**d, "layer_types": [FULL, "chunked_attention"] + [FULL] * 16}, "x")
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg, _ = spec.load(str(tmp_path))
    assert cfg.num_params() == config.ModelConfig(
        model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048,
        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        layer_types=cfg.layer_types, sliding_window=512).num_params()
