"""Tokenizers: char round trips, chat-template ids, the HF wrapper on an offline-built
tokenizer, and clear errors on bad input."""

import json
import string

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from locojax.tokenizer import CharTokenizer, HFTokenizer, Tokenizer as TokenizerProtocol
from locojax.tokenizer import load_tokenizer, render_chat

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"}]
CHAT_TEXT = ("<|im_start|>system\nBe brief.<|im_end|>\n"
             "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")


# ---- CharTokenizer -------------------------------------------------------------------

def test_char_vocab_is_fixed_and_small():
    tok = CharTokenizer()
    assert isinstance(tok, TokenizerProtocol)
    assert tok.vocab_size == 4 + 95 + 1 <= 128
    assert (tok.pad_id, tok.eos_id, tok.im_start_id, tok.im_end_id) == (0, 1, 2, 3)
    assert tok.stop_ids == (1, 3)
    # One id per character; every id is distinct and in range.
    ids = tok.encode(string.printable.replace("\t", "").replace("\r", "")
                     .replace("\x0b", "").replace("\x0c", ""))
    assert len(set(ids)) == len(ids) == 96
    assert all(4 <= i < tok.vocab_size for i in ids)


def test_char_round_trips_random_printable_text():
    tok = CharTokenizer()
    rng = np.random.default_rng(0)
    alphabet = [chr(c) for c in range(0x20, 0x7F)] + ["\n"]
    for n in (0, 1, 17, 300):
        text = "".join(rng.choice(alphabet, n))
        ids = tok.encode(text)
        assert len(ids) == len(text)
        assert tok.decode(ids) == text
        assert tok.decode(ids, skip_special=False) == text


def test_char_specials_encode_as_single_ids():
    tok = CharTokenizer()
    text = "a<|im_start|>b<eos><pad><|im_end|>"
    ids = tok.encode(text)
    assert ids == [tok.encode("a")[0], 2, tok.encode("b")[0], 1, 0, 3]
    assert tok.decode(ids, skip_special=False) == text
    assert tok.decode(ids) == "ab"
    # A half-written special is plain characters.
    assert len(tok.encode("<|im_start")) == len("<|im_start")


def test_char_chat_template_ids():
    tok = CharTokenizer()
    text = tok.apply_chat_template(CHAT)
    assert text == CHAT_TEXT
    ids = tok.encode(text)
    assert ids.count(tok.im_start_id) == 3 and ids.count(tok.im_end_id) == 2
    assert ids[0] == tok.im_start_id
    # Ends with the generation prompt "<|im_start|>assistant\n".
    assert ids[-len("assistant\n") - 1:] == [tok.im_start_id] + tok.encode("assistant\n")
    no_prompt = tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=False))
    assert no_prompt[-2:] == [tok.im_end_id, tok.encode("\n")[0]]
    assert ids[:len(no_prompt)] == no_prompt


def test_char_bad_input():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=r"'é' \(U\+00E9\) at position 3"):
        tok.encode("caf\u00e9")
    with pytest.raises(ValueError, match="position 1"):
        tok.encode("a\tb")
    with pytest.raises(ValueError, match="str"):
        tok.encode([1, 2])
    with pytest.raises(ValueError, match="negative"):
        tok.decode([5, -1])
    with pytest.raises(ValueError, match="not an integer"):
        tok.decode([5, 2.5])
    # Ids past the tokenizer vocab (the model's is larger) are visible, not fatal.
    assert tok.decode([tok.encode("x")[0], 400]) == "x\ufffd"
    with pytest.raises(ValueError, match="replace_unknown"):
        CharTokenizer(replace_unknown="\u00e9")
    lossy = CharTokenizer(replace_unknown="?")
    assert lossy.decode(lossy.encode("caf\u00e9 \u20ac5")) == "caf? ?5"


def test_chat_messages_are_validated():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="message 1 has role 'robot'"):
        tok.apply_chat_template([{"role": "user", "content": "a"},
                                 {"role": "robot", "content": "b"}])
    with pytest.raises(ValueError, match="message 0 has content of type int"):
        tok.apply_chat_template([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="message 0 must be a dict"):
        tok.apply_chat_template(["hi"])
    assert render_chat([], add_generation_prompt=True) == "<|im_start|>assistant\n"


# ---- HFTokenizer ---------------------------------------------------------------------

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["Natalia sold clips to 48 of her friends in April.",
          "The answer is 72.", "hello world", "What is 2+3? It is 5."] * 4


def build_hf_tokenizer(specials=QWEN_SPECIALS) -> Tokenizer:
    """A byte-level BPE trained offline on a few strings, with Qwen's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture
def hf_dir(tmp_path):
    build_hf_tokenizer().save(str(tmp_path / "tokenizer.json"))
    # As Qwen3's tokenizer_config.json spells them (one as an AddedToken dict).
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"},
         "bos_token": None}))
    return tmp_path


def test_hf_encode_decode_and_specials(hf_dir):
    tok = load_tokenizer(hf_dir)
    assert isinstance(tok, HFTokenizer) and isinstance(tok, TokenizerProtocol)
    raw = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    assert tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)
    assert tok.eos_id == raw.token_to_id("<|im_end|>")
    assert tok.pad_id == raw.token_to_id("<|endoftext|>")
    assert tok.eos_id != tok.pad_id
    assert set(tok.stop_ids) == {tok.eos_id, tok.pad_id} and tok.stop_ids[0] == tok.eos_id
    for text in ["The answer is 72.", "unseen wörds ✓ and 12345", ""]:
        ids = tok.encode(text)
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    # Merges were learned, so a seen phrase takes fewer ids than characters.
    assert len(tok.encode("The answer is 72.")) < len("The answer is 72.")
    ids = tok.encode("hi<|im_end|>")
    assert ids[-1] == tok.eos_id and ids.count(tok.eos_id) == 1
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special=False) == "hi<|im_end|>"
    assert tok.decode(np.asarray(ids)) == "hi"


def test_hf_chat_template_ids(hf_dir):
    tok = HFTokenizer.from_dir(hf_dir)
    text = tok.apply_chat_template(CHAT)
    assert text == CHAT_TEXT == CharTokenizer().apply_chat_template(CHAT)
    ids = tok.encode(text)
    im_start = tok.tokenizer.token_to_id("<|im_start|>")
    assert ids.count(im_start) == 3 and ids.count(tok.eos_id) == 2
    assert tok.decode(ids, skip_special=False) == text
    assert tok.decode(ids) == "system\nBe brief.\nuser\nWhat is 2+3?\nassistant\n"
    gen = tok.encode("<|im_start|>assistant\n")
    assert ids[-len(gen):] == gen


def test_hf_defaults_without_config(tmp_path):
    """No tokenizer_config.json: Qwen's tokens are found by name; generation_config adds
    stop ids."""
    build_hf_tokenizer().save(str(tmp_path / "tokenizer.json"))
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [100, 101]}))
    tok = HFTokenizer.from_dir(tmp_path)
    assert tok.eos_id == raw.token_to_id("<|im_end|>")
    assert tok.pad_id == raw.token_to_id("<|endoftext|>")
    assert tok.stop_ids[:3] == (tok.eos_id, 100, 101)


def test_hf_bad_input(tmp_path, hf_dir):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer.from_dir(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown tokenizer 'nope'"):
        load_tokenizer("nope")
    tok = HFTokenizer.from_dir(hf_dir)
    with pytest.raises(ValueError, match="negative"):
        tok.decode([3, -2])
    with pytest.raises(ValueError, match="str"):
        tok.encode(None)
    # eos named by the config but absent from the vocabulary.
    bad = tmp_path / "bad"
    bad.mkdir()
    build_hf_tokenizer().save(str(bad / "tokenizer.json"))
    (bad / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ValueError, match="eos_token '</s>' is not in the vocabulary"):
        HFTokenizer.from_dir(bad)
    # A tokenizer without the ChatML tokens cannot render chats.
    plain = HFTokenizer(build_hf_tokenizer(specials=["</s>"]))
    assert plain.eos_id == plain.pad_id == plain.tokenizer.token_to_id("</s>")
    with pytest.raises(ValueError, match="<\\|im_start\\|>"):
        plain.apply_chat_template(CHAT)


def test_load_tokenizer_char():
    tok = load_tokenizer("char")
    assert isinstance(tok, CharTokenizer)
    assert tok.decode(tok.encode("12+30=42\n")) == "12+30=42\n"


# ---- corrupt files and another vocabulary of the same size ----------------------------


def test_corrupt_tokenizer_files_name_the_file_and_line(hf_dir):
    """A JSON error from the tokenizers library or json.load names no file: ours do."""
    (hf_dir / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>",\n "pad_token": }')
    with pytest.raises(ValueError, match=r"tokenizer_config.json:2:15: invalid JSON"):
        load_tokenizer(hf_dir)
    (hf_dir / "tokenizer_config.json").write_text("[]")
    with pytest.raises(ValueError, match=r"tokenizer_config.json: must hold a JSON object"):
        load_tokenizer(hf_dir)
    (hf_dir / "tokenizer_config.json").unlink()
    (hf_dir / "generation_config.json").write_bytes(b'{"eos_token_id": "\xff"}')
    with pytest.raises(ValueError, match=r"generation_config.json: not UTF-8"):
        load_tokenizer(hf_dir)
    (hf_dir / "generation_config.json").unlink()
    text = (hf_dir / "tokenizer.json").read_text()
    (hf_dir / "tokenizer.json").write_text(text[: len(text) // 2])  # a truncated download
    with pytest.raises(ValueError, match=r"tokenizer.json:\d+:\d+: invalid JSON") as e:
        load_tokenizer(hf_dir)
    assert str(hf_dir) in str(e.value)
    (hf_dir / "tokenizer.json").write_text('{"version": "1.0"}')  # valid JSON, not a tokenizer
    with pytest.raises(ValueError, match=r"tokenizer.json: not a tokenizers file"):
        load_tokenizer(hf_dir)


def test_same_size_but_different_vocabulary_is_refused(hf_dir, tmp_path):
    """A model records its vocabulary's fingerprint; a tokenizer with as many ids but other
    tokens behind them (here: two ids swapped, so "a" encodes as the id of "b") is refused by
    name."""
    from locojax.tokenizer import fingerprint

    mine = load_tokenizer(hf_dir)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    data = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (other_dir / "tokenizer.json").write_text(json.dumps(data))
    other = load_tokenizer(other_dir)
    assert other.vocab_size == mine.vocab_size  # the size check cannot tell them apart
    assert other.encode("a") == mine.encode("b")
    assert fingerprint(other) != fingerprint(mine)
    assert load_tokenizer(hf_dir, trained_with=fingerprint(mine)).vocab_size == mine.vocab_size
    with pytest.raises(ValueError, match="not the vocabulary the model was trained with") as e:
        load_tokenizer(other_dir, trained_with=fingerprint(mine))
    assert str(other_dir / "tokenizer.json") in str(e.value)
    char = fingerprint(CharTokenizer())
    assert load_tokenizer("char", trained_with=char).vocab_size == 100
    with pytest.raises(ValueError, match="built-in char tokenizer"):
        load_tokenizer("char", trained_with=fingerprint(mine))
