"""Tokenizers: a small common interface (`base.Tokenizer`) and its two implementations.

    base.py            the interface (`Tokenizer`) and the Qwen chat format
    char.py            the built-in character-level tokenizer
    hf.py              an HF `tokenizer.json` behind the interface
    chat_template.py   a checkpoint's own chat template, rendered as transformers does
    gguf_vocab.py      a GGUF file's vocabulary as HF tokenizer files

`fingerprint` names a vocabulary (every id and its token), so a model can record the one it
was trained with, and `load_tokenizer(..., trained_with=...)` refuses another one of the same
size, which the model's vocab_size check alone cannot tell apart.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from locojax.tokenizer.base import Tokenizer, decode_all, render_chat
from locojax.tokenizer.char import CharTokenizer
from locojax.tokenizer.hf import HFTokenizer

__all__ = ["Tokenizer", "CharTokenizer", "HFTokenizer", "decode_all", "fingerprint",
           "load_tokenizer", "render_chat"]


def fingerprint(tok: Tokenizer) -> str:
    """sha256 (hex) of the tokenizer's vocabulary: every (id, token) pair, in id order."""
    table = json.dumps(tok.vocabulary(), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(table.encode()).hexdigest()


def load_tokenizer(path_or_name: str | Path, trained_with: str | None = None) -> Tokenizer:
    """`"char"` → the built-in CharTokenizer; a directory with tokenizer.json → HFTokenizer.

    `trained_with`: the `fingerprint` of the vocabulary the caller's model was trained with;
    another vocabulary, even one of the same size, is a ValueError naming the file.
    """
    if str(path_or_name) == "char":
        tok, where = CharTokenizer(), "the built-in char tokenizer"
    elif Path(path_or_name).is_dir():
        tok = HFTokenizer.from_dir(path_or_name)
        where = str(Path(path_or_name) / "tokenizer.json")
    else:
        raise ValueError(f"unknown tokenizer {str(path_or_name)!r}: expected 'char' or a "
                         "directory holding tokenizer.json")
    if trained_with is not None and (got := fingerprint(tok)) != trained_with:
        raise ValueError(f"{where}: not the vocabulary the model was trained with (the same "
                         f"{tok.vocab_size} ids may map to other tokens): fingerprint "
                         f"{got[:16]}, recorded {trained_with[:16]}; use the tokenizer files "
                         "saved with the model")
    return tok
