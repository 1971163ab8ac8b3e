"""Calibrate `locojax predict`'s cpu-here profile from runs at N = 1 on this machine.

Everything the validation (`validate_predict.py`) later predicts at N = 2 and 4 is fitted
here from single-process runs only:
1. probes (`predict_probes.py`): the f32 matmul peak on 2 cores and on 1 (`taskset -c 0`),
   memory copy bandwidth, gloo all-reduce time over 2 and 4 local processes (the link
   between simulated hosts), Ray call and weight-push round trips, and the machine terms
   of hosts sharing one machine (locojax/predict/shared_machine.py): the over-subscription
   penalty of k processes on the cores, and a multi-device process's loop iteration at N
   devices;
2. `locojax train --mode single --devices-per-host 1` runs at N = 1 of the benchmarks'
   shapes (bench_modes.py's gsm8k, math and swe and its legacy arith shapes,
   bench_placement.py's arith), at the rows each host gets at N = 1, 2 and 4 (B, B/2, B/4
   prompts; B/3 for bench_placement's 3-worker leases), on 2 cores and on 1
   (`taskset -c 0`), interleaved; their phase medians give, per model shape and program
   kind, t(1 core) = a + flops / F1 and the parallel share φ (locojax/predict/devices.py),
   the host rates per prompt and row, the reward per row of each task and swe's env time
   per row; the arith-var run dumps its rollouts, whose lengths become the workload's.
   math shares gsm8k's shapes: it runs on 2 cores only, for its reward rate (math-verify);
3. writes locojax/predict/hardware/cpu-here.json, host_rates.json and the arith-var length
   samples in workloads.json, each number with this command, the date and the load.

Each run also records the CPU time other processes took while it ran (`other_cpu_s`: the
machine's busy time from /proc/stat less the run's own, its reaped processes' rusage). A
1-minute load average cannot tell a run's own threads from a stray job; this can, and a run
that shared the cores with one is not a measurement of the machine. Above `DISTURBED` a run
is run again, up to `RETRIES` times; one still disturbed is kept, with its share recorded.
swe's runs are exempt: its sandboxed tool runs are the run's own work, but they leave its
process tree (a pid namespace whose init is killed is reaped by no ancestor of ours), so
their CPU reads as other processes' (about 14% of the machine in a quiet swe run).

Usage:
    .venv/bin/python benchmarks/calibrate_predict.py                # probes, runs, fit, write
    .venv/bin/python benchmarks/calibrate_predict.py --refit        # fit again from the saved runs
    .venv/bin/python benchmarks/calibrate_predict.py --points tiny-arith --no-probes
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file: import as `-m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from benchmarks.harness import run_logged as run_command  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    DATA,
    PAPER,
    SHAPES,
    Shape,
    prepare_data,
    sft_model,
    train_argv,
)

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PROBES = [PY, str(Path(__file__).parent / "predict_probes.py")]
ONE_CORE = ["taskset", "-c", "0"]

# name -> (shape, workload, prompts per run, steps, skip[, cores]); prompts: B, and its shares
# per host; cores: which of 2 and 1 (taskset) each prompt count runs on (default both).
POINTS = {
    "tiny-arith": (SHAPES["tiny"], "arith", (8, 4, 2), 12, 2),
    "tiny-arith-var": (SHAPES["tiny"], "arith-var", (8, 4, 2), 12, 2),
    "small-arith": (SHAPES["small"], "arith", (16, 8, 4), 6, 2),
    "small-arith-var": (SHAPES["small"], "arith-var", (16, 8, 4), 6, 2),
    "placement-arith": (Shape("PLACEMENT", "tiny", 12, 4, 16, 128, 8), "arith", (12, 6, 4, 3),
                        8, 3),
    "gsm8k": (PAPER["gsm8k"], "gsm8k", (8, 4, 2), 6, 2),
    "math": (PAPER["math"], "math", (8, 2), 6, 2, (2,)),
    "swe": (PAPER["swe"], "swe", (8, 4, 2), 5, 2),
}
TASK = {"arith": "arith", "arith-var": "arith", "gsm8k": "gsm8k", "math": "math", "swe": "swe"}


def load() -> float:
    return os.getloadavg()[0]


DISTURBED = 0.05  # of the machine's core-seconds: a stray job's, not kernel noise (~0.5%)
RETRIES = 2
OWN_WORK_ESCAPES = {"swe"}  # workloads whose own processes leave the run's tree (sandboxes)


def busy_s() -> float:
    """Core-seconds the machine has been busy (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def disturbed(rec: dict) -> bool:
    return not rec["own_work_escapes"] and rec["other_share"] > DISTURBED


def probe(args: list[str], prefix: list[str] = ()) -> dict:
    out = subprocess.run([*prefix, *PROBES, *args], capture_output=True, text=True, timeout=900,
                         cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"probe {args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE_ARGS = {"matmul_2": (["matmul"], []), "matmul_1": (["matmul"], ONE_CORE),
              "stream": (["stream"], []), "allreduce_2": (["allreduce", "--n", "2"], []),
              "allreduce_4": (["allreduce", "--n", "4"], []), "ray": (["ray"], []),
              "oversub": (["oversub"], []), "multidev": (["multidev"], [])}


def run_probes(names: list[str] | None = None) -> dict:
    """Every probe (or those named), each result under its name, with the load."""
    res = {"load_before": load()} if names is None else {}
    for name in names or PROBE_ARGS:
        args, prefix = PROBE_ARGS[name]
        res[name] = probe(args, prefix)
        res[name]["load"] = load()
    if names is None:
        res["load_after"] = load()
    print(f"# probes: {json.dumps(res)}", flush=True)
    return res


def steady(run_dir: Path, steps: int, skip: int) -> dict:
    rows: dict[int, dict] = {}
    for line in (run_dir / "perf.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows.setdefault(r["step"], {}).update(r)
    keep = [rows[s] for s in range(skip + 1, steps)]
    keys = sorted({k for r in keep for k, v in r.items()  # perf/timing names the clock
                   if k.startswith("perf/") and not isinstance(v, str)})
    return {k: statistics.median(float(r.get(k, 0.0)) for r in keep) for k in keys}


def one_run(name: str, prompts: int, cores: int, work: Path, model: str, timeout: float,
            dump: bool, data: str = "") -> dict:
    shape, workload, _, steps, skip = POINTS[name][:5]
    sh = Shape(shape.name, shape.arch, prompts, shape.group, shape.prompt_tokens,
               shape.new_tokens, steps)
    run_dir = work / f"{name}-b{prompts}-c{cores}"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    argv = train_argv(sh, workload, model, "single", 1, steps, 0.0, run_dir, data=data)
    if dump:
        argv.append("--dump-rollouts")
    argv = (ONE_CORE if cores == 1 else []) + argv
    rec = {"point": name, "prompts": prompts, "cores": cores, "command": shlex.join(argv),
           "load": load()}
    print(f"$ {rec['command']}", flush=True)
    t, busy, own = time.perf_counter(), busy_s(), children_cpu_s()
    code, tail = run_command(argv, work / f"{run_dir.name}.log", timeout)
    rec["wall"] = time.perf_counter() - t
    rec["other_cpu_s"] = max(0.0, (busy_s() - busy) - (children_cpu_s() - own))
    rec["other_share"] = rec["other_cpu_s"] / (rec["wall"] * (os.cpu_count() or 1))
    rec["own_work_escapes"] = workload in OWN_WORK_ESCAPES
    if code:
        raise RuntimeError(f"{name} b={prompts} c={cores} failed ({code}):\n{tail}")
    rec["perf"] = steady(run_dir, steps, skip)
    if dump:
        files = sorted((run_dir / "rollouts").glob("*.npz"))
        rec["lengths"] = [int(x) for f in files for x in np.load(f)["mask"].sum(axis=1)]
    flag = " DISTURBED" if disturbed(rec) else ""
    print(f"# {rec['perf']['perf/step_time']:.4f} s/step, load {rec['load']:.2f}, other "
          f"processes {rec['other_cpu_s']:.1f} core-s ({100 * rec['other_share']:.1f}% of "
          f"the machine){flag}", flush=True)
    return rec


def run_points(names: list[str], work: Path, timeout: float, sft_steps: int) -> list[dict]:
    # One JAX compilation cache for every run here and validate_predict.py's (bench_modes
    # --work-dir is this work dir): compile time is apart in every figure, this only
    # shortens the runs.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(work / "jax_cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    recs = []
    for name in names:
        shape, workload, prompt_list = POINTS[name][:3]
        cores_list = POINTS[name][5] if len(POINTS[name]) > 5 else (2, 1)
        model, data = shape.arch, ""
        if workload == "arith-var":
            model = str(sft_model(shape, work, sft_steps, timeout)[0])
        if workload in DATA:
            data = str(prepare_data(workload, DATA[workload].resolve(), shape.prompt_tokens,
                                    work))
        for i, b in enumerate(prompt_list):
            # interleave: alternate which goes first
            order = cores_list if i % 2 == 0 else tuple(reversed(cores_list))
            for cores in order:
                dump = workload == "arith-var" and cores == 2 and b == prompt_list[0]
                for _attempt in range(RETRIES + 1):
                    rec = one_run(name, b, cores, work, model, timeout, dump, data)
                    if not disturbed(rec):
                        break
                recs.append(rec)  # still disturbed after the retries: kept, and marked so
    return recs


if __name__ == "__main__":
    from benchmarks.calibrate_fit import main  # the fit and the writing, one file each

    sys.exit(main(POINTS, run_probes, run_points, TASK))
