"""The parts of a decode token step that decode_parts.py times, each a program of the
engine's own code at the engine's own shapes, with the least bytes one token step of it
must read (`Part`).

Every part calls the library's functions: `Engine.generate` and `decode.decode_jit` (the
engine's decode program), `decoder.forward` with a cache and `decoder.logits`,
`sampling.sample_with_logprobs`. Nothing of the model is written again here. A part's
`run()` makes its calls and blocks until their results are ready; what one run covers
(`per`) turns its seconds into seconds a token step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.tpu.token_step import step_bytes
from locojax.engine.decode import decode_jit
from locojax.engine.engine import Engine, generate_slots
from locojax.engine.generation import without_cache
from locojax.engine.sampling import SamplingConfig, sample_with_logprobs
from locojax.model import decoder


@dataclasses.dataclass
class Part:
    name: str
    run: Callable[[], None]  # one timed call, blocked until ready
    per: int  # token steps one run covers: ms a step = run's ms / per
    bytes: int  # the least bytes one token step of the part reads
    note: str


@dataclasses.dataclass
class Shape:
    """One measurement's geometry: R rows of P-token prompts, a token step timed as a
    generate of N2 tokens minus one of N1; `mid`, the cache's written slots halfway
    between (what the cached forwards read, and what the step's bytes count)."""

    rows: int
    prompt: int
    n1: int
    n2: int
    reps: int  # calls a run of a one-call part makes, dispatched back to back

    @property
    def mid(self) -> int:
        return self.prompt + (self.n1 + self.n2) // 2


def kv_bytes(cfg, layers: int, rows: int, slots: int, itemsize: int) -> int:
    """The K and V of `slots` written slots of `rows` rows in `layers` layers."""
    return 2 * layers * rows * cfg.num_key_value_heads * cfg.head_dim * slots * itemsize


def tree_bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def head_bytes(cfg, weights) -> int:
    """The logits matmul's matrix: the embedding when tied, else lm_head."""
    return tree_bytes(weights["embed" if cfg.tie_word_embeddings else "lm_head"])


def engine_parts(engine: Engine, weights, shape: Shape, sampling: SamplingConfig,
                 itemsize: int) -> list[Part]:
    """(a) the two generates whose difference is the token step, and the engine's decode
    program stopped after one iteration, dispatched `reps` times back to back.

    Every generate gets every row's limit (N1 or N2) under max_new_tokens N2: one prefill
    and one decode program serve both lengths (a run on the chip pays 10-25 s a program),
    and all rows stop together at their limit, so no compaction runs."""
    cfg, r = engine.model_cfg, shape.rows
    prompts = np.random.default_rng(0).integers(1, cfg.vocab_size, (r, shape.prompt))
    prompts, mask, key = prompts.astype(np.int32), np.ones((r, shape.prompt), bool), \
        jax.random.key(0)
    limits = {n: np.full(r, n, np.int32) for n in (shape.n1, shape.n2)}

    def generate(n):
        out = engine.generate(weights, prompts, key, sampling, prompt_mask=mask,
                              limits=limits[n])
        np.asarray(jax.block_until_ready(out).tokens)

    step = step_bytes(cfg, weights, r, shape.mid, itemsize)
    parts = [Part(f"generate_{n}", lambda n=n: generate(n), 1, step,
                  f"a whole generate of {n} tokens (timed for the step)")
             for n in (shape.n1, shape.n2)]
    return parts + [iteration_part(engine, weights, shape, sampling, prompts, mask, step)]


def iteration_part(engine, weights, shape: Shape, sampling, prompts, mask, step) -> Part:
    """The engine's decode program (the one a generate runs) with `stop_at` one past the
    turn's step: one loop iteration a call, from step N1 on, as `engine.Decoding` runs K.
    The turn at N1 is kept; each run resets the cache's index to it."""
    cfg, r = engine.model_cfg, shape.rows
    static = dict(model_cfg=cfg, sampling=sampling, layout=engine.layout)
    pending = engine.prefill(weights, prompts, jax.random.key(0), sampling, prompt_mask=mask,
                             limits=np.full(r, shape.n2, np.int32))
    cache, turn = without_cache(pending.prefilled)
    until = jnp.int32(0)  # the loop's compaction bound: a value, the same program
    cache, at_n1 = without_cache(decode_jit(weights, cache, turn, until, jnp.int32(shape.n1),
                                            **static))
    index, reps = int(cache.index), min(shape.reps, shape.n2 - shape.n1)
    engine.return_cache(cache)
    slots = generate_slots(shape.prompt, sampling)

    def run():
        cache = engine.take_cache(r, slots)  # its index placed as the engine's (committed):
        cache = dataclasses.replace(  # an uncommitted one would compile the program again
            cache, index=jax.device_put(jnp.int32(index), cache.index.sharding))
        turn = at_n1
        for i in range(reps):
            cache, turn = without_cache(decode_jit(
                weights, cache, turn, until, jnp.int32(shape.n1 + i + 1), **static))
        jax.block_until_ready((cache, turn))
        engine.return_cache(cache)
    return Part("iteration", run, reps, step,
                "the engine's decode program, one loop iteration a call")


def forward_program(cfg):
    """One cached forward of one token (`decoder.forward`: embed, the layer scan, the final
    norm, the cache written in place) at the cache's `index`, the cache donated as the
    engine's decode loop carries it (undonated, its write would copy the whole cache)."""
    def forward(weights, cache, last, pos, index):
        cache = dataclasses.replace(cache, index=index)
        return decoder.forward(weights, last[:, None], pos[:, None], cfg, cache=cache)
    return jax.jit(forward, donate_argnums=1)


def first_layers(cfg, weights, cache, layers: int):
    """(config, weights, cache) of the model's first `layers` layers: the stacked layer
    weights and the cache sliced, copied (the copy is donated, never the engine's) and
    placed where the engine's are: the forward's first call then compiles its only program."""
    place = lambda x: jax.device_put(jnp.copy(x), cache.k.sharding)  # noqa: E731
    keep = lambda x: place(x[:layers])  # noqa: E731
    kinds = None if cfg.layer_types is None else cfg.layer_types[:layers]
    cut = dataclasses.replace(cfg, num_hidden_layers=layers, layer_types=kinds)
    w = weights if layers == cfg.num_hidden_layers else {
        **weights, "layers": jax.tree.map(keep, weights["layers"])}
    c = dataclasses.replace(cache, k=keep(cache.k), v=keep(cache.v), valid=place(cache.valid),
                            index=place(cache.index))
    return cut, w, c


def forward_parts(engine, weights, shape: Shape, sampling, layers, itemsize) -> list[Part]:
    """(b, c) the cached forward at `mid` written slots, at each layer count in `layers`
    (the model's own among them); and at the whole model with one written block, where
    attention reads almost nothing. The cache: the engine's after a generate, sliced."""
    cfg, r = engine.model_cfg, shape.rows
    slots = generate_slots(shape.prompt, sampling)
    full = engine.take_cache(r, slots)
    rng = np.random.default_rng(1)
    last = jnp.asarray(rng.integers(1, cfg.vocab_size, r).astype(np.int32))
    per_layer = tree_bytes(weights["layers"]) // cfg.num_hidden_layers
    outside = tree_bytes(weights["final_norm"]) + r * cfg.hidden_size * itemsize
    parts = []
    for n in layers:
        cut, w, cache = first_layers(cfg, weights, full, n)
        forward, held = forward_program(cut), {"cache": cache}
        points = [(f"forward_{n}", shape.mid)]
        if n == cfg.num_hidden_layers:
            points.append((f"forward_{n}_block1", 1))
        for name, written in points:
            pos, index = jnp.full((r,), written, jnp.int32), jnp.int32(written)

            def run(w=w, forward=forward, held=held, pos=pos, index=index):
                out = None
                for _ in range(shape.reps):
                    out, held["cache"] = forward(w, held["cache"], last, pos, index)
                jax.block_until_ready((out, held["cache"]))
            parts.append(Part(name, run, shape.reps,
                              n * per_layer + outside + kv_bytes(cfg, n, r, written, itemsize),
                              f"cached forward, {n} of {cfg.num_hidden_layers} layers, "
                              f"{written} written slot{'s' if written > 1 else ''}"))
    engine.return_cache(full)
    return parts


def head_parts(cfg, weights, shape: Shape, sampling: SamplingConfig) -> list[Part]:
    """(d) the logits matmul alone, and with the sampler (`sample_with_logprobs` with the
    generate's SamplingConfig, temperature 1.0, and greedy) on [rows, vocab]. Bytes: the
    head matrix and the f32 logits once."""
    rng = np.random.default_rng(2)
    hidden = jnp.asarray(rng.standard_normal((shape.rows, 1, cfg.hidden_size)), cfg.dtype)
    draws = jnp.asarray(rng.random(shape.rows), jnp.float32)
    greedy = dataclasses.replace(sampling, temperature=0.0)
    programs = {
        "logits": jax.jit(lambda w, h, u: decoder.logits(w, h, cfg)),
        "sample_t1": jax.jit(lambda w, h, u: sample_with_logprobs(
            decoder.logits(w, h, cfg)[:, 0], None, sampling, u)),
        "sample_greedy": jax.jit(lambda w, h, u: sample_with_logprobs(
            decoder.logits(w, h, cfg)[:, 0], None, greedy, None)),
    }
    notes = {"logits": "the logits matmul alone, [rows, vocab] f32 out",
             "sample_t1": "logits + sample_with_logprobs, temperature 1.0",
             "sample_greedy": "logits + sample_with_logprobs, greedy"}
    nbytes = head_bytes(cfg, weights) + shape.rows * cfg.vocab_size * 4

    def runner(program):
        def run():
            jax.block_until_ready([program(weights, hidden, draws) for _ in range(shape.reps)])
        return run
    return [Part(name, runner(p), shape.reps, nbytes, notes[name])
            for name, p in programs.items()]


def stream_part(megabytes: int, reps: int) -> Part:
    """The chip's read bandwidth as a program sees it: a bf16 buffer summed in f32, read
    once a call (what the shares "at measured" divide by)."""
    x = jnp.ones((max(1, megabytes * 2**20 // 8192), 4096), jnp.bfloat16)
    total = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))

    def run():
        jax.block_until_ready([total(x) for _ in range(reps)])
    return Part("stream", run, reps, x.size * x.dtype.itemsize,
                f"a {x.size * 2 / 2**20:.0f} MiB bf16 buffer summed (read once)")
