"""Multi-turn generation: continuing rows in the KV cache (`extend`) vs re-prefilling the
history every turn, and finished rows compacted out vs masked.

The workload is synthetic and exact, so the three programs do the same token work:
B prompts x G samples (R rows), T turns of exactly N model tokens each (no early stop),
an observation of O tokens after every turn but the last, and (by default) half of the
live rows finishing after each turn (R, R/2, R/4, ... rows per turn; `--finish 0`: none).

    extend     `Conversation` (locojax/engine/extend.py): begin, then decode / extend; the
               finished rows are compacted out (the default of `locojax train`)
    mask       the same, finished rows kept in the batch and masked (`compact=False`)
    reprefill  what a text-level driver costs: every turn, `Engine.generate` on each live
               row's whole history (prompt, turns, observations; left-padded to the longest
               history of the run, one compiled shape) for N new tokens; live rows padded to
               the same bucket sizes as `extend`'s compaction

Timing: wall time of each turn's device work, synchronised (the host gets each turn's
tokens, as a rollout must); a turn of `extend` is its extend + decode, of `reprefill` its
prefill + decode. Every program runs once to compile (reported apart), then `--repeats`
times interleaved (extend, mask, reprefill, extend, ...), and the tables give medians and
the ratios reprefill / extend and mask / extend (> 1: extend is faster), then each program's
share of the roofline of the trajectory's useful work (`trajectory_work`: its FLOPs at the
matmul peak or its bytes at the read bandwidth, both measured in the run).

    .venv/bin/python -m benchmarks.bench_extend                  # TINY and SMALL
    .venv/bin/python -m benchmarks.bench_extend --shapes tiny --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time


import jax
import numpy as np

from benchmarks import engine_work, harness
from locojax.engine.engine import Engine, pad_prompts
from locojax.engine.extend import Conversation, bucket, slots_needed
from locojax.engine.sampling import SamplingConfig
from locojax.model import config, params


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    arch: str
    prompts: int  # B
    group: int  # G
    prompt_tokens: int  # P
    new_tokens: int  # N per turn
    turns: int  # T
    obs_tokens: int  # O


SHAPES = {  # docs/design.md's TINY and SMALL rollout shapes, run for T turns
    "tiny": Shape("TINY", "tiny", 8, 4, 16, 32, 4, 32),
    "small": Shape("SMALL", "small", 16, 8, 32, 64, 4, 64),
}


def live_rows(r: int, turn: int, finish: float) -> list[int]:
    """Rows still running at `turn` (0-based): with finish 0.5, half of them end per turn."""
    if not finish:
        return list(range(r))
    keep = max(1, round(r * (1 - finish) ** turn))
    return list(range(keep))


def observation(row: int, turn: int, o: int, vocab: int) -> list[int]:
    return np.random.default_rng(row * 1000 + turn).integers(5, vocab, o).tolist()


def run_extend(eng, w, s: Shape, sampling, prompts, masks, compact: bool, finish: float):
    """Seconds per turn (device work, synchronised) of one multi-turn rollout."""
    r = s.prompts * s.group
    conv = Conversation(eng, sampling, slots_needed(s.prompt_tokens, s.new_tokens, s.turns,
                                                    1 + s.obs_tokens),
                        max_block=1 + s.obs_tokens, compact=compact)
    times = []
    t0 = time.perf_counter()
    conv.begin(w, prompts, masks, jax.random.key(0), num_samples=s.group)
    out = conv.decode()
    times.append(time.perf_counter() - t0)
    for turn in range(1, s.turns):
        rows = live_rows(r, turn, finish)
        obs = [observation(x, turn, s.obs_tokens, eng.model_cfg.vocab_size) for x in rows]
        t0 = time.perf_counter()
        conv.extend(rows, [s.new_tokens] * len(rows), obs, [s.new_tokens] * len(rows))
        out = conv.decode()
        times.append(time.perf_counter() - t0)
        assert (out.lengths == s.new_tokens).all()
    conv.close()
    return times


def run_reprefill(eng, w, s: Shape, sampling, prompts, masks, finish: float, devices: int):
    r = s.prompts * s.group
    history = [list(prompts[i // s.group][masks[i // s.group]]) for i in range(r)]
    longest = s.prompt_tokens + (s.turns - 1) * (s.new_tokens + s.obs_tokens)
    times = []
    for turn in range(s.turns):
        rows = live_rows(r, turn, finish)
        size = bucket(len(rows), r, devices)
        batch = [history[x] for x in rows] + [history[rows[0]]] * (size - len(rows))
        tokens, mask = pad_prompts(batch, 0, longest)
        t0 = time.perf_counter()
        gen = eng.generate(w, tokens, jax.random.key(turn), sampling, prompt_mask=mask)
        new = np.asarray(gen.tokens)  # synchronised: the host needs the turn
        times.append(time.perf_counter() - t0)
        for i, x in enumerate(rows):
            history[x] += new[i].tolist() + observation(x, turn, s.obs_tokens,
                                                       eng.model_cfg.vocab_size)
    return times


def bench(s: Shape, repeats: int, finish: float) -> dict:
    cfg = config.PRESETS[s.arch]()
    w = params.init(cfg, jax.random.key(0))
    eng = Engine(cfg)
    rng = np.random.default_rng(0)
    prompts, masks = pad_prompts(
        [rng.integers(5, cfg.vocab_size, s.prompt_tokens).tolist() for _ in range(s.prompts)],
        0, s.prompt_tokens)
    sampling = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0, ignore_eos=True)
    programs = {
        "extend": lambda: run_extend(eng, w, s, sampling, prompts, masks, True, finish),
        "mask": lambda: run_extend(eng, w, s, sampling, prompts, masks, False, finish),
        "reprefill": lambda: run_reprefill(eng, w, s, sampling, prompts, masks, finish, 1),
    }
    # warm-up: every shape of the run compiles here
    compile_s = {name: harness.timed(fn) for name, fn in programs.items()}
    runs = harness.interleave(programs, repeats)
    per_turn = {name: [statistics.median(r[t] for r in rs) for t in range(s.turns)]
                for name, rs in runs.items()}
    total = {name: statistics.median(sum(r) for r in rs) for name, rs in runs.items()}
    # Warm-up time less one steady run: the compile (and first-touch) cost of each program.
    return {"per_turn": per_turn, "total": total, "cfg": cfg,
            "weight_bytes": engine_work.weight_bytes(w),
            "compile": {k: v - total[k] for k, v in compile_s.items()}}


def trajectory_work(cfg, s: Shape, rows: list[int], weight_bytes: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one trajectory's useful work, the least any of the three programs
    must do: each prompt prefilled once, then per turn each live row's N - 1 decode tokens
    and, from the second turn on, its last token and O observation tokens extended in (at
    their exact contexts; the LM head only where a token is sampled); every weight read once
    per program step (a prefill or extend, and each decode step), each live row's written
    keys and values once per decode step. The roofline of `harness.roofline_seconds`."""
    per_slot = engine_work.slot_bytes(cfg)  # f32
    p, n, o = s.prompt_tokens, s.new_tokens, s.obs_tokens
    flops = engine_work.prefill_flops(cfg, s.prompts, p)
    nbytes, written = float(weight_bytes), p  # after the prefill: P slots a row
    for turn, r in enumerate(rows):
        if turn:  # the previous turn's last token and the observation, extended in
            flops += engine_work.prefill_flops(cfg, r, 1 + o, written)
            nbytes += weight_bytes
            written += 1 + o
        for i in range(n - 1):  # each decode step attends to the slots written so far
            flops += r * cfg.flops_per_token(written + i + 1)
            nbytes += weight_bytes + r * (written + i + 1) * per_slot
        written += n - 1
    return float(flops), float(nbytes)


def roofline_line(res: dict, work: tuple[float, float], peak: float, bandwidth: float) -> str:
    """Each program's trajectory time as a share of the useful work's roofline."""
    flops, nbytes = work
    side = "bytes" if nbytes / bandwidth >= flops / peak else "FLOPs"
    ideal = harness.roofline_seconds(flops, nbytes, peak, bandwidth)
    share = lambda t: harness.roofline_share(t, flops, nbytes, peak, bandwidth)  # noqa: E731
    shares = ", ".join(f"{name} {harness.fmt(share(t), '.0%')}"
                       for name, t in res["total"].items())
    return (f"roofline of the trajectory's useful work: {flops / 1e9:.2f} GFLOP, "
            f"{nbytes / 1e9:.2f} GB, {1000 * ideal:.1f} ms ({side}, at {peak / 1e9:.0f} GFLOP/s "
            f"and {bandwidth / 1e9:.1f} GB/s measured here); share reached: {shares}")


def table(res: dict, rows: list[int]) -> list[str]:
    """Per turn and for the whole trajectory: each program's median seconds and the ratios
    reprefill / extend and mask / extend (> 1: extend is faster)."""
    def cells(label, live, t: dict) -> list:
        e, m, p = t["extend"], t["mask"], t["reprefill"]
        return [label, live, f"{e:.4f}", f"{m:.4f}", f"{p:.4f}", f"{p / e:.2f}", f"{m / e:.2f}"]

    pt = res["per_turn"]
    return harness.table(
        ["turn", "live rows", "extend s", "mask s", "reprefill s", "reprefill / extend",
         "mask / extend"],
        [*(cells(t + 1, rows[t], {k: v[t] for k, v in pt.items()}) for t in range(len(rows))),
         cells("trajectory", "", res["total"])])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "small"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--finish", type=float, default=0.5,
                    help="fraction of live rows that finish after each turn (0: none)")
    args = ap.parse_args(argv)
    print(harness.header("bench_extend"))
    print(f"# {harness.command_line()}")
    for name in args.shapes:
        s = SHAPES[name]
        r = s.prompts * s.group
        rows = [len(live_rows(r, t, args.finish)) for t in range(s.turns)]
        print(f"\n## {s.name}: --model {s.arch} (random f32), {s.prompts} prompts x G {s.group} "
              f"= {r} rows, P {s.prompt_tokens}, {s.turns} turns x N {s.new_tokens} tokens "
              f"(exact), O {s.obs_tokens} observation tokens per turn; live rows per turn "
              f"{rows}; {args.repeats} interleaved repeats, medians", flush=True)
        res = bench(s, args.repeats, args.finish)
        print("\n" + "\n".join(table(res, rows)))
        work = trajectory_work(res["cfg"], s, rows, res["weight_bytes"])
        print("\n" + roofline_line(res, work, harness.matmul_peak(), harness.read_bandwidth()))
        c = res["compile"]
        print(f"\ncompile + first run less a steady one (s): extend {c['extend']:.1f}, "
              f"mask {c['mask']:.1f}, reprefill {c['reprefill']:.1f}")
    print(f"\n# load average after: {harness.loads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
