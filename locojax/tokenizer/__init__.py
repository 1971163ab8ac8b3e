"""Tokenizers: a small common interface (`base.Tokenizer`) and its two implementations."""

from __future__ import annotations

from pathlib import Path

from locojax.tokenizer.base import Tokenizer, render_chat
from locojax.tokenizer.char import CharTokenizer
from locojax.tokenizer.hf import HFTokenizer

__all__ = ["Tokenizer", "CharTokenizer", "HFTokenizer", "load_tokenizer", "render_chat"]


def load_tokenizer(path_or_name: str | Path) -> Tokenizer:
    """`"char"` → the built-in CharTokenizer; a directory with tokenizer.json → HFTokenizer."""
    if str(path_or_name) == "char":
        return CharTokenizer()
    path = Path(path_or_name)
    if path.is_dir():
        return HFTokenizer.from_dir(path)
    raise ValueError(f"unknown tokenizer {str(path_or_name)!r}: expected 'char' or a directory "
                     "holding tokenizer.json")
