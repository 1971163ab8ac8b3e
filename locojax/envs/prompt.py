"""An example's prompt as token ids: the one encoding rollout, prompt sizing and tools share.

A text prompt is encoded as it is; a chat prompt (a list of messages) goes through the
tokenizer's chat template with the generation prompt appended, as the model will see it.
"""

from __future__ import annotations

from locojax.envs.base import Example


def encode_prompt(tokenizer, example: Example) -> list[int]:
    prompt = example.prompt
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
    return tokenizer.encode(prompt)
