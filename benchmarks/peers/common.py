"""What every side of `bench_peers.py` shares: the shapes, the prompts, the reward, the protocol.

Imported by the locojax worker and by the peer workers, which run in their own venvs (as
`python -m benchmarks.peers.X` from the repository root, so `benchmarks/__init__.py` and
`peers/__init__.py` stay docstrings), so it needs nothing but the standard library and numpy.

Identical work on every side:
- the same Qwen3 config (docs/design.md TINY / SMALL), random f32 weights;
- the same prompts: step s uses `prompts(shape, s)`, B rows of exactly P token ids in
  [1, V) (0 is every side's pad id, so no real prompt token is mistaken for padding);
- exactly N new tokens: each side's EOS id is V, one past the vocabulary, so it can never
  be sampled (locojax also sets `ignore_eos`);
- the same cheap reward: the fraction of even token ids in the completion, computed from
  the completion's text (ids written as decimal words), as a text reward would be;
- one AdamW update per batch, at the given β.

Protocol: a worker writes JSON lines on its original stdout (everything a library prints is
sent to stderr) and reads commands on stdin:
  worker → {"ready": ..., "versions": {...}, "setup_s": s, "warmup": [step, ...]}
             (setup_s: from the worker's start to `ready`, its warm-up included)
  driver → {"run": n}        worker → {"steps": [{"step": s, "generate": ..., ...}, ...]}
  driver → {"quit": true}    worker exits
A failure is {"error": "..."} and exit 1. Each step record holds the step's wall time and
its phases in seconds: generate, reference, train, other (= step - the named phases).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time

import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    prompts: int  # B
    group: int  # G
    prompt_tokens: int  # P
    new_tokens: int  # N

    @property
    def rows(self) -> int:
        return self.prompts * self.group


SHAPES = {
    "tiny": Shape("tiny", 2, 64, 128, 4, 2, 16, 512, 8, 4, 16, 32),
    "small": Shape("small", 4, 256, 768, 8, 4, 32, 4096, 16, 8, 32, 64),
}
ROPE_THETA = 1_000_000.0
RMS_EPS = 1e-6
LR = 1e-6
PAD_ID = 0


def eos_id(shape: Shape) -> int:
    """One past the vocabulary: no sampler can draw it, so every completion has N tokens."""
    return shape.vocab


def prompts(shape: Shape, step: int) -> np.ndarray:
    """[B, P] int ids for step `step`, in [1, V), the same on every side."""
    rng = np.random.default_rng(1000 + step)
    return rng.integers(1, shape.vocab, (shape.prompts, shape.prompt_tokens))


def to_text(ids) -> str:
    return " ".join(str(int(i)) for i in ids)


def from_text(text: str) -> list[int]:
    return [int(w) for w in text.split()]


def even_fraction(text: str) -> float:
    """The reward: share of even ids among the completion's tokens (0 for an empty one)."""
    ids = from_text(text)
    return sum(1 for i in ids if i % 2 == 0) / len(ids) if ids else 0.0


class IdTokenizer:
    """Token ids as decimal words, EOS left out of a decode; the duck-typed interface Tunix's
    `tunix.generate.tokenizer_adapter` accepts (its workers' tokenizer). bos 0 is falsy, so
    none is prepended."""

    def __init__(self, eos: int):
        self._eos = eos

    def encode(self, text, **_):
        return from_text(text)

    def decode(self, ids, **_):
        return to_text(i for i in ids if i != self._eos)

    def bos_id(self):
        return 0

    def eos_id(self):
        return self._eos

    def pad_id(self):
        return PAD_ID


class PhaseClock:
    """Per-step phase seconds; `phase(name)` accumulates wall time into the current step."""

    def __init__(self):
        self.current: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.current[name] = self.current.get(name, 0.0) + seconds

    def timed(self, name: str, fn, sync=None):
        """Wrap `fn` so each call's wall time (until `sync(result)` returns) goes to `name`."""
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if sync is not None:
                sync(out)
            self.add(name, time.perf_counter() - t0)
            return out
        return wrapper

    def close_step(self, step: int, seconds: float) -> dict:
        rec = {"step": step, "step_s": seconds}
        named = 0.0
        for k in ("generate", "reference", "train"):
            rec[k] = self.current.get(k, 0.0)
            named += rec[k]
        rec["other"] = max(seconds - named, 0.0)
        self.current = {}
        return rec


class Channel:
    """The worker's end of the protocol. Creating it moves library prints off stdout."""

    def __init__(self):
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **msg) -> None:
        self._out.write(json.dumps(msg) + "\n")
        self._out.flush()

    @contextlib.contextmanager
    def reporting(self, stage: str = ""):
        """An error inside goes to the driver as `error` (after `stage`, e.g. "setup: "),
        then on up: the driver reports it and goes on with the other sides."""
        try:
            yield
        except Exception as e:
            self.send(error=f"{stage}{type(e).__name__}: {e}")
            raise

    def receive(self) -> dict:
        line = sys.stdin.readline()
        if not line:
            return {"quit": True}
        return json.loads(line)


def worker_args(argv=None):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=2, help="steps run before `ready` (compile)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--max-steps", type=int, default=0,
                    help="steps a peer's trainer is built for (TRL, Tunix: they own the loop)")
    return ap.parse_args(argv)


class Driven:
    """The one skeleton of every worker: its steps, however its framework runs them, driven
    by the protocol. Each finished step's record goes to `end_step`; when the block the
    driver asked for is full, it is reported (`ready` with the warm-up block first, then
    `steps`) and the driver's next command awaited. The locojax worker calls `end_step` from
    its own loop (`serve`), TRL's from a `TrainerCallback.on_step_end`, Tunix's from its
    data iterator, where each side's step ends.

    `setup_s` is the seconds from `t_setup` to `ready`, its warm-up steps included, on every
    side (the locojax worker's once stopped before its warm-up, the peers' after)."""

    def __init__(self, channel: Channel, versions: dict, t_setup: float, warmup: int,
                 **extra):
        self.channel, self.versions, self.t_setup, self.extra = channel, versions, t_setup, extra
        self.block: list[dict] = []
        self.want, self.ready = warmup, False

    def end_step(self, record: dict) -> bool:
        """Record a step; False once the driver has said quit."""
        self.block.append(record)
        if len(self.block) < self.want:
            return True
        if self.ready:
            self.channel.send(steps=self.block)
        else:
            self.channel.send(ready=True, versions=self.versions,
                              setup_s=time.perf_counter() - self.t_setup, warmup=self.block,
                              **self.extra)
            self.ready = True
        self.block = []
        cmd = self.channel.receive()
        if cmd.get("quit"):
            return False
        self.want = int(cmd["run"])
        return True


def serve(driven: Driven, one_step) -> None:
    """The loop of a side whose steps the worker calls itself: `one_step() -> record`."""
    while driven.end_step(one_step()):
        pass
