"""Step time of `--mode controller`, `colocated` and `single` at N = 1, 2 and 4 simulated hosts,
on the paper's workloads, in a strong- and a weak-scaling table.

Every point is a real `locojax train` run, started as a user would:

    single      locojax train ... --mode single --devices-per-host N        1 process x N devices
    colocated   locojax launch --hosts N --devices-per-host 1 -- train ... --mode colocated
                                                                             N processes x 1 device
    controller  locojax train ... --mode controller --hosts N --devices-per-host 1 --ray-address A
                                                 1 controller (Ray driver) + N host actors

colocated against controller is the paper's comparison (docs/design.md, "Coordination modes"): the
same N processes, the same train step and gloo all-reduce; only where admission, scoring and
batch assembly run differs. single (one process, no process boundary) is shown for scale.

Workloads (`--workloads`, default gsm8k math swe), each with locojax's own data path and reward:
- `gsm8k`: real GSM8K rows (`--gsm8k-data`, default ../shared/data/gsm8k/train.jsonl from the
  repository root), `--task.name gsm8k`, its strict `#### N` reward, the plain template.
- `math`: boxed-answer rows, NuminaMath-style (`--math-data`, default MATH-500's
  ../shared/data/math500/test.jsonl), `--task.name math`, the math-verify reward.
- `swe`: multi-turn bug fixing (`train swe`, generated level-1 repositories): 2 model turns
  around an error observation, then a sandboxed test run per row (autosubmit).
The model is docs/design.md's TINY architecture with random f32 weights and the built-in char
tokenizer (locojax's SFT knows only arith and calc, so no model here has learned GSM8K).
gsm8k and math run with `--rollout.ignore-eos`: every completion is the shape's 64 tokens,
in every mode alike, so each generate call is 63 decode iterations (swe's turns stop at a
sampled EOS or the cap, the same in every mode: same seed, same rows). The char
tokenizer encodes printable ASCII only, and a prompt longer than P tokens stops a run, so the
data file a run gets is the source file less the rows whose prompt does not encode within P
tokens with the task's template (a copy in --work-dir; the script prints how many it kept).
Legacy workloads `arith` and `arith-var` (docs/design.md's TINY/SMALL shapes, `--shapes`) remain for
calibrate_predict.py, validate_predict.py and ab_runs.py.

Scaling (`--scaling`, default both), each table labelled by what is held fixed:
- strong: the global batch, B prompts x G rows per step over all N hosts;
- weak: the rows per host, b prompts x G per host (default b = B / 4), so B = b x N. At N = 4
  weak is strong's point: those runs serve both tables and run once per repeat.

A/A noise: every arm (workload, scaling, N, mode) runs `--repeats` times (default 2), every
repeat running every arm once, mode order rotating, so machine load falls on all alike. An
arm's A/A spread is max / min - 1 of its runs' medians; a ratio within the larger spread of
the two arms is reported as a tie (modes_report.py).

Timing: `perf/step_time` from each run's perf.jsonl (process 0; in controller mode host 0's
step, whose wait for the controller holds the data path). The profiler's timing mode is
`perf/timing` (printed). `--profile-split` (default on) splits the train step into compute,
straggler wait and the gradient all-reduce, in every mode alike. Medians over the steady steps:
the first `--skip` steps (warm-up) and the last (it holds the run's checkpoint) are dropped.
Compile time is apart (`perf/compile_time`, summed per run). All runs share one JAX
compilation cache (`--work-dir`/jax_cache) and one Ray cluster (the controller's), so neither
start-up is paid per run in a figure.

On a machine with fewer cores than N, the N host processes share the cores (and single's N
devices share one process's thread pool): that is part of the measured result, printed with the
machine and its load.

Usage (from the repository root: `python -m locojax.cli` puts the cwd first on sys.path):
    .venv/bin/python -m benchmarks.bench_modes                       # the default grid
    .venv/bin/python -m benchmarks.bench_modes --quick               # gsm8k, N 1 2, 1 repeat
    .venv/bin/python -m benchmarks.bench_modes --workloads gsm8k --hosts 4 --scaling strong
    .venv/bin/python -m benchmarks.bench_modes --report-only --json runs.json   # tables again
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path


from benchmarks import harness, modes_report
from benchmarks.workloads import (
    DATA,
    MODES,
    PAPER,
    SHAPES,
    WORKLOADS,
    Shape,
    prepare_data,
    sft_model,
    train_argv,
)


@dataclasses.dataclass
class Result:
    shape: str
    workload: str
    beta: float
    n: int
    mode: str
    repeat: int
    command: str
    scalings: list[str] = dataclasses.field(default_factory=lambda: ["strong"])
    rows: int = 0  # prompts x G per step, over all hosts
    ok: bool = False
    error: str = ""
    step_time: float = float("nan")  # median over this run's steady steps
    steady: list[dict] = dataclasses.field(default_factory=list)  # perf.jsonl rows
    lengths: list[float] = dataclasses.field(default_factory=list)  # mean response length
    decode_iterations: list[float] = dataclasses.field(default_factory=list)
    compile_time: float = float("nan")  # sum over the run
    load_before: float = float("nan")
    load_after: float = float("nan")
    wall: float = float("nan")


# --- measuring -------------------------------------------------------------------------------


def summarize(res: Result, run_dir: Path, steps: int, skip: int) -> None:
    res.steady = harness.steady_rows(run_dir, steps, skip)
    perf = harness.read_steps(run_dir / "perf.jsonl")
    metrics = harness.read_steps(run_dir / "metrics.jsonl")
    steady = harness.steady_steps(steps, skip)
    res.step_time = statistics.median(float(row["perf/step_time"]) for row in res.steady)
    res.compile_time = sum(float(r.get("perf/compile_time", 0.0)) for r in perf.values())
    res.lengths = [float(metrics[s]["rollout/response_length/mean"]) for s in steady]
    res.decode_iterations = [float(metrics[s]["rollout/decode_iterations"]) for s in steady
                             if "rollout/decode_iterations" in metrics[s]]


def run_point(res: Result, argv: list[str], run_dir: Path, steps: int, skip: int,
              timeout: float) -> Result:
    shutil.rmtree(run_dir, ignore_errors=True)  # a leftover checkpoint would be resumed
    run_dir.mkdir(parents=True)
    res.command = shlex.join(argv)
    res.load_before = harness.load()
    print(f"$ {res.command}   # load {res.load_before:.1f}", flush=True)
    t0 = time.perf_counter()
    code, tail = harness.run_logged(argv, run_dir.parent / f"{run_dir.name}.log", timeout)
    res.wall, res.load_after = time.perf_counter() - t0, harness.load()
    if code != 0:
        lines = [ln for ln in tail.splitlines() if ln.strip()]
        res.error = f"exit {code}: {lines[-1] if lines else ''}"
        print(f"# FAILED {res.error}", flush=True)
        return res
    try:
        summarize(res, run_dir, steps, skip)
        res.ok = True
        times = " ".join(f"{float(row['perf/step_time']):.3f}" for row in res.steady)
        print(f"# {res.step_time:.3f} s/step (steady {times}), compile {res.compile_time:.1f}s,"
              f" wall {res.wall:.0f}s", flush=True)
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        res.error = f"unreadable logs: {e}"
        print(f"# FAILED {res.error}", flush=True)
    return res


def plan(args) -> list[tuple]:
    """Every run, in order: (workload, spec, repeat, n, mode, global prompts, [scalings]). Workload
    by workload; within one, every repeat runs every arm once, the modes' order rotating from
    point to point and from repeat to repeat."""
    out = []
    for workload, spec in items(args):
        points: dict[tuple[int, int], list[str]] = {}  # (n, prompts) -> scalings it serves
        for scaling in args.scaling:
            for n in args.hosts:
                b = spec.prompts if scaling == "strong" else spec.weak_prompts * n
                points.setdefault((n, b), []).append(scaling)
        for rep in range(args.repeats):
            for i, ((n, b), scalings) in enumerate(points.items()):
                out += [(workload, spec, rep, n, mode, b, scalings)
                        for mode in harness.rotated(args.modes, i + rep)]
    return out


def items(args) -> list[tuple[str, Shape]]:
    """(workload, shape) pairs: a paper workload has its own; arith and arith-var run at each
    of --shapes."""
    return [(w, spec) for w in args.workloads
            for spec in ([PAPER[w]] if w in PAPER else [SHAPES[s] for s in args.shapes])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["gsm8k", "math", "swe"])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--scaling", nargs="+", choices=("strong", "weak"), default=["strong", "weak"])
    ap.add_argument("--hosts", nargs="+", type=int, help="N (default 1 2 4; --quick: 1 2)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per arm, interleaved (>= 2 for an A/A spread)")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per run (0: the workload's: gsm8k, math, swe 5; TINY arith 20, "
                    "SMALL 7)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the median")
    ap.add_argument("--no-split", dest="split", action="store_false",
                    help="time the train step fused (no train_compute/wait/collective split)")
    ap.add_argument("--decode-chunk", type=int, default=0,
                    help="controller: --controller.decode-chunk K (0: the mode's default, the "
                    "whole decode loop per request)")
    ap.add_argument("--gsm8k-data", type=Path, default=DATA["gsm8k"])
    ap.add_argument("--math-data", type=Path, default=DATA["math"])
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny"],
                    help="arith / arith-var only: the shape(s)")
    ap.add_argument("--betas", nargs="+", type=float, default=[0.0],
                    help="KL coefficient(s); 0.04 adds the reference-model forward")
    ap.add_argument("--sft-steps", type=int, default=150, help="arith-var's SFT steps")
    ap.add_argument("--work-dir", default="/tmp/locojax_bench_modes",
                    help="run dirs, logs, data copies, the JAX cache, SFT models")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    ap.add_argument("--retries", type=int, default=1,
                    help="run a failed run again this many times (a cold compile can outlast "
                    "gloo's 30 s start-up deadline on a loaded machine); an arm that still "
                    "fails is skipped in later repeats")
    ap.add_argument("--json", default="", help="write every result here (--report-only: read)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: print the tables from --json")
    ap.add_argument("--quick", action="store_true", help="gsm8k, N 1 2, 1 repeat, 5 steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.workloads, args.repeats = ["gsm8k"], 1
        args.hosts, args.steps = args.hosts or [1, 2], args.steps or 5
    args.hosts = args.hosts or [1, 2, 4]
    if args.repeats < 1 or any(n < 1 for n in args.hosts):
        ap.error("--repeats and --hosts must be >= 1")
    for w, spec in items(args):
        steps = args.steps or spec.steps
        if steps < args.skip + 2:
            ap.error(f"{w}: --steps {steps} leaves no steady step after --skip {args.skip} and "
                     "the final (checkpoint) step")
        if "strong" in args.scaling and any(spec.prompts % n for n in args.hosts):
            ap.error(f"{w}: {spec.prompts} prompts do not split over {args.hosts} hosts")

    if args.report_only:
        results = [Result(**r) for r in json.loads(Path(args.json).read_text())]
        print_report(results, args)
        return 0
    if len(args.betas) > 1:
        ap.error("one --betas value per invocation")
    results = measure(args)
    print_report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1


def measure(args) -> list[Result]:
    work = Path(args.work_dir).resolve()
    root = work / "runs"
    root.mkdir(parents=True, exist_ok=True)
    harness.share_jax_cache(work)
    print(harness.header("bench_modes", f"JAX cache {os.environ['JAX_COMPILATION_CACHE_DIR']}"))
    if max(args.hosts) > (os.cpu_count() or 1):
        print(f"# NOTE: N = {max(args.hosts)} > {os.cpu_count()} cores: the N host processes "
              "(and single's N devices) share the cores", flush=True)
    data, models = {}, {}
    for w, spec in items(args):
        if w in ("gsm8k", "math"):
            src = args.gsm8k_data if w == "gsm8k" else args.math_data
            data[w] = str(prepare_data(w, src.resolve(), spec.prompt_tokens, work))
        models[(w, spec.name)] = spec.arch
        if w == "arith-var":
            path, cmd = sft_model(spec, work, args.sft_steps, args.timeout)
            models[(w, spec.name)] = str(path)
            print(f"# {spec.name} arith-var model: {cmd}")
    ray = harness.local_ray() if "controller" in args.modes else contextlib.nullcontext("")
    results, failed = [], set()
    t_start = time.perf_counter()
    with ray as address:
        for w, spec, rep, n, mode, b, scalings in plan(args):
            res = Result(spec.name, w, args.betas[0], n, mode, rep, "", scalings, b * spec.group)
            if (w, spec.name, n, mode, b) in failed:
                res.error = "skipped: failed in an earlier repeat"
            else:
                run_dir = root / f"{w}-{spec.name.lower()}-n{n}-b{b}-{mode}-r{rep}"
                steps = args.steps or spec.steps
                argv = train_argv(spec, w, models[(w, spec.name)], mode, n, steps,
                                  args.betas[0], run_dir, prompts=b, data=data.get(w, ""),
                                  ray_address=address, split=args.split,
                                  decode_chunk=args.decode_chunk)
                run_with_retries(res, argv, run_dir, steps, args)
                if not res.ok:
                    failed.add((w, spec.name, n, mode, b))
            results.append(res)
            if args.json:  # kept current, so --report-only works on a stopped grid
                Path(args.json).write_text(json.dumps(
                    [dataclasses.asdict(r) for r in results], indent=1))
    print(f"\n# total wall {time.perf_counter() - t_start:.0f}s; load average after: "
          f"{harness.loads()}")
    return results


def run_with_retries(res: Result, argv: list[str], run_dir: Path, steps: int, args) -> None:
    for attempt in range(1 + args.retries):
        if attempt:  # keep the failed attempt's log
            log = run_dir.parent / f"{run_dir.name}.log"
            log.rename(log.with_suffix(f".attempt{attempt}.log"))
            print(f"# retry {attempt} of {args.retries}", flush=True)
            res.error = ""
        run_point(res, argv, run_dir, steps, args.skip, args.timeout)
        if res.ok:
            return


def print_report(results: list[Result], args) -> None:
    print("\n## Commands\n")
    for r in results:
        print(f"- {r.workload} {'/'.join(r.scalings)} N={r.n} {r.mode} run {r.repeat + 1}: "
              f"`{r.command}`" + ("" if r.ok else f" -- {r.error}"))
    ok = [r for r in results if r.ok]
    timing = sorted({str(row.get("perf/timing", "?")) for r in ok for row in r.steady})
    loads = [x for r in ok for x in (r.load_before, r.load_after)]
    print(f"\n# timing: {', '.join(timing) or '?'} (perf/timing); train step "
          f"{'split (--profile-split)' if args.split else 'fused'}; steady steps "
          f"{args.skip + 1}..steps-1; compile time apart (its own column)")
    if loads:
        print(f"# load average during the runs: {min(loads):.1f}-{max(loads):.1f} "
              f"(per cell: the load column); {os.cpu_count()} cores")
    specs = {(spec.name, w): spec for w, spec in items(args)}
    print("\n".join(modes_report.report(results, specs, args.hosts, args.scaling)))


if __name__ == "__main__":
    sys.exit(main())
