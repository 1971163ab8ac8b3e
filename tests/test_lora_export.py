"""LoRA export round trips through transformers + peft (`locojax/model/lora_io.py`).

- the adapters in PEFT's format, loaded by `peft.PeftModel` onto the transformers base,
  give locojax's unmerged LoRA logits;
- the merged model saved as an HF checkpoint, loaded by transformers, gives PEFT's own
  merged model's logits (`merge_and_unload`);
- `loader.load` of the adapter directory (what `locojax eval --model DIR` reads) is the
  merged checkpoint, bitwise;
- an adapter directory locojax cannot apply is refused by name.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from locojax.model import decoder, loader, lora, lora_io
from locojax.model.config import LoraConfig
from tests.hf_reference import measured_logit_tol, paired, tiny_cfg

peft = pytest.importorskip("peft")


def _adapters(cfg, seed=1):
    """Adapters with B ≠ 0 (fresh ones are the base exactly, which would test nothing)."""
    ad = lora.init(cfg, jax.random.key(seed))
    leaves, treedef = jax.tree.flatten(ad)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape, x.dtype)
                                        for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_export")
    base_cfg = tiny_cfg(tie_word_embeddings=False)
    model, base = paired(base_cfg)
    model.save_pretrained(root / "base")
    (root / "base" / loader.META_FILE).write_text('{"tokenizer": "char"}')  # for `load`
    cfg = dataclasses.replace(base_cfg, lora=LoraConfig(rank=4, alpha=8.0,
                                                             targets=("q", "v", "o", "down")))
    adapters = _adapters(cfg)
    lora_io.save(root / "adapter", cfg, jax.tree.map(np.asarray, adapters), str(root / "base"))
    merged = lora.merge(base, adapters, cfg)
    loader.save(root / "merged", base_cfg, jax.tree.map(np.asarray, merged), "tiny")
    return root, cfg, base, adapters


def _tokens(cfg):
    return np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))


def _hf_logits(model, toks):
    with torch.no_grad():
        return model(torch.as_tensor(toks)).logits.double().numpy()


def test_peft_loads_the_adapters_onto_the_base(exported):
    root, cfg, base, adapters = exported
    toks = _tokens(cfg)
    pos = np.broadcast_to(np.arange(toks.shape[1]), toks.shape)
    weights = lora.view(base, adapters, cfg)
    hidden, _ = decoder.forward(weights, toks, pos, cfg)
    ours = np.asarray(decoder.logits(weights, hidden, cfg))
    hf_base = AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32).eval()
    plain = _hf_logits(hf_base, toks)
    with_adapters = peft.PeftModel.from_pretrained(hf_base, root / "adapter").eval()
    theirs = _hf_logits(with_adapters, toks)
    # Two f32 implementations of one forward: rounding along its chain (hf_reference's
    # FWD_DEPTH, which the rank-4 adapter paths, beside the projections they adapt, do not
    # lengthen) times the logits' terms measured on these weights.
    tol = measured_logit_tol(np.float32, base, cfg, hidden)
    assert np.max(np.abs(theirs - ours)) <= tol
    # ...and the adapters were applied (a name PEFT did not match would leave B at 0).
    assert np.max(np.abs(theirs - plain)) > 100 * tol


def test_merged_export_is_peft_merged(exported):
    root, cfg, base, adapters = exported
    toks = _tokens(cfg)
    merged = AutoModelForCausalLM.from_pretrained(root / "merged", dtype=torch.float32).eval()
    hf_base = AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32).eval()
    peft_merged = peft.PeftModel.from_pretrained(hf_base, root / "adapter").merge_and_unload()
    got, want = _hf_logits(merged, toks), _hf_logits(peft_merged.eval(), toks)
    weights = lora.merge(base, adapters, cfg)
    hidden, _ = decoder.forward(weights, toks, np.broadcast_to(np.arange(9), toks.shape), cfg)
    # The same forward on weights merged twice, each W + s·A·B rounded once in f32 (a
    # relative u per weight, inside the chain's own rounding): the logit bound again.
    assert np.max(np.abs(got - want)) <= measured_logit_tol(np.float32, weights, cfg, hidden)


def test_loader_reads_an_adapter_dir_as_the_merged_model(exported):
    root, cfg, _, _ = exported
    from_adapter = loader.load(str(root / "adapter"), param_dtype="float32")
    from_merged = loader.load(str(root / "merged"), param_dtype="float32")
    assert from_adapter.cfg.lora is None and from_adapter.cfg == from_merged.cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 from_adapter.weights, from_merged.weights)
    config, lcfg = lora_io.read_config(root / "adapter")
    assert lcfg == cfg.lora and config == str(root / "base")


@pytest.mark.parametrize("key, value", [("use_dora", True), ("use_rslora", True),
                                        ("target_modules", ["q_proj", "lm_head"]),
                                        ("bias", "all")])
def test_unsupported_adapter_configs_are_refused(exported, tmp_path, key, value):
    root, *_ = exported
    d = tmp_path / "bad"
    d.mkdir()
    config = json.loads((root / "adapter" / lora_io.CONFIG_FILE).read_text())
    (d / lora_io.CONFIG_FILE).write_text(json.dumps({**config, key: value}))
    with pytest.raises(ValueError, match=key):
        lora_io.read_config(d)
