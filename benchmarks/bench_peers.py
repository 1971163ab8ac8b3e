"""locojax against Tunix and TRL: the same GRPO step, side by side, in one run.

Each side runs docs/design.md's TINY or SMALL GRPO step as its own docs set it up, in its own
process and environment (`benchmarks/peers/*_worker.py`):
- locojax: the `single`-mode step of `locojax train` (jitted prefill + decode, fused train step);
- Tunix 0.1.7: `GRPOLearner` on an `RLCluster`, colocated (actor = rollout = reference mesh),
  its jitted "vanilla" sampler with a KV cache;
- TRL 1.16: `GRPOTrainer`, generating with transformers `generate` (KV cache), torch CPU.
The work is identical (see `peers/common.py`): one Qwen3 config with random f32 weights,
the same prompts, exactly N new tokens (an EOS no sampler can draw), the same cheap reward
(the share of even token ids), one AdamW update per batch, β as given.

Timing: every side first runs `--warmup` steps (compile, caches; reported, not counted).
Then the sides take turns, `--block` steps each per round, for `--repeats` rounds, the
order rotating every round, so machine load hits all three alike. Each figure is the median
over those steady steps, with phases generate / reference / train / other (other = the step
minus the named phases: rewards, advantages, batch assembly, logging, Python). Every side's
device work is synchronised at its phase boundaries. The peers' environments are pinned venvs
under `--cache` (default ~/.cache/locojax/peers), made on first use (`--no-install`: use
them only if they exist). A side that cannot be installed, or crashes, is reported with the
reason, and the others still run and print.

It also prints locojax's achieved GFLOP/s at each shape (the matmul FLOPs its step does,
counted by the worker, over its median step time) against the f32 matmul peak of this
machine (2048³ `jnp.dot`, best of measurements before and after the shape's runs), and in
the per-step table every side's train phase as tokens/s and as a share of that peak.

Usage:
    .venv/bin/python -m benchmarks.bench_peers                       # TINY + SMALL, β 0 and 0.04
    .venv/bin/python -m benchmarks.bench_peers --shapes tiny --betas 0 --repeats 3 --no-install
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path


from benchmarks import harness
from benchmarks.harness import fmt
from benchmarks.peers import common, install

HERE = Path(__file__).resolve().parent

SIDES = ("locojax", "tunix", "trl")
DEFAULTS = {"tiny": dict(block=5, repeats=4), "small": dict(block=2, repeats=3)}


class Worker:
    """One side's worker process; JSON lines in and out, stderr to a log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict):
        self.name, self.log, self.error = name, log, ""
        self._lines: queue.Queue = queue.Queue()
        self._log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=env, cwd=str(HERE.parent))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self._lines.put(json.loads(line))
        self._lines.put(None)

    def receive(self, timeout: float) -> dict | None:
        """The next message; None (and `error` set) on a crash, a timeout or an error."""
        try:
            msg = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.fail(f"no answer in {timeout:.0f} s")
            return None
        if msg is None:
            self.fail(f"exited with code {self.proc.wait()}")
            return None
        if "error" in msg:
            self.fail(msg["error"])
            return None
        return msg

    def send(self, **cmd) -> None:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            self.fail(f"stdin closed: {e}")

    def fail(self, why: str) -> None:
        if not self.error:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:] \
                if self.log.exists() else []
            self.error = why + ("; stderr: " + " | ".join(t.strip()[:200] for t in tail)
                                if tail else "")
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(quit=True)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def side_argv(side: str, python: str, shape: str, beta: float, warmup: int,
              max_steps: int) -> list[str]:
    common_args = ["--shape", shape, "--beta", str(beta), "--warmup", str(warmup)]
    # Every side as a module of this package, from the repository root (`Worker`'s cwd): a
    # peer's venv imports `benchmarks.peers.common` from there, and nothing else of ours.
    argv = [python, "-m", f"benchmarks.peers.{side}_worker", *common_args]
    return argv if side == "locojax" else [*argv, "--max-steps", str(max_steps)]


def run_point(shape: str, beta: float, pythons: dict, args, work: Path) -> dict:
    """Start every available side, warm them up, then interleave their steady steps."""
    d = DEFAULTS[shape]
    block, repeats = args.block or d["block"], args.repeats or d["repeats"]
    max_steps = args.warmup + block * repeats
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), PYTHONUNBUFFERED="1")
    result = {"shape": shape, "beta": beta, "block": block, "repeats": repeats, "sides": {}}
    workers = {}
    for side in SIDES:
        res = result["sides"][side] = {"steps": [], "warmup": [], "error": ""}
        if side not in pythons or isinstance(pythons[side], Exception):
            res["error"] = f"not available: {pythons.get(side, 'not selected')}"
            continue
        argv = side_argv(side, pythons[side], shape, beta, args.warmup, max_steps)
        res["command"] = " ".join(argv)
        workers[side] = Worker(side, argv, work / f"{shape}-b{beta:g}-{side}.log", env)
    # Set-ups and warm-ups run concurrently (they are not timed); steady steps never do.
    for side, w in workers.items():
        msg = w.receive(args.timeout)
        res = result["sides"][side]
        if msg is not None:
            res.update(versions=msg["versions"], setup_s=msg["setup_s"], warmup=msg["warmup"],
                       flops=msg.get("flops"))
            warm = " ".join(f"{r['step_s']:.2f}" for r in msg["warmup"])
            print(f"# {shape} β={beta:g} {side}: ready (set-up {msg['setup_s']:.1f} s, warm-up "
                  f"steps {warm} s)", flush=True)
    loads = [harness.load()]
    for rnd in range(repeats):
        for side in [s for s in harness.rotated(SIDES, rnd) if s in workers]:
            w = workers[side]
            if w.error:
                continue
            w.send(run=block)
            msg = w.receive(args.timeout)
            if msg is not None:
                result["sides"][side]["steps"].extend(msg["steps"])
                times = " ".join(f"{r['step_s']:.3f}" for r in msg["steps"])
                print(f"# {shape} β={beta:g} round {rnd + 1}/{repeats} {side}: {times} s",
                      flush=True)
        loads.append(harness.load())
    for side, w in workers.items():
        w.close()
        if w.error:
            result["sides"][side]["error"] = w.error
            print(f"# {shape} β={beta:g} {side} FAILED: {w.error}", flush=True)
    result["load"] = loads
    return result


def med(rows, key):
    return harness.median([r[key] for r in rows])


def step_rows(r: dict, peak: dict) -> list:
    """One point's rows of the per-step table, a side each. The train phase's tokens/s (rows x
    (P + N) positions, every one real here, so useful = total) and its share of the measured
    matmul peak, at the FLOPs locojax's step does for this work (the same work on every side;
    a side that runs the prompt once per row does more)."""
    s = common.SHAPES[r["shape"]]
    flops = r["sides"]["locojax"].get("flops") or {}
    out = []
    for side in SIDES:
        res = r["sides"][side]
        head = [r["shape"].upper(), f"{r['beta']:g}", side]
        if not res["steps"]:
            why = (res["error"] or "no steps").replace("|", "/")
            out.append(harness.table_row(head)[:-1] + f"| FAILED: {why[:300]} |||||||||")
            continue
        rows = res["steps"]
        ref = fmt(med(rows, "reference"))
        if side == "locojax" and r["beta"]:
            ref = "in train"
        warm = " ".join(f"{w['step_s']:.2f}" for w in res["warmup"])
        train = med(rows, "train")
        share = harness.ratio(flops.get("train", float("nan")) / train, peak.get(r["shape"], 0))
        out.append([*head, fmt(med(rows, "step_s")), fmt(med(rows, "generate")), ref,
                    fmt(train), fmt(med(rows, "other")),
                    fmt(s.rows * (s.prompt_tokens + s.new_tokens) / train, ".0f"),
                    fmt(share, ".0%"), len(rows), warm,
                    f"{fmt(min(r['load']), '.1f')}-{fmt(max(r['load']), '.1f')}"])
    return out


def speedup_row(r: dict) -> list | str:
    """Peer median / locojax median of the step and its phases; > 1: locojax faster."""
    ours = r["sides"]["locojax"]["steps"]
    if not ours:
        return f"| {r['shape'].upper()} | {r['beta']:g} | locojax failed ||||||||"
    cells = [harness.ratio(med(rows, key), med(ours, key)) if rows else float("nan")
             for key in ("step_s", "generate", "train")
             for rows in (r["sides"][peer]["steps"] for peer in ("tunix", "trl"))]
    peers = [c for c in cells[:2] if c == c]
    best = min(peers) if peers else float("nan")
    c = [fmt(x, ".2f") + ("x" if x == x else "") for x in [*cells[:2], best, *cells[2:]]]
    return [r["shape"].upper(), f"{r['beta']:g}", *c]


def print_tables(results: list[dict], peak: dict) -> None:
    print("\n## Per step (median seconds over steady steps; phases are medians too)\n")
    print("\n".join(harness.table(
        ["shape", "β", "side", "step", "generate", "reference", "train", "other",
         "train tokens/s (useful = total)", "train, share of matmul peak", "steady steps",
         "warm-up steps", "load avg (1 min)"],
        [row for r in results for row in step_rows(r, peak)])))
    print("\n## locojax speed-up (peer median step / locojax median step; > 1: locojax faster)\n")
    print("\n".join(harness.table(
        ["shape", "β", "vs Tunix", "vs TRL", "vs best peer", "generate vs Tunix",
         "generate vs TRL", "train vs Tunix", "train vs TRL"],
        [speedup_row(r) for r in results])))
    for r in results:
        f = r["sides"]["locojax"].get("flops")
        ours = r["sides"]["locojax"]["steps"]
        if not f or not ours or r["shape"] not in peak:
            continue
        step = med(ours, "step_s")
        gf = f["total"] / step / 1e9
        print(f"\n{r['shape'].upper()} β={r['beta']:g}: locojax does {f['total'] / 1e9:.1f} GFLOP of matmuls per "
              f"step (generate {f['generate'] / 1e9:.1f}, train {f['train'] / 1e9:.1f}): "
              f"{gf:.1f} GFLOP/s at its median step = {100 * gf * 1e9 / peak[r['shape']]:.0f}% of "
              f"the measured f32 matmul peak {peak[r['shape']] / 1e9:.1f} GFLOP/s; train phase "
              f"alone {f['train'] / med(ours, 'train') / 1e9:.1f} GFLOP/s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["tiny", "small"], choices=sorted(DEFAULTS))
    ap.add_argument("--betas", nargs="+", type=float, default=[0.0, 0.04])
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--warmup", type=int, default=2, help="steps per side before timing")
    ap.add_argument("--block", type=int, default=0,
                    help="steps per side per round (0: TINY 5, SMALL 2)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="interleaved rounds (0: TINY 4, SMALL 3)")
    ap.add_argument("--cache", default=str(install.DEFAULT_CACHE),
                    help="where the peers' venvs live")
    ap.add_argument("--no-install", action="store_true",
                    help="use the peers' venvs only if they already exist")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per worker answer")
    ap.add_argument("--work-dir", default="/tmp/locojax_bench_peers", help="worker logs")
    ap.add_argument("--json", default="/tmp/locojax_bench_peers/results.json")
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.block < 0 or args.repeats < 0:
        ap.error("--warmup must be >= 1, --block and --repeats >= 0")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache)

    print(harness.command_line())
    print(harness.header("bench_peers", platform.platform()))
    pythons: dict = {}
    for side in args.sides:
        if side == "locojax":
            pythons[side] = sys.executable
            continue
        peer = install.PEERS[side]
        try:
            if install.is_ready(peer, cache):
                pythons[side] = str(peer.python(cache))
            elif args.no_install:
                raise RuntimeError(f"no venv at {peer.root(cache)} (--no-install)")
            else:
                print(f"# installing {side} into {peer.root(cache)} ...", flush=True)
                t0 = time.perf_counter()
                pythons[side] = str(install.install(peer, cache))
                print(f"# installed {side} in {time.perf_counter() - t0:.0f} s", flush=True)
        except (OSError, RuntimeError) as e:
            pythons[side] = e
            print(f"# {side} unavailable: {e}", flush=True)

    results, peak = [], {}
    t_start = time.perf_counter()
    for shape in args.shapes:
        s = common.SHAPES[shape]
        print(f"\n# {shape.upper()}: Qwen3 {s.layers} layers, d={s.hidden}, ffn {s.ffn}, "
              f"{s.heads} heads, {s.kv_heads} kv heads, head_dim {s.head_dim}, vocab {s.vocab}, "
              f"tied, random f32; {s.prompts} prompts x G {s.group}, {s.prompt_tokens} prompt "
              f"tokens, exactly {s.new_tokens} new tokens, temperature 1, AdamW lr {common.LR}",
              flush=True)
        before = harness.matmul_peak()
        for beta in args.betas:
            results.append(run_point(shape, beta, pythons, args, work))
        peak[shape] = max(before, harness.matmul_peak())
        print(f"# f32 matmul peak (2048^3 jnp.dot, best of before/after): "
              f"{peak[shape] / 1e9:.1f} GFLOP/s", flush=True)

    print_tables(results, peak)
    versions = {side: next((r["sides"][side]["versions"] for r in results
                            if r["sides"][side].get("versions")), None) for side in args.sides}
    print("\nversions: " + "; ".join(f"{k}: {v}" for k, v in versions.items()))
    print(f"total wall {time.perf_counter() - t_start:.0f} s; load average at end "
          f"{harness.loads()}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(
        {"command": sys.argv, "cpus": os.cpu_count(), "cpu": harness.cpu_model(),
         "versions": versions, "matmul_peak_flops": peak, "results": results}, indent=1))
    print(f"json: {args.json}")
    ok = all(r["sides"][s]["steps"] for r in results for s in args.sides)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
