"""Generation throughput of locojax against HF `generate` and Tunix's sampler, in one run.

Every side runs the same Qwen3 architecture with random f32 weights, on the same prompts
(16 prompts x G 8 = 128 rows of 32 tokens at SMALL), sampling at temperature 1, with the
same number of tokens per row:
- `tiny`, `small` (docs/design.md's shapes): exactly N = 32 / 64 tokens per row (locojax
  `ignore_eos`, HF `min_new_tokens = N`, Tunix's EOS outside the vocabulary);
- `small-512`, `small-1024`, `small-4096`: SMALL with N max new tokens, row r ending by EOS
  after L_r tokens, L_r drawn once (seed 0) from a log-normal of median 200 tokens and
  sigma 1 (a GSM8K-like chain of thought with a long tail: 16% of rows past 540 tokens,
  2% past 1,480), capped at N. The same L_r are forced on every side: HF and Tunix through
  their logits (EOS = V - 1 forbidden before a row's last token and the only choice at it,
  so each ends the row by its own EOS rule), locojax through its per-row limits (the same
  stop rule, loop exit and compaction as EOS).
HF expands each prompt G times itself (`num_return_sequences`), as TRL does, with 2 torch
threads; Tunix's sampler (v0.1.7, in bench_peers' venv under ~/.cache/locojax/peers/tunix,
`benchmarks/peers/tunix_sampler.py`) gets every prompt G times; locojax prefills each prompt
once. The sides' runs alternate (locojax, HF, Tunix, locojax, ...) so all see the same load.
Timing is synchronised; the first run of each side (its compiles) is reported apart.

Printed per shape: seconds (median of the runs), tokens/s, locojax's ratio to each side;
for locojax the bytes of KV cache its attention must read (every live row's written prefix
at every decode step; the engine reads up to a block more) per second, against the memory
bandwidth measured in this run (a 512 MiB f32 `jnp.sum`); time per generated token relative
to `small-512`'s. `--sweep blocks` / `rows` / `folds` measure decoder.BLOCK, engine.MIN_ROWS
and attention.FOLD_SLOTS; `--sweep refill --shapes small-512 small-4096 --refill-slots 32`
refilled rows (`engine/refill.py`) against the plain generate, interleaved;
`--trace small-512` sums a steady decode step's time per XLA op (jax.profiler).
`real-8`, `real-32`, `real-128`: the converted SmolLM2-135M-Instruct (`models/`, `make
real-model`) decoding 8, 32 or 128 rows, for `--trace` and `--sweep weights` (f32 against a
bf16 rollout copy of the weights: ms per step, share of the roofline, the sampler-learner
logprob gap); the table's "locojax of roofline" is a generate's FLOPs at the measured matmul
peak or its bytes at the measured bandwidth, whichever bounds it, over its time.

Each shape's table row is printed as the shape ends, then the whole table. `--prompts-4096 8`
halves small-4096's batch (64 rows; its L_r are the first 64 of the same draw, max 1,421
against 1,482), to fit HF and Tunix's runs at 4096 in a shorter session.

Usage:  .venv/bin/python benchmarks/bench_engine.py [--shapes ...] [--runs 3] [--peer-runs 2]
            [--prompts-4096 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

if __name__ == "__main__" and not __package__:  # run as a file: import as `-m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.harness import timed  # noqa: E402
from benchmarks.peers import install  # noqa: E402
from locojax.engine.engine import Engine  # noqa: E402
from locojax.engine.sampling import SamplingConfig  # noqa: E402
from locojax.model import config as model_config  # noqa: E402
from locojax.model import loader, params  # noqa: E402
from locojax.model.hf_io import to_state_dict  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

TORCH_THREADS = 2
MEDIAN_LENGTH, SIGMA = 200, 1.0


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    model: str  # a model_config preset
    prompts: int  # B
    group: int  # G
    prompt_tokens: int  # P
    new_tokens: int  # N
    long_tail: bool  # lengths drawn (else exactly N)

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    def lengths(self) -> np.ndarray:
        """[R] tokens per row, prompt-major."""
        if not self.long_tail:
            return np.full(self.rows, self.new_tokens)
        z = np.random.default_rng(0).normal(size=self.rows)
        return np.clip(np.ceil(MEDIAN_LENGTH * np.exp(SIGMA * z)), 1, self.new_tokens).astype(int)


REAL = os.path.join(os.path.dirname(HERE), "models", "SmolLM2-135M-Instruct")
"""The converted real model (`locojax convert`, docs/real_model.md): the `real-*` shapes'."""

SHAPES = {s.name: s for s in [
    Shape("tiny", "tiny", 8, 4, 16, 32, False),
    Shape("small", "small", 16, 8, 32, 64, False),
    *(Shape(f"small-{n}", "small", 16, 8, 32, n, True) for n in (512, 1024, 4096)),
    # The real model's decode at 8, 32 and 128 rows (G 4, as the real-model run's groups):
    # a 128-token prompt (GSM8K's are ~60-115), exactly 128 new tokens.
    *(Shape(f"real-{r}", REAL, r // 4, 4, 128, 128, False) for r in (8, 32, 128)),
    # ... and its long generation: 32 rows, exactly 512 new tokens (issue 40's real-512).
    Shape("real-512", REAL, 8, 4, 128, 512, False),
]}


def model(s: Shape):
    """(cfg, weights) of a shape: a preset's random f32 weights (key 0), or the checkpoint
    at a path (`loader.load`)."""
    if s.model in model_config.PRESETS:
        cfg = model_config.PRESETS[s.model]()
        return cfg, params.init(cfg, jax.random.key(0))
    if not os.path.isdir(s.model):
        raise SystemExit(f"{s.name}: no converted model at {s.model} (docs/real_model.md "
                         "says how to make it)")
    loaded = loader.load(s.model)
    return loaded.cfg, loaded.weights


def prefill_flops(cfg, prompts: int, prompt_tokens: int, written: int = 0) -> int:
    """Matmul FLOPs of prefilling `prompts` prompts of `prompt_tokens` tokens each after
    `written` cached slots (an extend): every position's layers at its exact causal context,
    the LM head at the last position only."""
    head = 2 * cfg.hidden_size * cfg.vocab_size
    return prompts * (sum(cfg.flops_per_token(written + t + 1) - head
                          for t in range(prompt_tokens)) + head)


def slot_bytes(cfg, itemsize: int = 4) -> int:
    """Bytes of one KV cache slot: its key and value at every layer."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


def generate_flops(cfg, s, lengths=None) -> float:
    """Matmul FLOPs of one generate: prefill B·P tokens, then each row's L_r - 1 decode
    tokens (L_r: `lengths`, default the shape's own, `Shape.lengths`: N for every row of an
    exact-length shape; `peers/locojax_worker.py` reports a GRPO step's generation by it).

    Prefill runs the LM head on the last position only; attention context is counted
    exactly (a token at position t attends to t + 1 keys). A long-tail shape's rows are
    counted to their own ends: counted to N each, small-4096's FLOPs came out 21x the
    work and its roofline above its measured time.
    """
    prefill = prefill_flops(cfg, s.prompts, s.prompt_tokens)
    lengths = np.asarray(s.lengths() if lengths is None else lengths)
    per_step = [float(cfg.flops_per_token(s.prompt_tokens + i + 1))
                for i in range(int(lengths.max()) - 1)]
    upto = np.concatenate([[0.0], np.cumsum(per_step)])  # upto[n]: a row's first n steps
    decode = float(np.sum(upto[np.maximum(lengths - 1, 0)]))
    return float(prefill + decode)


def weight_bytes(weights) -> int:
    """Bytes of every weight: what one decode step (or prefill) reads of them."""
    return sum(x.nbytes for x in jax.tree.leaves(weights))


def generate_bytes(cfg, weights, s: Shape) -> int:
    """Bytes a generate must read: the weights once per program step (prefill and each
    decode step up to the longest row's) and the KV cache its attention reads (`cache_bytes`)."""
    return weight_bytes(weights) * int(s.lengths().max()) + cache_bytes(cfg, s)


def roofline(seconds: float, flops: float, nbytes: float, peak: float, bandwidth: float) -> str:
    """'x% (bytes|FLOPs)': the roofline's share of a measured time, and which side bounds it."""
    side = "bytes" if nbytes / bandwidth >= flops / peak else "FLOPs"
    share = harness.roofline_share(seconds, flops, nbytes, peak, bandwidth)
    return f"{100 * share:.0f}% ({side})"


def cache_bytes(cfg, s: Shape, itemsize: int = 4) -> int:
    """KV bytes attention must read: at decode step t a live row reads its P + t - 1 written
    slots, keys and values, every layer."""
    per_slot = slot_bytes(cfg, itemsize)
    steps = s.lengths() - 1  # decode steps per row (token 0 comes from prefill)
    return int(per_slot * np.sum(steps * s.prompt_tokens + steps * (steps - 1) // 2))


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
        self.proc = subprocess.Popen(
            [str(python), os.path.join(HERE, "peers", "tunix_sampler.py"), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
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


HEAD = ["shape", "tokens", "locojax tok/s", "HF tok/s", "Tunix tok/s", "vs HF", "vs Tunix",
        "cache read GB/s (of bandwidth)", "locojax of roofline", "s/token vs small-512",
        "first run s (locojax / HF / Tunix)"]


def table_row(r: dict, bandwidth: float, per_token_512: float | None,
              peak: float = float("nan")) -> list[str]:
    """One shape's row of the table: rates, locojax's ratios, its cache reads."""
    s, med, tok = r["shape"], r["median"], r["tokens"]
    rate = {k: f"{tok / v:,.0f}" for k, v in med.items()}
    ratio = {k: f"{v / med['locojax']:.2f}x" for k, v in med.items()}
    read = cache_bytes(r["cfg"], s) / med["locojax"]
    rel = f"{med['locojax'] / tok / per_token_512:.2f}x" if per_token_512 and s.long_tail else ""
    return [s.name, str(tok), rate["locojax"], rate.get("HF", "-"), rate.get("Tunix", "-"),
            ratio.get("HF", "-"), ratio.get("Tunix", "-"),
            f"{read / 1e9:.2f} ({100 * read / bandwidth:.0f}% of {bandwidth / 1e9:.1f})",
            roofline(med["locojax"], generate_flops(r["cfg"], s), r["bytes"], peak, bandwidth),
            rel,
            " / ".join(f"{v:.1f}" for v in r["first"].values())]


def bench_shape(s: Shape, runs: int, peer_runs: int, tunix_python, hf: bool = True) -> dict:
    cfg, weights = model(s)
    prompts = np.asarray(jax.random.randint(
        jax.random.key(1), (s.prompts, s.prompt_tokens), 1, cfg.vocab_size - 1), np.int32)
    lengths = s.lengths()
    if s.long_tail:
        drawn = (f"L_r ~ lognormal(median {MEDIAN_LENGTH}, sigma {SIGMA}) capped at "
                 f"{s.new_tokens}: min {lengths.min()}, median {np.median(lengths):.0f}, "
                 f"max {lengths.max()}")
    else:
        drawn = f"exactly {s.new_tokens}"
    print(f"\n[{s.name}] {cfg}\n  {s.prompts} prompts x G {s.group}, {s.prompt_tokens} prompt "
          f"tokens, {drawn} new tokens, {lengths.sum()} in all", flush=True)
    sides = {"locojax": locojax_runner(cfg, weights, prompts, s)}
    # First runs: locojax's compiles; HF's allocator and kernels (2 tokens: nothing compiles).
    first = {"locojax": timed(sides["locojax"])}
    if hf:
        sides["HF"] = hf_runner(cfg, weights, prompts, s)
        first["HF"] = timed(lambda: sides["HF"](True))
    tunix = None
    if tunix_python is not None:
        try:
            tunix = TunixRunner(tunix_python, cfg, s)
            first["Tunix"] = tunix.first
        except RuntimeError as e:
            print(f"  Tunix: {e}")
    arms = {"locojax": lambda: timed(sides["locojax"]), "HF": lambda: timed(sides["HF"]),
            "Tunix": tunix}
    times = harness.interleave(
        {k: arms[k] for k in first}, max(runs, peer_runs),
        limits={"locojax": runs, "HF": peer_runs, "Tunix": peer_runs},
        after_round=lambda _, times: print("  " + ", ".join(
            f"{k} {' '.join(f'{t:.3f}' for t in v)}" for k, v in times.items()), flush=True))
    if tunix is not None:
        tunix.close()
    if s.long_tail:
        profile(sides["locojax"])
    return dict(shape=s, cfg=cfg, tokens=int(lengths.sum()), first=first,
                bytes=generate_bytes(cfg, weights, s),
                median={k: statistics.median(v) for k, v in times.items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--runs", type=int, default=3, help="steady-state runs of locojax")
    ap.add_argument("--peer-runs", "--hf-runs", type=int, default=2,
                    help="steady-state runs of HF and Tunix")
    ap.add_argument("--no-tunix", action="store_true", help="skip Tunix's sampler")
    ap.add_argument("--no-hf", action="store_true",
                    help="skip HF generate (locojax's rates and roofline alone)")
    ap.add_argument("--sweep", choices=("blocks", "rows", "folds", "weights", "refill"),
                    help="measure BLOCK, MIN_ROWS, FOLD_SLOTS, f32 against bf16 rollout "
                         "weights at --shapes (e.g. real-8 real-32 real-128), or refilled "
                         "rows against the plain generate at --shapes")
    ap.add_argument("--refill-slots", type=int, nargs="+", default=[32],
                    help="--sweep refill: the R of each refill arm")
    ap.add_argument("--refill-at", type=int, default=0,
                    help="--sweep refill: free slots per refill stop (0: G)")
    ap.add_argument("--trace", choices=list(SHAPES),
                    help="trace steady decode steps of this shape and sum them per XLA op")
    ap.add_argument("--trace-start", type=int, default=150,
                    help="decode step the traced steps start from (after 2 x 20 untraced)")
    ap.add_argument("--weights-dtype", choices=("bf16",),
                    help="--trace with a bf16 rollout copy of the weights")
    ap.add_argument("--prompts-4096", type=int, default=16,
                    help="B of small-4096 (fewer: a shorter run; its rows' L_r are the first "
                         "B x G of the same draw)")
    args = ap.parse_args(argv)
    SHAPES["small-4096"] = dataclasses.replace(SHAPES["small-4096"], prompts=args.prompts_4096)

    print(harness.command_line())
    print(harness.header("bench_engine", f"jax on {jax.devices()[0].platform} "
                         f"x{jax.device_count()}, torch threads {TORCH_THREADS}"))
    if args.sweep or args.trace:
        from benchmarks import engine_sweeps

        if args.sweep == "folds":
            engine_sweeps.sweep_folds(args.runs)
        elif args.sweep == "refill":
            engine_sweeps.sweep_refill([SHAPES[n] for n in args.shapes], args.runs,
                                       args.refill_slots, args.refill_at)
        elif args.sweep == "weights":
            engine_sweeps.sweep_weights([SHAPES[n] for n in args.shapes], args.runs)
        elif args.sweep:
            engine_sweeps.sweep(args.sweep, args.runs)
        else:
            engine_sweeps.trace_decode(SHAPES[args.trace], args.trace_start,
                                       weights_dtype=args.weights_dtype)
            return 0
        print(f"load average at end {harness.loads()}")
        return 0
    tunix_python = None
    if not args.no_tunix:
        peer = install.PEERS["tunix"]
        if install.is_ready(peer):
            tunix_python = peer.python(install.DEFAULT_CACHE)
        else:
            print(f"Tunix: no venv at {peer.root(install.DEFAULT_CACHE)} "
                  "(`python benchmarks/peers/install.py tunix` makes it)")
    bandwidth, peak = harness.read_bandwidth(), harness.matmul_peak()
    print(f"memory read bandwidth (512 MiB f32 jnp.sum, best of 5): {bandwidth / 1e9:.1f} GB/s; "
          f"matmul peak (2048^3 f32, median of 5): {peak / 1e9:.0f} GFLOP/s")
    results, per_token_512 = [], None
    for name in args.shapes:  # each shape's row as it ends, so a cut-short run still tells
        results.append(bench_shape(SHAPES[name], args.runs, args.peer_runs, tunix_python,
                                   hf=not args.no_hf))
        if name == "small-512":
            per_token_512 = results[-1]["median"]["locojax"] / results[-1]["tokens"]
        print("\n".join(harness.table(HEAD, [table_row(results[-1], bandwidth, per_token_512,
                                                        peak)]))
              + f"\n  load average {harness.loads()}", flush=True)
    # the better of two, around the runs
    bandwidth, peak = max(bandwidth, harness.read_bandwidth()), max(peak, harness.matmul_peak())

    print("\n" + "\n".join(harness.table(HEAD, [table_row(r, bandwidth, per_token_512, peak)
                                                for r in results])))
    print(f"load average at end {harness.loads()}; medians of steady-state runs, sides "
          "alternating")
    return 0


if __name__ == "__main__":
    sys.exit(main())
