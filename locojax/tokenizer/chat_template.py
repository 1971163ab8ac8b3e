"""A checkpoint's own chat template (`--task.template chat`), rendered as transformers does.

Instruct checkpoints ship their prompt format as a Jinja template: `chat_template` in
`tokenizer_config.json`, or a `chat_template.jinja` file beside it (transformers >= 4.50
writes it there, and a file there wins, as in transformers). `ChatTemplate` renders it with
jinja2's sandboxed environment configured as transformers configures it, so a prompt is the
text `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`
gives, byte for byte (tests/test_chat_template.py checks Qwen2.5, Qwen3, Llama 3.2,
SmolLM2 and Gemma 3 against transformers itself). The template sees the named special
tokens of `tokenizer_config.json` (`bos_token`, `eos_token`, ...), so a template that opens
with `{{ bos_token }}` (Llama 3, Gemma 3) writes the BOS text, which the tokenizer then
encodes as its single id.

`with_chat_template(tokenizer, model_dir)` puts the template behind the ordinary Tokenizer
interface; the rest of the pipeline is unchanged. Stop tokens are the tokenizer's, which
`HFTokenizer.from_dir` takes from `generation_config.json` (`eos_token_id`, one id or a
list: Llama 3's `<|eot_id|>`, Gemma 3's `<end_of_turn>`).

Reference: transformers `utils/chat_template_utils.py` (`_compile_jinja_template`,
`render_jinja_template`) and `PreTrainedTokenizerBase.apply_chat_template`. Departures: no
tools, documents or assistant-token masks (a prompt here is messages only); the
`{% generation %}` tag renders its body and tracks nothing.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from locojax.jsonfile import read_object
from locojax.tokenizer.base import decode_all

CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
"""The named special tokens transformers hands every template (`special_tokens_map`)."""


class ChatTemplateError(ValueError):
    """A chat template that is missing, does not compile, or refuses a conversation."""


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (training templates mark the assistant's
    tokens with it): renders the body; transformers also records its span, not needed here."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As transformers: jinja's own tojson escapes HTML characters, which a prompt must not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` inside a template, without attribute access to the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names (a way out of the sandbox otherwise)."""

    def __init__(*args, **kwargs):  # jinja's own signature trick: `namespace(self=...)` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore attributes on a namespace: {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_TemplateDict(), namespace=_Namespace)
    return env


def _token_text(value) -> str | None:
    """tokenizer_config.json spells a token as a str or as {"content": str, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(config: dict) -> dict[str, str]:
    """The token variables a template sees: the named special tokens that are set, and a
    model's own named ones (`extra_special_tokens` given as a mapping, e.g. Gemma 3's
    `boi_token`), as transformers' `special_tokens_map` holds them."""
    out = {name: _token_text(config.get(name)) for name in SPECIAL_TOKENS}
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        out.update({name: _token_text(value) for name, value in extra.items()})
    return {name: text for name, text in out.items() if text is not None}


class ChatTemplate:
    """A compiled chat template and the token variables it is rendered with."""

    def __init__(self, source: str, tokens: dict[str, str] | None = None, origin: str = ""):
        self.origin = origin or "chat template"
        self.tokens = dict(tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{self.origin}: chat template does not compile: "
                                    f"{e.message} (template line {e.lineno})") from None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ChatTemplate:
        """The template of a checkpoint directory: `chat_template.jinja` if present, else
        `chat_template` of `tokenizer_config.json`; neither is a ChatTemplateError naming
        the files."""
        model_dir = Path(model_dir)
        config_path = model_dir / CONFIG_FILE
        config = read_object(config_path) if config_path.is_file() else {}
        file = model_dir / TEMPLATE_FILE
        if file.is_file():
            return cls(file.read_text(encoding="utf-8"), special_tokens(config), str(file))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one serves plain chat
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str) or not source.strip():
            where = (f"{config_path} has no chat_template" if config_path.is_file()
                     else f"there is no {CONFIG_FILE} in {model_dir}")
            raise ChatTemplateError(
                f"--task.template chat renders prompts with the checkpoint's own chat template, "
                f"but {where} (and there is no {file.name}); use an instruct checkpoint's "
                "tokenizer files, or --task.template plain")
        return cls(source, special_tokens(config), str(config_path))

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        """The conversation as the model's prompt text. Messages are plain dicts; keys whose
        value is None are dropped first, as transformers does (templates test for absence)."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ChatTemplateError("a chat needs a non-empty list of messages")
        chat = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) and not hasattr(m, "items"):
                raise ChatTemplateError(f"message {i} must be a dict, got {type(m).__name__}")
            chat.append({k: v for k, v in dict(m).items() if v is not None})
        try:
            return self._template.render(messages=chat, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt,
                                         **self.tokens)
        except jinja2.TemplateError as e:  # raise_exception(...) inside the template, mostly
            raise ChatTemplateError(f"{self.origin}: the chat template refused the "
                                    f"conversation: {e}") from None


class ChatTemplateTokenizer:
    """A tokenizer whose `apply_chat_template` is the checkpoint's own template; everything
    else (ids, vocabulary, stop ids) is the wrapped tokenizer's."""

    def __init__(self, tokenizer, template: ChatTemplate):
        self.inner = tokenizer
        self.template = template
        self.vocab_size = tokenizer.vocab_size
        self.pad_id = tokenizer.pad_id
        self.eos_id = tokenizer.eos_id
        self.stop_ids = tuple(tokenizer.stop_ids)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.inner.decode(ids, skip_special)

    def decode_batch(self, rows, skip_special: bool = True) -> list[str]:
        return decode_all(self.inner, rows, skip_special)

    def vocabulary(self):
        return self.inner.vocabulary()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return self.template.render(messages, add_generation_prompt)

    def __repr__(self):
        return f"ChatTemplateTokenizer({self.inner!r}, {self.template.origin!r})"


def with_chat_template(tokenizer, model_dir: str | Path | None):
    """`tokenizer` rendering chats with the template of `model_dir` (see `ChatTemplate`);
    None (a preset: random weights, the char tokenizer) has no template to render."""
    if model_dir is None:
        raise ChatTemplateError("--task.template chat needs a checkpoint directory with a chat "
                                "template; a preset model has none (use --task.template plain)")
    return ChatTemplateTokenizer(tokenizer, ChatTemplate.from_dir(model_dir))
