"""A small GGUF file written here, as llama.cpp's converter would write a Llama checkpoint.

`write_llama_gguf` takes HF-named f32 tensors and writes them the way
`convert_hf_to_gguf.py` does: GGUF names, q and k rows permuted per head into llama.cpp's
interleaved RoPE pairs (`llama_cpp_permute`, written from that script's `permute`, not
from locojax's inverse), chosen tensors quantized, the config and a byte-level BPE
vocabulary as metadata. `truth` is what a correct conversion must give back: each tensor
as the file holds it (quantized ones through the `gguf` package's own round trip).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.hf_reference import cut_down, published

D, F, L, HEADS, KV, HEAD_DIM = 64, 128, 2, 4, 2, 16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
                 "'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
                 "{{'<|im_start|>assistant\n'}}{% endif %}")
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]
"""`1 2` would join the digits "12" into one token if digits were not split first."""


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (`bytes_to_unicode`), in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def vocabulary() -> list[str]:
    merged = ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + byte_alphabet() + merged


def hf_config() -> dict:
    """SmolLM2-135M-Instruct's published config at TINY's sizes (tests/data/hf_configs.json)."""
    d = cut_down(published("smollm2-135m-instruct"), vocab_size=len(vocabulary()))
    return {**d, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def random_state(seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named random f32 tensors of `hf_config()` (tied: no lm_head)."""
    rng = np.random.default_rng(seed)
    V = len(vocabulary())
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                   p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, D),
                   p + "self_attn.k_proj.weight": (KV * HEAD_DIM, D),
                   p + "self_attn.v_proj.weight": (KV * HEAD_DIM, D),
                   p + "self_attn.o_proj.weight": (D, HEADS * HEAD_DIM),
                   p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                   p + "mlp.down_proj.weight": (D, F)}
    return {k: ((1.0 if "norm" in k else 0.0) + 0.1 * rng.standard_normal(s)).astype(np.float32)
            for k, s in shapes.items()}


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp `LlamaModel.permute`: rows [heads, 2, h/2] → [heads, h/2, 2]."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


QUANTIZED = {"model.embed_tokens.weight": gguf.GGMLQuantizationType.Q8_0,
             "model.layers.0.mlp.down_proj.weight": gguf.GGMLQuantizationType.Q4_1,
             "model.layers.1.self_attn.q_proj.weight": gguf.GGMLQuantizationType.Q4_1}
"""Tensors stored quantized (one permuted q among them); the rest are F32."""


def write_llama_gguf(path: Path, state: dict[str, np.ndarray], *, arch: str = "llama",
                     pre: str = "smollm", extra_tensors: dict | None = None,
                     extra_fields: dict | None = None) -> dict[str, np.ndarray]:
    """Write `state` as a GGUF file at `path`; returns the tensors a correct conversion gives
    back (HF names and layout; quantized tensors as dequantized from the file)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100_000.0)
    w.add_vocab_size(len(vocabulary()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(vocabulary())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(vocabulary()) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in (extra_fields or {}).items():
        w.add_float32(key, value)
    truth = {}
    for hf, arr in state.items():
        stored = arr
        if hf.endswith("q_proj.weight"):
            stored = llama_cpp_permute(arr, HEADS)
        elif hf.endswith("k_proj.weight"):
            stored = llama_cpp_permute(arr, KV)
        qtype = QUANTIZED.get(hf, gguf.GGMLQuantizationType.F32)
        data = gguf.quants.quantize(stored, qtype)
        w.add_tensor(gguf_name(hf), data, raw_dtype=qtype)
        # What the file holds, in HF layout: the quantization round trip of the unpermuted
        # tensor equals that of the permuted one, permuted back (rows are quantized alone).
        truth[hf] = arr if qtype == gguf.GGMLQuantizationType.F32 else None
        if truth[hf] is None:
            back = gguf.quants.dequantize(data, qtype)
            truth[hf] = (_unpermute_rows(back, hf) if hf.endswith(("q_proj.weight",
                                                                     "k_proj.weight"))
                         else back)
    for name, (arr, qtype) in (extra_tensors or {}).items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return truth


def _unpermute_rows(back: np.ndarray, hf: str) -> np.ndarray:
    """Permuted rows back to HF order, by inverting `llama_cpp_permute` as an index map
    (not locojax's `_unpermute`, which the test checks)."""
    heads = HEADS if hf.endswith("q_proj.weight") else KV
    order = llama_cpp_permute(np.arange(back.shape[0]), heads)
    out = np.empty_like(back)
    out[order] = back
    return out
