"""The real-model path: `locojax train gsm8k --model DIR --task.data FILE` with an HF
directory of each family written by transformers (Qwen3, and the cut-down published configs
of test_model_families: Qwen2.5, Llama 3.1, Gemma 3) and a byte-level BPE tokenizer built
here, offline; then its `final_model` export loaded by transformers as it is
(`AutoModelForCausalLM`, `AutoTokenizer`, the source's generation config), with logits equal
to locojax's own on the same file (f32 export, and bf16 for Gemma 3)."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from locojax.model import decoder, loader
from tests.hf_reference import (
    logprob_tol,
    measured_logit_tol,
    random_hf_model,
    random_hf_model_from,
    tiny_cfg,
)
from tests.test_model_families import CASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k", "train.jsonl")
EXPORT_DTYPE = {"qwen3": "f32", "qwen2.5": "f32", "llama-3.1": "f32", "gemma3": "bf16"}


def _short_gsm8k_rows(n):
    """The n shortest real GSM8K rows (short prompts keep the test fast)."""
    if not os.path.exists(GSM8K):
        pytest.skip(f"{GSM8K} not present")
    with open(GSM8K) as f:
        rows = [json.loads(line) for line in f]
    return sorted(rows, key=lambda r: len(r["question"]) + len(r["answer"]))[:n]


def _hf_dir(family, rows, model_dir):
    """A transformers-written model of `family` (random weights, vocab 512, untied for
    Qwen3) with a BPE tokenizer trained on `rows` and the files a hub checkpoint has."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [r["question"] + " " + r["answer"] for r in rows],
        trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                            "<|im_end|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if family == "qwen3":
        model = random_hf_model(tiny_cfg(vocab_size=512, tie_word_embeddings=False))
    else:
        model = random_hf_model_from(CASES[family])
    model.generation_config.eos_token_id = [2]  # <|im_end|>, as instruct models stop
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.7
    model.save_pretrained(str(model_dir))
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>"}))


@pytest.mark.slow
@pytest.mark.parametrize("family", list(EXPORT_DTYPE))
def test_train_gsm8k_from_an_hf_directory_and_export(family, tmp_path):
    rows = _short_gsm8k_rows(16)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = tmp_path / family
    _hf_dir(family, rows, source)

    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "locojax.cli", "train", "gsm8k", "--model", str(source),
         "--task.data", str(data), "--task.template", "qwen", "--steps", "2",
         "--rollout.prompts-per-step", "4", "--algo.group-size", "2",
         "--rollout.max-new-tokens", "8", "--rollout.max-prompt-tokens", "128",
         "--eval.every", "2", "--eval.num-examples", "4", "--eval.batch-size", "4",
         "--checkpoint.export-dtype", EXPORT_DTYPE[family],
         "--run-dir", str(run), "--no-progress", "--no-tensorboard", "--mode", "single"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # Sampler and trainer: two programs computing one f32 forward, ≤ `logprob_tol` apart at
    # this random model's logit scale (max|logit| ≈ 3.4 for hf_reference's weights; 4
    # allowed; prompts ≤ 128 tokens keep the chain within its FWD_DEPTH): 9e-4. A real
    # gap (e.g. one side using the tied embedding instead of lm_head) is O(1).
    assert metrics[1]["rollout/logprob_mismatch"] < logprob_tol("float32", 4.0)
    _check_export(run / "final_model", source, EXPORT_DTYPE[family])


def _check_export(export, source, dtype):
    """transformers loads the export as it is and computes locojax's logits from it; its
    tokenizer and generation config are the source's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = json.loads((export / "config.json").read_text())
    assert config["dtype"] == {"f32": "float32", "bf16": "bfloat16"}[dtype]
    assert (export / "generation_config.json").read_bytes() == (
        source / "generation_config.json").read_bytes()
    assert GenerationConfig.from_pretrained(export).eos_token_id == [2]
    text = "Natalia sold clips to 48 of her friends."
    ids = AutoTokenizer.from_pretrained(export)(text)["input_ids"]
    assert ids == AutoTokenizer.from_pretrained(source)(text)["input_ids"] and len(ids) > 4

    # Both sides compute in f32 from the exported weights (a bf16 file widens exactly).
    hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    model = loader.load(str(export), param_dtype="float32")
    tokens = np.asarray([ids], np.int32)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    hidden, _ = decoder.forward(model.weights, jnp.asarray(tokens), jnp.asarray(positions),
                                model.cfg)
    ours = np.asarray(decoder.logits(model.weights, hidden, model.cfg))
    with torch.no_grad():
        ref = hf(input_ids=torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(ours, ref, rtol=0,
                               atol=measured_logit_tol("float32", model.weights, model.cfg,
                                                       hidden))
