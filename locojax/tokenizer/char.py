"""A fixed character-level tokenizer for the built-in tasks: no files, no training.

Vocabulary (100 ids, fits any model with vocab_size ≥ 100, e.g. TINY's 512):
  0 `<pad>`, 1 `<eos>`, 2 `<|im_start|>`, 3 `<|im_end|>`, 4 `\\n`, 5..99 the printable ASCII
  characters `' '`..`'~'` in code-point order.

Text outside that set raises ValueError naming the character and its position, unless the
tokenizer was built with `replace_unknown="?"` (any in-vocabulary character), which maps
every unknown character to it: lossy, so it is opt-in. Special-token strings in the text
encode to their single ids, as HF tokenizers do, so `decode(encode(s), skip_special=False)
== s` for every string of vocabulary characters, and `decode(encode(s)) == s` when `s`
holds no special-token string. Ids ≥ vocab_size (a model vocabulary is usually larger than
its tokenizer's) decode to U+FFFD rather than raising, so sampling from an untrained model
never crashes a rollout; negative or non-integer ids raise.
"""

from __future__ import annotations

import re
from typing import Sequence

from locojax.tokenizer.base import IM_END, IM_START, render_chat

PAD, EOS = "<pad>", "<eos>"
SPECIALS = (PAD, EOS, IM_START, IM_END)
CHARS = ("\n",) + tuple(chr(c) for c in range(0x20, 0x7F))
REPLACEMENT = "\ufffd"


class CharTokenizer:
    """One id per character, plus four specials; see the module docstring."""

    def __init__(self, replace_unknown: str | None = None):
        self._tokens = SPECIALS + CHARS
        self._id = {t: i for i, t in enumerate(self._tokens)}
        self._char_id = {c: self._id[c] for c in CHARS}
        if replace_unknown is not None and replace_unknown not in CHARS:
            raise ValueError(f"replace_unknown={replace_unknown!r} must be one vocabulary "
                             "character (printable ASCII or newline)")
        self._unk = None if replace_unknown is None else self._id[replace_unknown]
        # Longest first, so no special is cut short by another that prefixes it.
        self._split = re.compile("(" + "|".join(
            re.escape(s) for s in sorted(SPECIALS, key=len, reverse=True)) + ")")
        self.vocab_size = len(self._tokens)
        self.pad_id = self._id[PAD]
        self.eos_id = self._id[EOS]
        self.im_start_id = self._id[IM_START]
        self.im_end_id = self._id[IM_END]
        self.stop_ids = (self.eos_id, self.im_end_id)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode expects str, got {type(text).__name__}")
        ids, pos = [], 0
        for k, piece in enumerate(self._split.split(text)):
            if k % 2:  # captured special
                ids.append(self._id[piece])
            else:
                for j, ch in enumerate(piece):
                    i = self._char_id.get(ch)
                    if i is None:
                        if self._unk is None:
                            raise ValueError(
                                f"character {ch!r} (U+{ord(ch):04X}) at position {pos + j} is "
                                "not in the char vocabulary (printable ASCII and newline)")
                        i = self._unk
                    ids.append(i)
            pos += len(piece)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        out = []
        for j, i in enumerate(ids):
            try:
                i = int(i)
                if i != ids[j]:
                    raise ValueError
            except (TypeError, ValueError):
                raise ValueError(f"id {ids[j]!r} at position {j} is not an integer") from None
            if i < 0:
                raise ValueError(f"id {i} at position {j} is negative")
            if i >= self.vocab_size:
                out.append(REPLACEMENT)
            elif not (skip_special and i < len(SPECIALS)):
                out.append(self._tokens[i])
        return "".join(out)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> str:
        return render_chat(messages, add_generation_prompt)

    def vocabulary(self) -> list[tuple[int, str]]:
        """(id, token) for every id, in id order."""
        return list(enumerate(self._tokens))

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size})"
