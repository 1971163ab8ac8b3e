"""bench_modes.py's tables: pooled medians per cell, the A/A spread, ties, and the split.

A cell is one arm: (shape, workload, scaling, N, mode). Its figures pool the steady steps of
all its runs (one median over all of them); its A/A spread is how far its runs' own medians lie
apart, max / min - 1, the noise of a mode against itself on this machine at this load. A
ratio of two cells whose distance from 1 is within the larger of their two spreads is
reported as a tie: the two modes differ by no more than either differs from itself.

Everything here reads what `locojax train` wrote to perf.jsonl and metrics.jsonl (process 0's
lines; in controller mode host 0's, which carry the controller's own `perf/controller/*`),
so a cell says only what the run measured.
"""

from __future__ import annotations

import statistics

from benchmarks.harness import NAN, aa_spread, fmt, table, table_row, verdict
from benchmarks.harness import med as median
from locojax import profiler

MODES = ("single", "colocated", "controller")
PHASES = ("admission", "prefill", "decode", "extend", "env", "detokenize_reward", "batch",
          "wait_controller", "train", "train_compute", "train_wait", "train_collective",
          "metrics")
"""Phases of a host's step, in step order (those a cell has none of are left out)."""
CONTROLLER_PHASES = ("admission", "prefill", "decode", "extend", "env", "detokenize_reward",
                     "batch", "scatter")
"""The controller's own phases (`perf/controller/phase/*`): prefill is its dispatch of the
rows (multi-turn: turn 1 too), decode its wait for and gather of the hosts' generations,
extend and env the later turns and the tool calls and tests it runs, detokenize_reward its
central scoring (controller.py)."""
SHORT = {"admission": "admit", "prefill": "prefill", "decode": "decode", "extend": "extend",
         "env": "env", "detokenize_reward": "score", "batch": "batch",
         "wait_controller": "wait ctrl", "train": "train", "train_compute": "tr.compute",
         "train_wait": "tr.wait", "train_collective": "tr.coll", "metrics": "metrics",
         "scatter": "scatter"}
CTRL = {"admission": "ctrl admit", "prefill": "ctrl dispatch",
        "decode": "ctrl gather (+ hosts' generate, train)", "detokenize_reward": "ctrl score",
        "extend": "ctrl extend", "env": "ctrl env", "batch": "ctrl batch",
        "scatter": "ctrl scatter"}
"""The controller's phase columns. Its gather waits for the hosts' generate calls, which wait
for the hosts to finish training the step before: it holds their train and generate."""
TRAFFIC = ("controller/round_trips", "controller/round_trip_s", "net/dispatch_bytes",
           "net/gather_bytes", "net/scatter_bytes", "net/allreduce_bytes",
           "net/weight_sync_push_bytes", "net/weight_sync_pull_bytes")
"""Per-step counts of the controller's round trips and of the network bytes (`perf/<name>`,
profiler.py)."""
def ratio_cell(num: dict | None, den: dict | None) -> str:
    """`num` step ÷ `den` step with its verdict against the larger of the two A/A spreads."""
    if not num or not den:
        return "n/a"
    r = num["step"] / den["step"]
    s = max(num["spread"], den["spread"]) if num["spread"] == num["spread"] \
        and den["spread"] == den["spread"] else NAN
    v = verdict(r, s)
    noise = f"A/A ±{100 * s:.0f}%" if s == s else "A/A unknown"
    return f"{r:.2f} {'**tie**' if v == 'tie' else v} ({noise})"


def pooled(runs: list) -> dict | None:
    """One cell's figures from its runs (bench_modes.Result): medians over every steady step
    of every successful run; None if none succeeded."""
    ok = [r for r in runs if r.ok]
    if not ok:
        return None
    rows = [row for r in ok for row in r.steady]
    per_run = [r.step_time for r in ok]
    out = {
        "step": median(rows, "perf/step_time"), "runs": per_run,
        "spread": aa_spread(per_run), "failed": len(runs) - len(ok),
        "phases": {p: median(rows, f"perf/phase/{p}") for p in PHASES
                   if any(f"perf/phase/{p}" in row for row in rows)},
        "other": median(rows, "perf/other"),
        # recomputed from the phases, so runs logged before a share's definition changed
        # (profiler.CONTROLLER_HOST_PHASES gained `env`) read as the profiler reads them now
        "shares": {k: statistics.median(profiler.shares(row)[f"perf/{k}_share"] for row in rows)
                   for k in ("host", "network", "wait")},
        "controller": {p: median(rows, f"perf/controller/phase/{p}") for p in CONTROLLER_PHASES
                       if any(f"perf/controller/phase/{p}" in row for row in rows)},
        "traffic": {k: median(rows, f"perf/{k}") for k in TRAFFIC
                    if any(f"perf/{k}" in row for row in rows)},
        "hosts_max": median(rows, "perf/hosts/step_time/max"),
        "hosts_spread": median(rows, "perf/hosts/step_time/spread"),
        "timing": sorted({str(row.get("perf/timing", "?")) for row in rows}),
        "compile": statistics.median(r.compile_time for r in ok),
        "wall": statistics.median(r.wall for r in ok),
        "load": statistics.mean(r.load_before for r in ok),
        "length": statistics.mean(x for r in ok for x in r.lengths) if any(
            r.lengths for r in ok) else NAN,
        "decode_iters": statistics.mean(x for r in ok for x in r.decode_iterations) if any(
            r.decode_iterations for r in ok) else NAN,
        "rows": ok[0].rows,
    }
    return out


def cells(results: list) -> dict[tuple, dict | None]:
    """(shape, workload, scaling, n, mode) -> pooled figures. A run serves every cell it is listed
    for (weak N = 4 is strong N = 4 when the per-host rows agree)."""
    groups: dict[tuple, list] = {}
    for r in results:
        for scaling in r.scalings:
            groups.setdefault((r.shape, r.workload, scaling, r.n, r.mode), []).append(r)
    return {k: pooled(v) for k, v in groups.items()}


def mode_spreads(by: dict[tuple, dict | None]) -> dict[str, tuple[float, float, int]]:
    """Each mode's A/A spread over the grid: (median, max, cells with >= 2 runs). A run that
    serves two cells is counted once."""
    seen, out = set(), {}
    for (shape, workload, _, n, mode), c in by.items():
        key = (shape, workload, n, mode, tuple(c["runs"]) if c else ())
        if c is None or c["spread"] != c["spread"] or key in seen:
            continue
        seen.add(key)
        out.setdefault(mode, []).append(c["spread"])
    return {m: (statistics.median(v), max(v), len(v)) for m, v in out.items()}


def _held(scaling: str, spec) -> str:
    if scaling == "strong":
        return (f"STRONG SCALING, held fixed: the global batch, {spec.prompts} prompts x G "
                f"{spec.group} = {spec.prompts * spec.group} rows per step over all N hosts")
    return (f"WEAK SCALING, held fixed: the rows per host, {spec.weak_prompts} prompts x G "
            f"{spec.group} = {spec.weak_prompts * spec.group} rows per host per step "
            f"(global batch {spec.weak_prompts} x N prompts)")


def step_table(by: dict, item: tuple, scaling: str, spec, hosts: list[int]) -> list[str]:
    rows_out = []
    for n in hosts:
        c = {m: by.get((*item, scaling, n, m)) for m in MODES}
        if not any(c.values()) and not any((*item, scaling, n, m) in by for m in MODES):
            continue
        rows = next((x["rows"] for x in c.values() if x), "?")
        step = [fmt(c[m]["step"]) if c[m] else _failed(by, item, scaling, n, m)
                for m in MODES]
        spreads = " / ".join(_pct(c[m]["spread"]) if c[m] else "-" for m in MODES)
        runs = "; ".join(f"{m[:4]} " + ", ".join(fmt(t) for t in c[m]["runs"])
                         for m in MODES if c[m])
        rows_out.append([n, rows, *step, ratio_cell(c["controller"], c["colocated"]),
                         ratio_cell(c["single"], c["colocated"]), spreads, runs])
    head = ["N", "rows", "single s/step", "colocated s/step", "controller s/step",
            "controller ÷ colocated", "single ÷ colocated",
            "A/A spread single / colocated / controller", "runs (s/step each)"]
    return [f"\n### {spec.title}: {_held(scaling, spec)}\n", *table(head, rows_out)]


def _failed(by: dict, item: tuple, scaling, n, mode) -> str:
    return "FAILED" if (*item, scaling, n, mode) in by else "-"


def phase_table(by: dict, item: tuple, scaling: str, hosts: list[int],
                errors: dict) -> list[str]:
    keys = [(n, m) for n in hosts for m in MODES if (*item, scaling, n, m) in by]
    present = [c for k in keys if (c := by[(*item, scaling, *k)])]
    phases = [p for p in PHASES if any(p in c["phases"] for c in present)]
    head = ["N", "mode", "step", *[SHORT[p] for p in phases], "other", "host share",
            "network share", "wait share", "hosts' step max / spread", "decode iters",
            "compile s/run", "wall s/run", "load"]
    out = ["\nPhases (medians over steady steps, seconds; process 0's, in controller mode host "
           "0's; decode iters summed over the hosts' generate calls):\n", *table(head)]
    for n, m in keys:
        c = by[(*item, scaling, n, m)]
        if c is None:
            err = errors.get((*item, n, m), "").replace("|", "/")[:160]
            out.append(f"| {n} | {m} | FAILED: {err} |" + " |" * (len(head) - 3))
            continue
        sh = c["shares"]
        row = [str(n), m, fmt(c["step"]), *[fmt(c["phases"].get(p, NAN)) for p in phases],
               fmt(c["other"]), *(_pct(sh[k]) for k in ("host", "network", "wait")),
               f"{fmt(c['hosts_max'])} / {fmt(c['hosts_spread'])}",
               fmt(c["decode_iters"], ".0f"), fmt(c["compile"], ".1f"), fmt(c["wall"], ".0f"),
               fmt(c["load"], ".1f")]
        out.append(table_row(row))
    ctrl = [(n, c) for n, m in keys if m == "controller" and (c := by[(*item, scaling, n, m)])]
    if ctrl:
        cphases = [p for p in CONTROLLER_PHASES if any(p in c["controller"] for _, c in ctrl)]
        head = ["N", "host 0 step", "host 0 wait ctrl", *[CTRL[p] for p in cphases],
                "round trips", "round trip s (summed)", "bytes dispatch / gather / scatter"]
        rows = []
        for n, c in ctrl:
            t = c["traffic"]
            row = [str(n), fmt(c["step"]), fmt(c["phases"].get("wait_controller", NAN)),
                   *[fmt(c["controller"].get(p, NAN)) for p in cphases],
                   fmt(t.get("controller/round_trips", NAN), ".0f"),
                   fmt(t.get("controller/round_trip_s", NAN)),
                   " / ".join(_kb(t.get(f"net/{k}_bytes", NAN))
                              for k in ("dispatch", "gather", "scatter"))]
            rows.append(row)
        out += ["\nThe controller's own phases and traffic per step (medians, seconds):\n",
                *table(head, rows)]
    return out


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _kb(x: float) -> str:
    return "n/a" if x != x else f"{x / 1024:.0f} KiB"


def report(results: list, specs: dict, hosts: list[int], scalings: list[str]) -> list[str]:
    """Every table: per workload, strong then weak, step times then phases; then the A/A
    spread of each mode over the grid."""
    by = cells(results)
    errors = {(r.shape, r.workload, r.n, r.mode): r.error for r in results if not r.ok}
    out = []
    for item, spec in specs.items():  # item: (shape name, workload)
        out.append(f"\n## {spec.title}")
        for scaling in scalings:
            out += step_table(by, item, scaling, spec, hosts)
            out += phase_table(by, item, scaling, hosts, errors)
    spreads = mode_spreads(by)
    out.append("\n## A/A noise: each mode against itself (max / min - 1 of an arm's run "
               "medians)\n")
    out += table(["mode", "median over arms", "max over arms", "arms with >= 2 runs"],
                 [[m, f"{100 * spreads[m][0]:.1f}%", f"{100 * spreads[m][1]:.1f}%", spreads[m][2]]
                  for m in MODES if m in spreads])
    return out
