"""`loader.save`: an export is whole or absent, records its vocabulary, and is checked when
loaded; `check_weights` refuses unusable weight files from their headers alone."""

import json

import jax
import numpy as np
import pytest

from locojax.model import hf_io, loader, params
from locojax.model.config import PRESETS
from locojax.tokenizer import CharTokenizer, fingerprint
from test_tokenizer import build_hf_tokenizer


def _weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda d: rng.normal(0, 0.1, d.shape).astype(np.float32),
                        params.declare(cfg), is_leaf=params.is_decl)


@pytest.fixture
def cfg():
    return PRESETS["tiny"]()


def _swap_two_tokens(tokenizer_json):
    """Another vocabulary of the same size: the ids of "a" and "b" exchanged."""
    data = json.loads(tokenizer_json.read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    tokenizer_json.write_text(json.dumps(data))


def test_save_records_the_vocabulary_and_loading_checks_it(cfg, tmp_path):
    """Guards the wiring of `tokenizer.fingerprint` into `save` and `tokenizer_for`: a
    model's tokenizer files swapped for another vocabulary of the same size are refused."""
    source = tmp_path / "source"
    source.mkdir()
    build_hf_tokenizer().save(str(source / "tokenizer.json"))
    out = loader.save(tmp_path / "model", cfg, _weights(cfg), str(source))
    recorded = loader.read_meta(out)["tokenizer_fingerprint"]
    assert recorded == fingerprint(loader.tokenizer_for(source))
    assert loader.tokenizer_for(out).vocab_size > 0  # its own files pass
    _swap_two_tokens(out / "tokenizer.json")
    with pytest.raises(ValueError, match="not the vocabulary the model was trained with") as e:
        loader.tokenizer_for(out)
    assert str(out / "tokenizer.json") in str(e.value)
    # Char-level: locojax.json names the built-in tokenizer, and its fingerprint.
    char = loader.save(tmp_path / "char", cfg, _weights(cfg), "tiny")
    meta = loader.read_meta(char)
    assert meta["tokenizer"] == "char" and meta["tokenizer_fingerprint"] == fingerprint(
        CharTokenizer())
    (char / loader.META_FILE).write_text(json.dumps(dict(meta, tokenizer_fingerprint="0" * 64)))
    with pytest.raises(ValueError, match="built-in char tokenizer"):
        loader.tokenizer_for(char)


def test_an_export_killed_half_way_leaves_the_previous_one(cfg, tmp_path, monkeypatch):
    """The export dies after writing its weights (as a killed process would): the directory
    still holds the previous export, whole; the next export replaces it and clears the
    leftovers. Guards the temporary directory + rename (written in place, the old weights
    would already be gone)."""
    out = tmp_path / "final_model"
    loader.save(out, cfg, _weights(cfg, 0), "tiny", {"steps": 1})
    first = (out / hf_io.SINGLE_FILE).read_bytes()
    real = hf_io.save_weights

    def dies_after_weights(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(hf_io, "save_weights", dies_after_weights)
    with pytest.raises(KeyboardInterrupt):
        loader.save(out, cfg, _weights(cfg, 1), "tiny", {"steps": 2})
    assert (out / hf_io.SINGLE_FILE).read_bytes() == first
    assert loader.read_meta(out)["steps"] == 1 and loader.is_complete(out)
    assert list(tmp_path.glob(".final_model.partial-*"))  # the half-written one, aside
    monkeypatch.setattr(hf_io, "save_weights", real)
    loader.save(out, cfg, _weights(cfg, 1), "tiny", {"steps": 2})
    assert loader.read_meta(out)["steps"] == 2
    assert (out / hf_io.SINGLE_FILE).read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]


def test_save_refuses_to_replace_a_directory_holding_other_files(cfg, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"holds files that are not a checkpoint's \(notes.txt\)"):
        loader.save(out, cfg, _weights(cfg), "tiny")
    assert (out / "notes.txt").read_text() == "keep me"


def test_is_complete_needs_every_part(cfg, tmp_path):
    out = loader.save(tmp_path / "m", cfg, _weights(cfg), "tiny")
    assert loader.is_complete(out)
    (out / loader.META_FILE).unlink()  # an in-place export killed before its last file
    assert not loader.is_complete(out) and not loader.is_complete(tmp_path / "absent")


def test_check_weights_reads_headers_only_and_names_the_problem(cfg, tmp_path):
    out = loader.save(tmp_path / "m", cfg, _weights(cfg), "tiny")
    loader.check_weights(str(out), cfg)
    loader.check_weights("tiny", cfg)  # a preset has no files to check
    with pytest.raises(ValueError, match="has shape"):
        loader.check_weights(str(out), PRESETS["small"]())
    (out / hf_io.SINGLE_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        loader.check_weights(str(out), cfg)
    (out / hf_io.SINGLE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        loader.check_weights(str(out), cfg)
