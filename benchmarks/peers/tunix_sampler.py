"""Tunix's sampler as a side of `bench_engine.py`, run in Tunix's venv (`install.py`).

Set up as `tunix_worker.py` sets up its GRPO rollout: an nnx `Qwen3` from
`tunix.models.qwen3.model.ModelConfig` (random f32 weights, tied embeddings) and
`tunix.generate.sampler.Sampler` with a KV cache of P + N slots, sampling at temperature 1
(top_p 1: Tunix's `jax.random.categorical` over the whole vocabulary). Prompts are token ids
written as decimal words (`common.IdTokenizer`'s scheme), each repeated G times: Tunix's
sampler has no per-prompt sample count, so every row is prefilled (as its GRPO learner does).

Per-row lengths are forced through the logits, as on the HF side: a thin module around the
model makes EOS (V - 1) impossible before a row's last token and the only choice at it, by
the position of the query (prompt tokens are positions 0..P-1, completion token i is P + i).
Tunix's loop then ends each row by its own EOS rule and stops once every row has.

Protocol (JSON lines on stdout; stdin commands): the shape as JSON in argv; the worker
compiles with one generate (with forced lengths, one in which every row ends at its first
token: the same programs, without a long run) and sends {"ready": true, "first_s": s};
then each {"run": 1} is answered {"seconds": s, "tokens": n}; {"quit": true} ends it.
"""

from __future__ import annotations

import json
import os
import sys
import time

from benchmarks.peers import common


def forced_model(shape: dict, lengths, eos: int):
    """Tunix's nnx `Qwen3` of the shape, random f32 weights; with `lengths`, wrapped so that
    each row's EOS comes exactly at its length (the docstring)."""
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.qwen3 import model as qwen3_lib

    v, p = shape["vocab"], shape["prompt_tokens"]
    config = qwen3_lib.ModelConfig(
        num_layers=shape["layers"], vocab_size=v, embed_dim=shape["hidden"],
        hidden_dim=shape["ffn"], num_heads=shape["heads"], head_dim=shape["head_dim"],
        num_kv_heads=shape["kv_heads"], rope_theta=1_000_000, norm_eps=1e-6,
        use_tied_embedding=True)
    model = qwen3_lib.Qwen3(config, rngs=nnx.Rngs(0))

    class ForcedLengths(nnx.Module):
        """The model, with EOS forbidden before each row's last token and forced at it."""

        def __init__(self, model, last_query):
            self.model, self.config = model, model.config  # the sampler reads config.dtype
            self.last_query = nnx.Variable(jnp.asarray(last_query, jnp.int32))  # [R]

        def __call__(self, tokens, positions, cache, attention_mask, **kw):
            logits, cache = self.model(tokens, positions, cache, attention_mask, **kw)
            end = (positions[:, -1] == self.last_query.value)[:, None]  # [R, 1]
            only_eos = jnp.where(jnp.arange(v) == eos, 0.0, -jnp.inf)  # [V]
            last = jnp.where(end, only_eos, logits[:, -1].at[:, eos].set(-jnp.inf))
            return logits.at[:, -1].set(last.astype(logits.dtype)), cache

    if len(lengths):
        model = ForcedLengths(model, p + lengths - 2)  # the query that predicts token L - 1
    return model


def main() -> int:
    shape = json.loads(sys.argv[1])
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from tunix.generate import sampler as sampler_lib

    v, p, n, g = shape["vocab"], shape["prompt_tokens"], shape["new_tokens"], shape["group"]
    lengths = np.asarray(shape["lengths"], np.int32)  # [R], prompt-major; empty: exactly N
    eos = v - 1 if len(lengths) else v  # V: outside the vocabulary, never sampled
    model = forced_model(shape, lengths, eos)
    cache = sampler_lib.CacheConfig(cache_size=p + n, num_layers=shape["layers"],
                                    num_kv_heads=shape["kv_heads"], head_dim=shape["head_dim"])
    sampler = sampler_lib.Sampler(model, common.IdTokenizer(eos), cache)
    rng = np.random.default_rng(1)
    prompts = [" ".join(map(str, rng.integers(1, v - 1, p))) for _ in range(shape["prompts"])]
    rows = [x for x in prompts for _ in range(g)]
    seeds = iter(range(10 ** 6))

    def once() -> int:
        res = sampler(rows, max_generation_steps=n, max_prompt_length=p, temperature=1.0,
                      top_p=1.0, eos_tokens=[eos], seed=next(seeds))
        jax.block_until_ready(res.tokens)
        return sum(len(t) for t in res.tokens)

    def send(**msg):
        out.write(json.dumps(msg) + "\n")
        out.flush()

    t0 = time.perf_counter()
    if len(lengths):
        forced = model.last_query.value
        model.last_query.value = jnp.full_like(forced, p - 1)
        sampler.transformer_state = nnx.variables(model)
        tokens = once()
        model.last_query.value = forced
        sampler.transformer_state = nnx.variables(model)
    else:
        tokens = once()
    send(ready=True, first_s=time.perf_counter() - t0, tokens=tokens)
    for line in sys.stdin:
        if json.loads(line).get("quit"):
            break
        t0 = time.perf_counter()
        tokens = once()
        send(seconds=time.perf_counter() - t0, tokens=tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
