"""The tokenizer interface every part of locojax uses, and the Qwen chat format.

The engine sees token ids only (docs/design.md); strings exist at the edges: prompts are
rendered with `apply_chat_template` and encoded, completions are decoded for rewards.
Any object with these members is a tokenizer; `CharTokenizer` and `HFTokenizer` are the
two that ship. One may also have `decode_batch(rows, skip_special)`, the texts of many rows
in one call, which `decode_all` uses where it exists (the rollout decodes a batch at once).

Reference: Qwen's ChatML template (`<|im_start|>role\\ncontent<|im_end|>\\n`). Departure:
only the plain-message part of Qwen3's jinja template is rendered (no tools, no
`<think>` handling), identically for every tokenizer, so no jinja engine is needed.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")


@runtime_checkable
class Tokenizer(Protocol):
    """Text ↔ token ids, plus the ids generation needs."""

    vocab_size: int
    """Number of ids the tokenizer can produce (≤ the model's vocab_size)."""
    pad_id: int
    """Id used to left-pad prompts; never attended to."""
    eos_id: int
    """Id that ends a chat turn (Qwen3 chat: `<|im_end|>`)."""
    stop_ids: tuple[int, ...]
    """Every id that ends a completion (eos first)."""

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special-token strings inside it become their single ids; no BOS/EOS
        is added."""
        ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`; special tokens are dropped when `skip_special`."""
        ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> str:
        """The chat rendered as text (see `render_chat`)."""
        ...


def decode_all(tokenizer: Tokenizer, rows: Sequence[Sequence[int]], skip_special: bool = True
               ) -> list[str]:
    """`tokenizer.decode` of every row: through its `decode_batch` where it has one (one call
    for the batch, as `HFTokenizer`'s), else row by row. The same texts either way."""
    batch = getattr(tokenizer, "decode_batch", None)
    if batch is not None:
        return batch(rows, skip_special)
    return [tokenizer.decode(ids, skip_special) for ids in rows]


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Qwen ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then
    `<|im_start|>assistant\\n` when a reply is to be generated.

    Each message is a dict with a `role` in ROLES and a str `content`; anything else raises
    ValueError naming the message.
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"message {i} must be a dict, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"message {i} has role {role!r}; expected one of {ROLES}")
        if not isinstance(content, str):
            raise ValueError(f"message {i} has content of type {type(content).__name__}, "
                             "expected str")
        parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)
