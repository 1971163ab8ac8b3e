"""A decode step holds no copy of the whole KV cache, in bf16 or f32 (docs/real_size.md).

XLA:CPU slices and updates a bf16 array through an f32 conversion of all of it, and hoisted
that conversion of the whole cache out of the decode's loops: a decode step held every
layer's keys and values in f32 twice, plus a bf16 copy (11 GB a device at Qwen3-4B).
`KVCache.read` and `write` now work on the cache's bits. Compiled only, from abstract shapes.
"""

import jax.numpy as jnp
import pytest

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config

MODEL = config.tiny(num_hidden_layers=4)
PROMPTS, PROMPT_LEN, SAMPLES, NEW = 16, 64, 4, 193  # 64 rows, 256 cache slots


@pytest.mark.parametrize("cache_dtype", ["bf16", "f32"])
def test_decode_temporaries_hold_less_than_one_layers_cache_in_f32(cache_dtype):
    """XLA's temporaries of the decode program stay below one layer's keys and values in
    f32: 2 x rows x KV heads x head_dim x slots x 4 bytes (4.2 MB here).

    The bound's derivation: what a decode step needs besides the donated cache is per-row
    (the step's activations, the [rows, V] logits: 131 KB here) or one read of the cache's
    blocks (at most `fold_slots` row-slots, one layer). Any copy of the whole cache is L = 4
    layers: in bf16 it is twice the bound, in f32 four times, so one such copy fails the
    test whatever the small buffers are. Before the fix the bf16 decode held 17.6 MB (two
    f32 copies of the cache); writing on the bits alone left a hoisted uint16 copy of it
    (8.9 MB); the f32 cache's decode held 0.8 MB and still must.
    """
    engine = Engine(MODEL, cache_dtype=cache_dtype)
    sampling = SamplingConfig(max_new_tokens=NEW, stop_token_ids=(1,), pad_token_id=0)
    _, decode = engine.compile(PROMPTS, PROMPT_LEN, sampling, SAMPLES)
    rows, slots = PROMPTS * SAMPLES, PROMPT_LEN + NEW - 1
    one_layer_f32 = 2 * rows * MODEL.num_key_value_heads * MODEL.head_dim * slots * 4
    whole_cache = MODEL.num_hidden_layers * one_layer_f32 * jnp.dtype(
        engine.cache_dtype).itemsize // 4
    assert whole_cache >= 2 * one_layer_f32  # the premise: any whole copy breaks the bound
    memory = decode.memory_analysis()
    assert memory.alias_size_in_bytes >= whole_cache  # the cache is donated, updated in place
    assert memory.temp_size_in_bytes < one_layer_f32
