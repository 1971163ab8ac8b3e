"""A HF `tokenizer.json` (the `tokenizers` library) behind the locojax Tokenizer interface.

Only the fast-tokenizer file is read: no transformers at run time. Special ids come from
`tokenizer_config.json` (`eos_token`, `pad_token`) and `generation_config.json`
(`eos_token_id`, which may list several) when present, else from the tokens Qwen uses:
for Qwen3 chat models eos is `<|im_end|>` and pad `<|endoftext|>`, and both stop a
completion.

Departure from transformers: `apply_chat_template` here is the Qwen ChatML rendering of
`base.render_chat` (`--task.template qwen`); the checkpoint's own jinja `chat_template` is
rendered by `chat_template.with_chat_template` (`--task.template chat`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer as _RustTokenizer

from locojax.jsonfile import read_object
from locojax.tokenizer.base import IM_END, IM_START, render_chat

ENDOFTEXT = "<|endoftext|>"
_EOS_FALLBACKS = (IM_END, ENDOFTEXT, "</s>", "<eos>")


def _token_text(value) -> str | None:
    """tokenizer_config.json spells a token as a str or as {"content": str, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    """A JSON object from `path` ({} when absent); a corrupt file is a ValueError naming it."""
    return read_object(path) if path.is_file() else {}


class HFTokenizer:
    """Wraps a `tokenizers.Tokenizer`; build with `from_dir` or directly."""

    def __init__(self, tokenizer: _RustTokenizer, eos_token: str | None = None,
                 pad_token: str | None = None, extra_stop_ids: Sequence[int] = (),
                 source: str = "tokenizer"):
        self.tokenizer = tokenizer
        self.source = source
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        if eos_token is None:
            eos_token = next((t for t in _EOS_FALLBACKS if self._id(t) is not None), None)
            if eos_token is None:
                raise ValueError(f"{source}: no eos_token given and none of "
                                 f"{list(_EOS_FALLBACKS)} is in the vocabulary")
        self.eos_id = self._require(eos_token, "eos_token")
        if pad_token is None:
            pad_token = ENDOFTEXT if self._id(ENDOFTEXT) is not None else eos_token
        self.pad_id = self._require(pad_token, "pad_token")
        stops = [self.eos_id, *map(int, extra_stop_ids)]
        stops += [i for i in (self._id(IM_END), self._id(ENDOFTEXT)) if i is not None]
        self.stop_ids = tuple(dict.fromkeys(stops))

    def _id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def vocabulary(self) -> list[tuple[int, str]]:
        """(id, token) for every id, in id order."""
        return sorted(((i, t) for t, i in self.tokenizer.get_vocab(with_added_tokens=True)
                       .items()))

    def _require(self, token: str, what: str) -> int:
        i = self._id(token)
        if i is None:
            raise ValueError(f"{self.source}: {what} {token!r} is not in the vocabulary")
        return i

    @classmethod
    def from_dir(cls, path: str | Path) -> "HFTokenizer":
        """From a HF model directory holding `tokenizer.json` (and optionally
        `tokenizer_config.json`, `generation_config.json`)."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        config = _read_json(path / "tokenizer_config.json")
        gen_eos = _read_json(path / "generation_config.json").get("eos_token_id", ())
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or ())
        try:
            rust = _RustTokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception, without the path
            _read_json(file)  # corrupt JSON: its path and line
            raise ValueError(f"{file}: not a tokenizers file ({e})") from None
        return cls(rust,
                   eos_token=_token_text(config.get("eos_token")),
                   pad_token=_token_text(config.get("pad_token")),
                   extra_stop_ids=gen_eos, source=str(path))

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode expects str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        bad = [(j, i) for j, i in enumerate(ids) if i < 0]
        if bad:
            raise ValueError(f"id {bad[0][1]} at position {bad[0][0]} is negative")
        # Ids past the vocabulary (model vocab is often padded) are dropped by `tokenizers`.
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def decode_batch(self, rows: Sequence[Sequence[int]], skip_special: bool = True
                     ) -> list[str]:
        """`decode` of every row, in one call into `tokenizers` (no Python round trip per
        row; `base.decode_all`)."""
        rows = [[int(i) for i in ids] for ids in rows]
        for r, ids in enumerate(rows):
            if ids and min(ids) < 0:
                raise ValueError(f"id {min(ids)} in row {r} is negative")
        return self.tokenizer.decode_batch(rows, skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> str:
        for token in (IM_START, IM_END):
            self._require(token, "chat template token")
        return render_chat(messages, add_generation_prompt)

    def __repr__(self):
        return f"HFTokenizer({self.source!r}, vocab_size={self.vocab_size})"
