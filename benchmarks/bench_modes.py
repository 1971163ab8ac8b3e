"""Step time of `--mode single` against `--mode colocated` at 1, 2 and 4 simulated hosts.

Every point is a real `locojax train` run, started as a subprocess exactly as a user would:

    single     locojax train demo --mode single --devices-per-host N ...      1 process x N devices
    colocated  locojax launch --hosts N --devices-per-host 1 -- train demo --mode colocated ...
                                                                               N processes x 1 device

Strong scaling: the global work is the same at every N and in both modes (prompts_per_step x
group_size rows per step, over all hosts), so a mode that scales well gets faster as N grows.
Both modes run the same engine, jit and shardings, and with the same seed they sample the same
tokens (the mode-equivalence test), so the work per step is identical; the table shows the
mean response length of both as a check.

Shapes are DESIGN.md's canonical TINY and SMALL (random f32 weights, char tokenizer). The arith
prompts are ~4-8 characters, left-padded to the shape's prompt length, so "prompt tokens" are
padded columns: the compute is the shape's, the content is short.

Workloads:
- `arith`: fixed length. `--rollout.ignore-eos`: every completion is exactly the shape's new
  tokens, the equal-work setting of DESIGN.md.
- `arith-var`: variable length. A model of the shape's architecture is first SFT'd briefly on
  level-1 arith demonstrations (`locojax sft --arch tiny|small --level 1`), so it answers
  "#### 57" and stops at EOS after ~7-9 tokens, with an occasional sample that never stops and
  runs to the cap. Decode stops when every row of a generate call is done, so here a mode pays
  for its slowest row: one generate over all rows (single) or one per host (colocated).
- `swe`: multi-turn and host-heavy (`locojax train swe`, generated level-1 repositories). The
  random model writes no tool call, so every trajectory is two model turns of the shape's new
  tokens around an error observation, and then autosubmit runs the repository's tests in the
  sandbox: one sandboxed test run per row per step, on the env worker pool of the host that
  owns the row (single: the controller's pool runs every row's). Prompts are the real SWE
  prompts (~620-670 characters, padded to 768). Not in the default `--workloads`.

Timing: `perf/step_time` from each run's `perf.jsonl` (compile time excluded by the profiler).
The median is over the steady steps: the first `--skip` steps are dropped (warm-up) and so is
the last one (it holds the run's one checkpoint save). Phases and `perf/host_fraction` are
medians over the same steps, as logged by process 0 (in colocated mode: host 0's view).

On a machine with fewer cores than N, colocated N x 1 oversubscribes it (N XLA processes
compete for the cores) while single N x 1 shares one process's thread pool: that is part of
the measured result, and the script says so.

Usage:
    .venv/bin/python benchmarks/bench_modes.py --quick           # TINY, N in 1 2, few steps
    .venv/bin/python benchmarks/bench_modes.py                   # full grid
    .venv/bin/python benchmarks/bench_modes.py --shapes small --hosts 1 2 --betas 0 0.04
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
CLI = [PY, "-m", "locojax.cli"]


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # model preset (DESIGN.md canonical shape)
    prompts: int  # B, over all hosts
    group: int  # G
    prompt_tokens: int  # P (padded columns)
    new_tokens: int  # N, exact for `arith`, the cap for `arith-var`
    steps: int  # default steps per run


SHAPES = {
    "tiny": Shape("TINY", "tiny", 8, 4, 16, 32, steps=20),
    "small": Shape("SMALL", "small", 16, 8, 32, 64, steps=7),
}
WORKLOADS = ("arith", "arith-var", "swe")
SWE_PROMPT_TOKENS = 768  # the char tokenizer's SWE prompts are 620-670 characters
SWE_OBS_TOKENS = 64
SFT_LEVEL = 1  # arith level of the variable-length workload's SFT and prompts
FIXED_LEVEL = 3  # arith level of the fixed-length workload (content only: lengths are forced)


@dataclasses.dataclass
class Result:
    shape: str
    workload: str
    beta: float
    n: int
    mode: str
    repeat: int
    command: str
    ok: bool = False
    error: str = ""
    step_time: float = float("nan")  # median over this run's steady steps
    steady: list[dict] = dataclasses.field(default_factory=list)  # perf.jsonl rows
    lengths: list[float] = dataclasses.field(default_factory=list)  # mean response length
    compile_time: float = float("nan")  # sum over the run
    load_before: float = float("nan")
    wall: float = float("nan")


# --- running ---------------------------------------------------------------------------------


def run_command(argv: list[str], log_path: Path, timeout: float) -> tuple[int, str]:
    """Run argv in its own session, output to log_path; on timeout SIGINT (launch stops its
    hosts on SIGINT), then SIGKILL. Returns (exit code, last lines of output)."""
    with open(log_path, "w") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            code = -9
    tail = log_path.read_text().strip().splitlines()[-8:]
    return code, "\n".join(tail)


def sft_model(shape: Shape, work_dir: Path, sft_steps: int, timeout: float) -> tuple[Path, str]:
    """The variable-length workload's model: `locojax sft` on level-1 arith (reused if present)."""
    out = work_dir / f"sft-{shape.arch}-level{SFT_LEVEL}-steps{sft_steps}"
    argv = [*CLI, "sft", "--task", "arith", "--level", str(SFT_LEVEL), "--arch", shape.arch,
            "--sft.steps", str(sft_steps), "--eval-examples", "0", "--out", str(out)]
    cmd = shlex.join(argv)
    if (out / "locojax.json").exists():
        print(f"# reusing SFT model {out} (made by: {cmd})", flush=True)
        return out, cmd
    print(f"$ {cmd}", flush=True)
    t0 = time.perf_counter()
    code, tail = run_command(argv, work_dir / f"sft-{shape.arch}.log", timeout)
    if code != 0:
        raise RuntimeError(f"SFT for {shape.name} failed ({code}):\n{tail}")
    print(f"# SFT done in {time.perf_counter() - t0:.0f}s", flush=True)
    return out, cmd


def swe_train(mode: str, model: str, prompts: int, group: int, turn_tokens: int, steps: int,
              run_dir: Path, beta: float = 0.0) -> list[str]:
    """`train swe` on generated level-1 repositories: 2 model turns of at most `turn_tokens`
    around one error observation, then the sandboxed test run (also bench_placement's)."""
    return [
        "train", "swe", "--mode", mode, "--model", model, "--task.level", "1",
        "--rollout.prompts-per-step", str(prompts), "--algo.group-size", str(group),
        "--rollout.max-prompt-tokens", str(SWE_PROMPT_TOKENS),
        "--rollout.max-new-tokens", str(turn_tokens), "--multi-turn.max-turns", "2",
        "--multi-turn.max-obs-tokens", str(SWE_OBS_TOKENS),
        "--multi-turn.max-trajectory-tokens", str(2 * turn_tokens + SWE_OBS_TOKENS),
        "--algo.beta", str(beta), "--steps", str(steps), "--eval.every", "0",
        "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir),
    ]


def train_argv(shape: Shape, workload: str, model: str, mode: str, n: int, steps: int,
               beta: float, run_dir: Path) -> list[str]:
    fixed = workload == "arith"
    if workload == "swe":
        train = swe_train(mode, model, shape.prompts, shape.group, shape.new_tokens, steps,
                          run_dir, beta)
        if mode == "single":
            return [*CLI, *train, "--devices-per-host", str(n)]
        return [*CLI, "launch", "--hosts", str(n), "--devices-per-host", "1", "--", *train]
    train = [
        "train", "demo", "--mode", mode, "--model", model, "--task.name", "arith",
        "--task.level", str(FIXED_LEVEL if fixed else SFT_LEVEL),
        "--rollout.prompts-per-step", str(shape.prompts), "--algo.group-size", str(shape.group),
        "--rollout.max-prompt-tokens", str(shape.prompt_tokens),
        "--rollout.max-new-tokens", str(shape.new_tokens),
        *(["--rollout.ignore-eos"] if fixed else []),
        "--algo.beta", str(beta), "--steps", str(steps), "--eval.every", "0",
        "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir),
    ]
    if mode == "single":
        return [*CLI, *train, "--devices-per-host", str(n)]
    return [*CLI, "launch", "--hosts", str(n), "--devices-per-host", "1", "--", *train]


def read_jsonl(path: Path) -> dict[int, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(row["step"], {}).update(row)
    return rows


def summarize(res: Result, run_dir: Path, steps: int, skip: int) -> None:
    perf = read_jsonl(run_dir / "perf.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    steady = [s for s in range(skip + 1, steps)]  # 1-based; the last step holds the checkpoint
    missing = [s for s in steady if s not in perf]
    if not steady or missing:
        raise RuntimeError(f"no steady steps to measure (steps {missing or steady} missing)")
    res.steady = [perf[s] for s in steady]
    res.step_time = statistics.median(float(row["perf/step_time"]) for row in res.steady)
    res.compile_time = sum(float(r.get("perf/compile_time", 0.0)) for r in perf.values())
    res.lengths = [float(metrics[s]["rollout/response_length/mean"]) for s in steady]


def run_point(shape: Shape, workload: str, model: str, mode: str, n: int, steps: int,
              beta: float, skip: int, root: Path, timeout: float, repeat: int) -> Result:
    run_dir = root / f"{shape.arch}-{workload}-b{beta:g}-n{n}-{mode}-r{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a leftover checkpoint would be resumed
    run_dir.mkdir(parents=True)
    argv = train_argv(shape, workload, model, mode, n, steps, beta, run_dir)
    res = Result(shape.name, workload, beta, n, mode, repeat, shlex.join(argv))
    res.load_before = os.getloadavg()[0]
    print(f"$ {res.command}", flush=True)
    t0 = time.perf_counter()
    code, tail = run_command(argv, root / f"{run_dir.name}.log", timeout)
    res.wall = time.perf_counter() - t0
    if code != 0:
        res.error = f"exit {code}: {tail.splitlines()[-1] if tail else ''}"
        print(f"# FAILED {res.error}\n{tail}", flush=True)
        return res
    try:
        summarize(res, run_dir, steps, skip)
        res.ok = True
        times = [f"{float(row['perf/step_time']):.3f}" for row in res.steady]
        print(f"# {res.step_time:.3f} s/step (steady {' '.join(times)}), "
              f"compile {res.compile_time:.1f}s, wall {res.wall:.0f}s", flush=True)
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        res.error = f"unreadable logs: {e}"
        print(f"# FAILED {res.error}", flush=True)
    return res


# --- reporting -------------------------------------------------------------------------------


def fmt(x: float, spec: str = ".3f") -> str:
    return "n/a" if x != x else format(x, spec)


def pooled(runs: list[Result]) -> dict | None:
    """One point's figures: medians over the steady steps of all its successful runs."""
    ok = [r for r in runs if r.ok]
    if not ok:
        return None
    rows = [row for r in ok for row in r.steady]
    med = lambda key: statistics.median(float(row.get(key, 0.0)) for row in rows)  # noqa: E731
    names = sorted({k for row in rows for k in row if k.startswith("perf/phase/")})
    return {
        "step": med("perf/step_time"), "host": med("perf/host_fraction"),
        "phases": {k[len("perf/phase/"):]: med(k) for k in names},
        "length": statistics.mean(x for r in ok for x in r.lengths),
        "compile": statistics.median(r.compile_time for r in ok),
        "load": statistics.mean(r.load_before for r in ok),
        "runs": [r.step_time for r in ok], "failed": len(runs) - len(ok),
    }


def print_tables(results: list[Result]) -> None:
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.shape, r.workload, r.beta, r.n, r.mode), []).append(r)
    by = {k: pooled(v) for k, v in groups.items()}
    points = sorted({k[:4] for k in by}, key=lambda k: (k[0] != "TINY", k[1], k[2], k[3]))
    nan = float("nan")
    print("\n## Step time (median s/step over steady steps; strong scaling: equal global work)\n")
    print("| shape | workload | β | N | single s/step | colocated s/step | single/colocated "
          "| mean resp. len single / colocated |")
    print("|---|---|---|---|---|---|---|---|")
    for key in points:
        s, c = by.get((*key, "single")), by.get((*key, "colocated"))
        st, ct = (s or {}).get("step", nan), (c or {}).get("step", nan)
        sl, cl = (s or {}).get("length", nan), (c or {}).get("length", nan)
        print(f"| {key[0]} | {key[1]} | {key[2]:g} | {key[3]} | {fmt(st)} | {fmt(ct)} "
              f"| {fmt(st / ct, '.2f')} | {fmt(sl, '.2f')} / {fmt(cl, '.2f')} |")
    print("\n## Phase breakdown (medians over steady steps, process 0's view, seconds)\n")
    print("| shape | workload | β | N | mode | step | host share | prefill | decode | train "
          "| detok+reward | batch | admission | env | extend | per-run medians | compile/run "
          "| load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in points:
        for mode in ("single", "colocated"):
            if (*key, mode) not in groups:
                continue
            p = by[(*key, mode)]
            head = f"| {key[0]} | {key[1]} | {key[2]:g} | {key[3]} | {mode} "
            if p is None:
                err = groups[(*key, mode)][-1].error.replace("|", "/")
                print(f"{head}| FAILED: {err} ||||||||||||")
                continue
            ph = lambda name: fmt(p["phases"].get(name, nan))  # noqa: E731
            runs = ", ".join(fmt(t) for t in p["runs"]) + (f" ({p['failed']} failed)"
                                                          if p["failed"] else "")
            print(f"{head}| {fmt(p['step'])} | {fmt(100 * p['host'], '.1f')}% | {ph('prefill')} "
                  f"| {ph('decode')} "
                  f"| {ph('train')} | {ph('detokenize_reward')} | {ph('batch')} "
                  f"| {ph('admission')} | {ph('env')} | {ph('extend')} | {runs} "
                  f"| {fmt(p['compile'], '.1f')} "
                  f"| {fmt(p['load'], '.2f')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES),
                    help="default: tiny small (--quick: tiny)")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["arith", "arith-var"],
                    help="default: arith arith-var (swe, multi-turn with sandboxed test runs, "
                    "on request)")
    ap.add_argument("--hosts", nargs="+", type=int,
                    help="N: simulated hosts, i.e. colocated processes / single-controller "
                    "devices (default: 1 2 4; --quick: 1 2)")
    ap.add_argument("--betas", nargs="+", type=float, default=[0.0],
                    help="KL coefficient(s); 0.04 adds the reference-model forward")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per run (0: the shape's default, TINY 20, SMALL 7; --quick: 6)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the median")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per point (steady steps of all runs are pooled into one median)")
    ap.add_argument("--sft-steps", type=int, default=150,
                    help="SFT steps of the arith-var model")
    ap.add_argument("--work-dir", default="/tmp/locojax_bench_modes",
                    help="run dirs, logs and the SFT models (reused across invocations)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--json", default="", help="also write every result to this file")
    ap.add_argument("--quick", action="store_true",
                    help="a quick run: defaults to TINY only, N in 1 2, 6 steps")
    args = ap.parse_args(argv)
    args.shapes = args.shapes or (["tiny"] if args.quick else ["tiny", "small"])
    args.hosts = args.hosts or ([1, 2] if args.quick else [1, 2, 4])
    args.steps = args.steps or (6 if args.quick else 0)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if any(n < 1 for n in args.hosts):
        ap.error(f"--hosts must be >= 1, got {args.hosts}")
    for name in args.shapes:
        shape = SHAPES[name]
        steps = args.steps or shape.steps
        if steps < args.skip + 2:
            ap.error(f"--steps {steps} leaves no steady step after --skip {args.skip} warm-up "
                     "steps and the final (checkpoint) step; use --steps >= skip + 2")
        for n in args.hosts:
            if shape.prompts % n:
                ap.error(f"{shape.name}: {shape.prompts} prompts do not split over {n} hosts")

    work = Path(args.work_dir)
    root = work / "runs"
    root.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    print("# bench_modes: locojax train, --mode single (1 process x N devices) vs --mode colocated "
          "(N processes x 1 device)")
    print("# STRONG SCALING: the same global work (prompts_per_step x group_size rows per step, "
          "over all hosts) at every N")
    print(f"# python {sys.version.split()[0]}, {cores} CPU cores, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if max(args.hosts) > cores:
        print(f"# NOTE: N={max(args.hosts)} > {cores} cores: colocated runs N XLA processes on "
              f"{cores} cores (oversubscribed); single runs N simulated devices in one process. "
              "Other users' processes may also be running (see the load column).")
    for name in args.shapes:
        s = SHAPES[name]
        print(f"# {s.name}: --model {s.arch} ({s.arch} preset, random f32 weights, char tokenizer),"
              f" {s.prompts} prompts x G {s.group}, prompts left-padded to {s.prompt_tokens} tokens"
              f" (arith prompts are ~4-8 chars), {s.new_tokens} new tokens "
              f"(exact for arith, the cap for arith-var), {args.steps or s.steps} steps per run, "
              f"median over steps {args.skip + 1}..{(args.steps or s.steps) - 1}")
    print("# arith: fixed length (--rollout.ignore-eos). arith-var: a model of the shape's "
          f"architecture SFT'd {args.sft_steps} steps on level-{SFT_LEVEL} arith, stopping at EOS "
          "(variable length, capped at the shape's new tokens)", flush=True)

    results: list[Result] = []
    sft_cmds = {}
    t_start = time.perf_counter()
    for name in args.shapes:
        shape = SHAPES[name]
        steps = args.steps or shape.steps
        for workload in args.workloads:
            model = shape.arch
            if workload == "arith-var":
                path, cmd = sft_model(shape, work, args.sft_steps, args.timeout)
                model, sft_cmds[shape.name] = str(path), cmd
            for beta in args.betas:
                for rep in range(args.repeats):
                    for i, n in enumerate(args.hosts):
                        # Alternate which mode goes first, so slow drift in machine load does
                        # not always favour the same one.
                        first = ("single", "colocated")
                        for mode in first if (i + rep) % 2 == 0 else first[::-1]:
                            results.append(run_point(shape, workload, model, mode, n, steps,
                                                     beta, args.skip, root, args.timeout, rep))

    print("\n## Commands\n")
    for shape, cmd in sft_cmds.items():
        print(f"- {shape} arith-var model: `{cmd}`")
    for r in results:
        print(f"- {r.shape} {r.workload} β={r.beta:g} N={r.n} {r.mode} run {r.repeat + 1}: "
              f"`{r.command}`")
    print_tables(results)
    print(f"\n# total wall {time.perf_counter() - t_start:.0f}s; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
