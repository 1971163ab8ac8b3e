"""A GGUF file's vocabulary as HF tokenizer files (`tokenizer.json` and its configs).

GGUF stores a byte-level BPE vocabulary as three arrays (`tokenizer.ggml.tokens`, `.merges`,
`.token_type`) plus the name of the pre-tokenizer it was learned with
(`tokenizer.ggml.pre`). The tokens and merges are the HF vocabulary as it was, byte-level
spelled (`Ġthe`), so the BPE model is rebuilt from them directly; the pre-tokenizer is not
stored, only named, so each supported name maps to the `tokenizers` pre-tokenizer of the
checkpoint it came from. An unknown name is refused: guessing it would split text in a way
the merges were not learned on, and every prompt would silently encode differently.

Departure from transformers' GGUF loader (`integrations/gguf/gguf_tokenizer_mapping.py`):
there, `smollm` gets plain GPT-2 splitting, which keeps digit runs together ("123" as one
piece), while SmolLM2's own tokenizer (and llama.cpp's `smollm` pre-tokenizer) split every
digit apart. Numbers are what the arithmetic tasks score, so the checkpoint's own rule is
kept here.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3
"""`tokenizer.ggml.token_type` of a special (control) token, e.g. `<|im_end|>`."""

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=False)])


PRE_TOKENIZERS = {
    # SmolLM / SmolLM2 (llama.cpp `smollm`): every digit alone, then GPT-2's byte-level split.
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               _byte_level()]),
    # GPT-2's own rule (llama.cpp `gpt-2` and `default`).
    "gpt-2": _byte_level,
    "default": _byte_level,
    # Llama 3 (llama.cpp `llama-bpe`): numbers in runs of at most three digits.
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
}
"""`tokenizer.ggml.pre` → the pre-tokenizer that vocabulary was learned with."""


def _field(fields: dict, key: str, default=None):
    f = fields.get(key)
    return default if f is None else f.contents()


def build_tokenizer(fields: dict, source: str) -> Tokenizer:
    """The `tokenizers.Tokenizer` of a GGUF file's `tokenizer.ggml.*` fields (a
    `GGUFReader.fields` dict); ValueError naming `source` for a kind it cannot rebuild."""
    kind = _field(fields, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{source}: tokenizer.ggml.model={kind!r} is not supported (only "
                         "'gpt2', byte-level BPE)")
    pre = _field(fields, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{source}: tokenizer.ggml.pre={pre!r} is not supported "
                         f"({', '.join(PRE_TOKENIZERS)})")
    tokens = list(_field(fields, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(fields, "tokenizer.ggml.merges", [])]
    types = list(_field(fields, "tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.tokens repeats a token")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    return tok


def _token(tokens: list[str], fields: dict, key: str) -> str | None:
    i = _field(fields, f"tokenizer.ggml.{key}_token_id")
    return None if i is None else tokens[int(i)]


def write_tokenizer_files(fields: dict, out_dir: str | Path, source: str,
                          max_length: int) -> dict[str, int]:
    """Write `tokenizer.json`, `tokenizer_config.json` (with the chat template) and
    `generation_config.json` into `out_dir`; returns the config.json token ids
    (`bos_token_id`, `eos_token_id`, `pad_token_id`) the file names."""
    out_dir = Path(out_dir)
    tok = build_tokenizer(fields, source)
    tok.save(str(out_dir / "tokenizer.json"))
    tokens = list(_field(fields, "tokenizer.ggml.tokens"))
    names = {k: _token(tokens, fields, k) for k in ("bos", "eos", "unknown", "padding")}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": bool(_field(fields, "tokenizer.ggml.add_bos_token", False)),
        "bos_token": names["bos"], "eos_token": names["eos"],
        "unk_token": names["unknown"], "pad_token": names["padding"] or names["eos"],
    }
    template = _field(fields, "tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    _write_json(out_dir / "tokenizer_config.json", {k: v for k, v in config.items()
                                                   if v is not None})
    ids = {f"{k}_token_id": int(_field(fields, f"tokenizer.ggml.{g}_token_id"))
           for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))
           if _field(fields, f"tokenizer.ggml.{g}_token_id") is not None}
    _write_json(out_dir / "generation_config.json", ids)
    return ids


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
