"""The sides of the engine benchmarks, each a callable doing one synchronised generate.

locojax's `Engine`, HF `generate` on the same weights (torch, `TORCH_THREADS`) and Tunix's
sampler in its own venv and process (`peers/tunix_sampler.py`), each forcing the shape's
per-row lengths its own way (bench_engine.py's docstring); and `program_spans` / `profile`,
where one locojax generate's time goes, program by program.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import jax
import numpy as np

from benchmarks.engine_work import Shape
from benchmarks.harness import ROOT, timed
from locojax.engine.engine import Engine
from locojax.engine.sampling import SamplingConfig
from locojax.model import config as model_config
from locojax.model.hf_io import to_state_dict

TORCH_THREADS = 2


def locojax_runner(cfg, weights, prompts: np.ndarray, s: Shape, **engine_kw):
    """A callable doing one synchronised generate (the first call compiles)."""
    engine = Engine(cfg, **engine_kw)
    lengths = s.lengths()
    sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0,
                              ignore_eos=not s.long_tail)
    calls = iter(range(10 ** 6))

    def once():
        out = engine.generate(weights, prompts, jax.random.key(next(calls)), sampling,
                              num_samples=s.group, limits=lengths if s.long_tail else None)
        jax.block_until_ready(out)
        np.testing.assert_array_equal(np.asarray(out.lengths), lengths)

    once.engine = engine  # a sweep of many arms frees each one's cache between its runs
    return once


def hf_model(cfg, weights, s: Shape):
    """The HF model of a shape, f32, in eval mode: the converted checkpoint as transformers
    loads it (`real-*`: a Llama), or a `Qwen3ForCausalLM` holding a preset's weights."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if s.model not in model_config.PRESETS:
        return AutoModelForCausalLM.from_pretrained(s.model, dtype=torch.float32).eval()
    hf_cfg = Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=s.prompt_tokens + s.new_tokens)
    model = Qwen3ForCausalLM(hf_cfg).float().eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in to_state_dict(weights, cfg).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    return model


def hf_runner(cfg, weights, prompts: np.ndarray, s: Shape):
    """A callable doing one HF `generate` on the same weights and prompts."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    torch.set_num_threads(TORCH_THREADS)
    model = hf_model(cfg, weights, s)
    input_ids = torch.from_numpy(prompts.astype(np.int64))
    eos = cfg.vocab_size - 1
    last = torch.as_tensor(s.lengths() - 1)  # [R]: the step whose token is EOS

    class ForceLengths(LogitsProcessor):
        def __call__(self, ids, scores):
            at = last == ids.shape[1] - s.prompt_tokens
            scores[:, eos] = -float("inf")
            scores[at] = -float("inf")
            scores[at, eos] = 0.0
            return scores

    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=s.new_tokens,
              num_return_sequences=s.group, pad_token_id=0,
              attention_mask=torch.ones_like(input_ids))
    if s.long_tail:
        kw.update(eos_token_id=eos, logits_processor=LogitsProcessorList([ForceLengths()]))
    else:
        kw.update(eos_token_id=None, min_new_tokens=s.new_tokens)

    def once(warm_up=False):
        with torch.no_grad():
            out = model.generate(input_ids, **{**kw, **(dict(
                max_new_tokens=2, min_new_tokens=None, logits_processor=None)
                if warm_up else {})})
        ends = (out[:, s.prompt_tokens:] == eos).int().argmax(1) + 1
        assert warm_up or not s.long_tail or (ends.numpy() == s.lengths()).all()

    return once


class TunixRunner:
    """Tunix's sampler in its own venv and process (`peers/tunix_sampler.py`)."""

    def __init__(self, python, cfg, s: Shape):
        spec = dict(vocab=cfg.vocab_size, prompt_tokens=s.prompt_tokens, new_tokens=s.new_tokens,
                    group=s.group, prompts=s.prompts, layers=cfg.num_hidden_layers,
                    hidden=cfg.hidden_size, ffn=cfg.intermediate_size,
                    heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                    head_dim=cfg.head_dim,
                    lengths=s.lengths().tolist() if s.long_tail else [])
        # Tunix's outputs stop before the EOS that ended a row (`Sampler.__call__`).
        self.tokens = int((s.lengths() - 1).sum()) if s.long_tail else s.rows * s.new_tokens
        # A module of this package from the repository root: it imports `peers.common` there.
        self.proc = subprocess.Popen(
            [str(python), "-m", "benchmarks.peers.tunix_sampler", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            cwd=str(ROOT), env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
        self.first = self._reply()["first_s"]

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tunix sampler exited with {self.proc.wait()}")
        return json.loads(line)

    def __call__(self) -> float:
        self.proc.stdin.write('{"run": 1}\n')
        self.proc.stdin.flush()
        reply = self._reply()
        if reply["tokens"] != self.tokens:  # the forced lengths did not hold
            raise RuntimeError(f"Tunix sampled {reply['tokens']} tokens, not {self.tokens}")
        return reply["seconds"]

    def close(self):
        self.proc.stdin.write('{"quit": true}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def program_spans(once):
    """(total s, [(program, s, rows after, first step, step after)]) of one locojax generate:
    each of its programs (prefill, every decode phase at its batch size, every compaction)
    timed on its own, synchronised."""
    from locojax.engine import engine as engine_lib

    spans, real = [], {n: getattr(engine_lib, n) for n in ("prefill_jit", "decode_jit",
                                                             "compact_jit")}

    def timed_program(name):
        def run(*args, **kw):
            t0 = time.perf_counter()
            out = jax.block_until_ready(real[name](*args, **kw))
            seconds = time.perf_counter() - t0
            turn = out if name == "prefill_jit" else out[1] if name == "compact_jit" else out
            before = args[2] if name == "decode_jit" else None  # the turn it went on from
            spans.append((name, seconds, turn.last.shape[0],
                          None if before is None else int(before.step), int(turn.step)))
            return out
        return run

    for name in real:
        setattr(engine_lib, name, timed_program(name))
    try:
        total = timed(once)
    finally:
        for name, fn in real.items():
            setattr(engine_lib, name, fn)
    return total, spans


def profile(once):
    """Where one locojax generate's time goes: its programs (`program_spans`); the rest
    (host syncs, dispatch, assembling the result) is the total less their sum."""
    total, spans = program_spans(once)
    print(f"  profile of one locojax generate ({total:.3f} s, programs synchronised):")
    for name, sec, rows, a, b in spans:
        what = (f"decode {rows:4d} rows: tokens {a}..{b - 1} ({b - a} steps), "
                f"{1000 * sec / max(b - a, 1):.2f} ms/step" if name == "decode_jit" else
                f"{name[:-4]} -> {rows} rows")
        print(f"    {what}: {sec:.3f} s")
    print(f"    rest (host syncs, dispatch, result): {total - sum(x[1] for x in spans):.3f} s")
