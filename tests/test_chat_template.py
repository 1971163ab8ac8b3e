"""`--task.template chat`: a checkpoint's own chat template, rendered as transformers does.

Guards: for the templates of Qwen2.5, Qwen3, Llama 3.2, SmolLM2 and Gemma 3 (transcribed in
tests/data/chat_templates.json), locojax's rendering equals transformers'
`apply_chat_template` string for string and id for id, on single- and multi-turn chats with
and without the generation prompt; a template's own refusal (Gemma's role alternation) is an
error in both; stop ids come from generation_config.json; a missing template, a broken one
and a sandbox escape are clear errors naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from locojax.tokenizer import load_tokenizer
from locojax.tokenizer.chat_template import ChatTemplate, ChatTemplateError, with_chat_template

transformers = pytest.importorskip("transformers")

DATA = json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text())
FAMILIES = DATA["families"]
CORPUS = ["Natalia sold clips to 48 of her friends in April.", "The answer is 72.",
          "You are a helpful assistant.", "Cutting Knowledge Date: December 2023",
          "What is 2+3? It is 5.", "caf\u00e9 \u2013 3\u00d74 = 12"] * 4

CHATS = {
    "one user turn": [{"role": "user", "content": "What is 2+3?\nEnd with #### N."}],
    "system and user": [{"role": "system", "content": "You are a careful solver."},
                        {"role": "user", "content": "  caf\u00e9 \u2013 3\u00d74?  \n"}],
    "history": [{"role": "user", "content": "What is 2+3?"},
                {"role": "assistant", "content": "It is 5."},
                {"role": "user", "content": "And 3\u00d74?"}],
    "history with reasoning": [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "<think>\n2 plus 3\n</think>\n\nIt is 5."},
        {"role": "user", "content": "And 3\u00d74?"},
        {"role": "assistant", "content": "<think>\nthree fours\n</think>\n\n12"}],
}


def hf_checkpoint_dir(root: Path, family: str) -> Path:
    """A tokenizer directory as the checkpoint ships it: a small byte-level BPE holding the
    family's special tokens, its tokenizer_config.json, and a generation_config.json whose
    eos_token_id lists the ids of the family's stop tokens."""
    spec = FAMILIES[family]
    d = root / family
    d.mkdir()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=spec["special_tokens"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(d / "tokenizer.json"))
    config = {**spec["tokenizer_config"], "tokenizer_class": "PreTrainedTokenizerFast"}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    (d / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tok.token_to_id(t) for t in spec["stops"]]}))
    return d


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request, tmp_path_factory):
    return request.param, hf_checkpoint_dir(tmp_path_factory.mktemp("tok"), request.param)


@pytest.mark.parametrize("chat", sorted(CHATS))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_renders_as_transformers(family_dir, chat, generation_prompt):
    family, d = family_dir
    hf = transformers.AutoTokenizer.from_pretrained(str(d))
    ours = with_chat_template(load_tokenizer(d), d)
    messages = CHATS[chat]
    if family == "gemma3" and chat == "history with reasoning":
        messages = messages[1:]  # Gemma folds a system turn into the first user turn only
    try:
        want = hf.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=generation_prompt)
    except Exception as e:  # noqa: BLE001 - the template's own raise_exception
        with pytest.raises(ChatTemplateError, match="refused the conversation"):
            ours.apply_chat_template(messages, generation_prompt)
        assert "alternate" in str(e)
        return
    got = ours.apply_chat_template(messages, generation_prompt)
    assert got == want
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    assert ours.encode(got) == list(ids["input_ids"])


def test_gemma_refuses_roles_that_do_not_alternate(tmp_path):
    """The template's raise_exception reaches the user as an error naming the template."""
    d = hf_checkpoint_dir(tmp_path, "gemma3")
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config.json: .*must alternate"):
        ChatTemplate.from_dir(d).render(two_users)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_stop_ids_come_from_generation_config(tmp_path, family):
    d = hf_checkpoint_dir(tmp_path, family)
    tok = with_chat_template(load_tokenizer(d), d)
    listed = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    raw = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert tok.eos_id == raw.token_to_id(FAMILIES[family]["tokenizer_config"]["eos_token"])
    assert tok.stop_ids[0] == tok.eos_id and set(listed) <= set(tok.stop_ids)


def test_bos_renders_as_one_id(tmp_path):
    """Llama 3 opens with {{ bos_token }}: its text encodes to the single BOS id."""
    d = hf_checkpoint_dir(tmp_path, "llama-3.2")
    tok = with_chat_template(load_tokenizer(d), d)
    ids = tok.encode(tok.apply_chat_template(CHATS["one user turn"]))
    assert ids[0] == Tokenizer.from_file(str(d / "tokenizer.json")).token_to_id(
        "<|begin_of_text|>")


def test_missing_template_names_the_file(tmp_path):
    d = hf_checkpoint_dir(tmp_path, "qwen3")
    config = json.loads((d / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match=rf"{d}/tokenizer_config.json has no chat_template"):
        with_chat_template(load_tokenizer(d), d)
    (d / "tokenizer_config.json").unlink()
    with pytest.raises(ChatTemplateError, match=rf"there is no tokenizer_config.json in {d}"):
        ChatTemplate.from_dir(d)
    with pytest.raises(ChatTemplateError, match="a preset model has none"):
        with_chat_template(load_tokenizer("char"), None)


def test_template_file_wins_and_bad_templates_are_named(tmp_path):
    d = hf_checkpoint_dir(tmp_path, "smollm2")
    (d / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert ChatTemplate.from_dir(d).render([{"role": "user", "content": "hi"}]) == "[hi]"
    (d / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja: .*does not compile"):
        ChatTemplate.from_dir(d)


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
])
def test_the_sandbox_holds(source):
    """Templates come from downloaded checkpoints: no way to Python internals."""
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_named_templates_use_the_default(tmp_path):
    d = hf_checkpoint_dir(tmp_path, "smollm2")
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "D{{ messages|length }}"}]
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    assert ChatTemplate.from_dir(d).render([{"role": "user", "content": "hi"}]) == "D1"


def test_a_run_on_a_preset_model_refuses_chat():
    """`locojax train --task.template chat` builds its tokenizer in `RunParts.of`: a preset
    (random weights, char tokenizer) has no template, and says so before any work."""
    from locojax.envs.registry import TaskConfig
    from locojax.train.build import RunParts
    from locojax.train.config import RunConfig

    data = str(Path(__file__).parent / "data" / "gsm8k_small.jsonl")
    cfg = RunConfig(model="tiny", task=TaskConfig(name="gsm8k", data=data, template="chat"))
    with pytest.raises(ChatTemplateError, match="a preset model has none"):
        RunParts.of(cfg)


def test_curate_refuses_chat_without_a_template(tmp_path, capsys):
    """`locojax curate --template chat` takes its tokenizer the way train and eval do: the
    shipped char checkpoint has no tokenizer_config.json, and the error says so."""
    from locojax.commands import curate

    data = str(Path(__file__).parent / "data" / "gsm8k_small.jsonl")
    assert curate.main([data, "--out", str(tmp_path / "kept.jsonl"), "--model", "embedded",
                        "--template", "chat"]) == 2
    assert "there is no tokenizer_config.json in" in capsys.readouterr().err


def test_generate_sends_the_prompt_through_the_checkpoints_template(tmp_path, capsys):
    """`locojax generate --template chat` renders the prompt with the checkpoint's own
    template (not the hand-written ChatML of `--template qwen`), and a checkpoint without
    one is refused with the file named, before any compile."""
    import shutil

    from locojax.commands import generate
    from locojax.model.loader import EMBEDDED

    model = tmp_path / "m"
    shutil.copytree(EMBEDDED["embedded"], model)
    argv = ["--model", str(model), "--prompt", "12+34", "--template", "chat", "--batch", "1",
            "--max-new-tokens", "2", "--temperature", "0", "--show", "1"]
    assert generate.main(argv) == 2
    assert "there is no tokenizer_config.json in" in capsys.readouterr().err
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}[{{ m['content'] }}]={% endfor %}"}))
    assert generate.main(argv) == 0
    assert "\n[12+34]=" in capsys.readouterr().out
