"""The real-model path: `locojax train gsm8k --model DIR --task.data FILE` with an HF Qwen3
directory written by transformers and a byte-level BPE tokenizer built here, offline."""

import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.hf_reference import logprob_tol, random_hf_model, tiny_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k", "train.jsonl")


def _short_gsm8k_rows(n):
    """The n shortest real GSM8K rows (short prompts keep the test fast)."""
    if not os.path.exists(GSM8K):
        pytest.skip(f"{GSM8K} not present")
    with open(GSM8K) as f:
        rows = [json.loads(line) for line in f]
    return sorted(rows, key=lambda r: len(r["question"]) + len(r["answer"]))[:n]


@pytest.mark.slow
def test_train_gsm8k_from_an_hf_directory(tmp_path):
    rows = _short_gsm8k_rows(16)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    model_dir = tmp_path / "qwen3"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [r["question"] + " " + r["answer"] for r in rows],
        trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                            "<|im_end|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    cfg = tiny_cfg(vocab_size=512, tie_word_embeddings=False)
    random_hf_model(cfg).save_pretrained(str(model_dir))
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))

    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "locojax.cli", "train", "gsm8k", "--model", str(model_dir),
         "--task.data", str(data), "--task.template", "qwen", "--steps", "2",
         "--rollout.prompts-per-step", "4", "--algo.group-size", "2",
         "--rollout.max-new-tokens", "8", "--rollout.max-prompt-tokens", "128",
         "--eval.every", "2", "--eval.num-examples", "4", "--eval.batch-size", "4",
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
    # The exported model keeps the HF tokenizer and loads in transformers.
    from transformers import Qwen3ForCausalLM

    assert (run / "final_model" / "tokenizer.json").exists()
    Qwen3ForCausalLM.from_pretrained(str(run / "final_model"))
