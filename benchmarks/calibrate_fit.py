"""The fit and the writing half of calibrate_predict.py (see its docstring): from the probes
and the N = 1 runs, the cpu-here profile, the host rates and the arith-var lengths."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path

import numpy as np

from locojax.model import config as model_config
from locojax.predict.devices import shape_key
from locojax.predict.flops import ModelCosts

ROOT = Path(__file__).resolve().parent.parent
PREDICT = ROOT / "locojax" / "predict"
KINDS = ("prefill", "decode_step", "train")


def dumps(obj) -> str:
    """JSON with one line per entry but lists of numbers on one line."""
    return re.sub(r"\[\s*([-\d.,\se+]+?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                  json.dumps(obj, indent=1)) + "\n"


def c(value, unit, origin, source):
    return {"value": float(value), "unit": unit, "origin": origin, "source": source}


# Workloads whose completions are exactly N tokens (--rollout.ignore-eos): N - 1 decode
# iterations per generate call, each over all slots, so the decode phase times one step.
FIXED_LENGTH = ("arith", "gsm8k", "math")


def response_columns(shape, workload: str) -> int:
    """Columns after the prompt in the KV cache and the train batch (bench_modes' swe: two
    turns and one observation, its --multi-turn.max-trajectory-tokens)."""
    if workload == "swe":
        from benchmarks.workloads import SWE_OBS_TOKENS

        return 2 * shape.new_tokens + SWE_OBS_TOKENS
    return shape.new_tokens


def flops_of(point, rec) -> dict:
    """Per program kind: (seconds measured, FLOPs) of one run, where the kind is timed."""
    shape, workload = point[0], point[1]
    cfg = model_config.PRESETS[shape.arch]()
    mc = ModelCosts(cfg, "float32")
    b, g, p, n = rec["prompts"], shape.group, shape.prompt_tokens, shape.new_tokens
    m = response_columns(shape, workload)
    perf = rec["perf"]
    out = {"prefill": (perf["perf/phase/prefill"], mc.prefill(b, p).flops),
           "train": (perf["perf/phase/train"], mc.train_step(b * g, g, p, m).flops)}
    if workload in FIXED_LENGTH:
        out["decode_step"] = (perf["perf/phase/decode"] / (n - 1),
                              mc.decode_step(b * g, p + n - 1).flops)
    return out, f"{shape_key(cfg)}/P{p}-N{n}"


def nonneg_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, b) of t = a + b x by least squares with a, b >= 0: the unconstrained fit if it is
    feasible, else the better of the two boundary fits (b = 0, or a = 0)."""
    cands = []
    if len(set(x)) > 1:
        b, a = np.polyfit(x, t, 1)
        if a >= 0 and b >= 0:
            cands.append((a, b))
    cands += [(float(t.mean()), 0.0), (0.0, max(0.0, float(np.dot(x, t) / np.dot(x, x))))]
    return min(cands, key=lambda ab: float(np.sum((ab[0] + ab[1] * x - t) ** 2)))


def fit_kind(one: list[tuple[float, float]], two: list[tuple[float, float]]) -> dict:
    """t1 = a + x / F1 (a, 1/F1 >= 0) by least squares on the 1-core points, then φ from the
    2-core points: t2 - a = (x / F1)(1 - φ/2), clipped to [0, 1]."""
    x1, t1 = np.array([p[1] for p in one]), np.array([p[0] for p in one])
    a, slope = nonneg_line(x1, t1)
    x2, t2 = np.array([p[1] for p in two]), np.array([p[0] for p in two])
    work = slope * x2
    phi = 0.0
    if np.dot(work, work) > 0:
        phi = float(np.clip(2 * (1 - np.dot(t2 - a, work) / np.dot(work, work)), 0.0, 1.0))
    pred1 = a + slope * x1
    pred2 = a + slope * x2 * ((1 - phi) + phi / 2)
    err = np.concatenate([(pred1 - t1) / t1, (pred2 - t2) / t2])
    return {"a": float(a), "F1": float(1 / slope) if slope > 0 else 1e30, "phi": phi,
            "points": len(one) + len(two), "max_rel_err": float(np.max(np.abs(err))),
            "median_rel_err": float(np.median(np.abs(err)))}


def fits(points: dict, recs: list[dict]) -> dict:
    """Per model shape and prompt/completion shape (`shape_key/P..-N..`), and per model shape
    over all of its runs (the fallback for other P, N)."""
    by: dict[str, dict[str, dict[int, list]]] = {}
    for rec in recs:
        timed, key = flops_of(points[rec["point"]], rec)
        for k in (key, key.split("/")[0]):
            for kind, (t, x) in timed.items():
                by.setdefault(k, {}).setdefault(kind, {1: [], 2: []})[rec["cores"]].append((t, x))
    return {key: {kind: fit_kind(v[1], v[2]) for kind, v in kinds.items() if v[1] and v[2]}
            for key, kinds in by.items()}


def host_rates(points: dict, recs: list[dict], task_of: dict) -> dict:
    """Per-item host rates through the origin (Σ t x / Σ x²) over the 2-core runs: admission
    and batch over all of them, the reward per row per task (`task_of`: workload -> task),
    swe's env time per row and env turn (as `phases.Ctx.env` costs a single-process run: one
    env worker per core it is given, here 1); and the per-step remainder (step minus the
    phases)."""
    two = [r for r in recs if r["cores"] == 2]

    def through_origin(pairs):
        x, t = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
        return float(np.dot(x, t) / np.dot(x, x))

    rows = lambda r: r["prompts"] * points[r["point"]][0].group  # noqa: E731
    task = lambda r: task_of[points[r["point"]][1]]  # noqa: E731
    reward = {}
    for t in sorted({task(r) for r in two}):
        pairs = [(rows(r), r["perf"]["perf/phase/detokenize_reward"]) for r in two
                 if task(r) == t and "perf/phase/detokenize_reward" in r["perf"]]
        if pairs:
            reward[t] = through_origin(pairs)
    env = [(rows(r), r["perf"]["perf/phase/env"]) for r in two
           if task(r) == "swe" and "perf/phase/env" in r["perf"]]
    return {
        "admission_per_prompt": through_origin([(r["prompts"], r["perf"]["perf/phase/admission"])
                                                for r in two]),
        "reward_per_row": reward,
        "env_per_row_turn": {"swe": through_origin(env)} if env else {},
        "batch_per_row": through_origin([(rows(r), r["perf"]["perf/phase/batch"]) for r in two]),
        "step_fixed": statistics.median(
            r["perf"]["perf/step_time"] - sum(v for k, v in r["perf"].items()
                                              if k.startswith("perf/phase/")) for r in two),
    }


def ring_fit(probe: dict) -> tuple[float, float]:
    """(α, β) of t = 2(p-1) α + 2(p-1)/p · m / β from the all-reduce probe's sizes."""
    p = probe["n"]
    m = np.array([float(k) for k in probe["allreduce_s_by_bytes"]])
    t = np.array(list(probe["allreduce_s_by_bytes"].values()))
    intercept, slope = nonneg_line(m, t)
    return float(intercept / (2 * (p - 1))), float(2 * (p - 1) / p / max(slope, 1e-30))


_BY = "benchmarks/predict_probes.py, run by "


def machine_terms(probes: dict, probe_src: str) -> dict:
    """The shared machine's measured terms (locojax/predict/shared_machine.py), where the
    probes ran (a probe measured again by --redo-probes names its own command): the
    over-subscription penalty by process count, a multi-device process's loop iteration by
    device count."""
    out = {}
    if "oversub" in probes:
        o = probes["oversub"]
        run_by = o.get("command") or probe_src.removeprefix(_BY)
        out["oversubscription"] = {
            k: c(v["penalty"], "x fair time-slicing", "measured",
                 f"{k} processes of {o.get('program', 'a jitted MLP forward + backward')} "
                 f"at once on {o['cores']} "
                 f"cores ({'pinned one a core' if int(k) <= o['cores'] else 'unpinned'}, "
                 f"{o['calls']} calls, median of {o.get('rounds', 1)} round(s)), median wall "
                 f"{v['wall']:.3f} s over one process alone on one core "
                 f"({o['alone_1_core']:.3f} s) x max(1, k / cores): `predict_probes.py "
                 f"oversub`, run by {run_by}")
            for k, v in o["by_k"].items()}
    if "multidev" in probes:
        m = probes["multidev"]
        run_by = m.get("command") or probe_src.removeprefix(_BY)
        out["multi_device_iteration_s"] = {
            n: c(v, "s per loop iteration", "measured",
                 f"one process, {n} simulated CPU devices: {_multidev_loop(m)}, per "
                 f"iteration: `predict_probes.py multidev`, run by {run_by}")
            for n, v in m["iteration_s_by_devices"].items()}
    return out


def _multidev_loop(m: dict) -> str:
    """What the multidev probe timed: the engine's decode (now) or a tiny loop (before)."""
    loops = m.get("loops", "400 - 100")
    if loops.startswith("engine"):
        return (f"the engine's decode loop at TINY, 16 rows of 16-token prompts over the "
                f"devices ({loops})")
    return (f"a sharded `while_loop` whose condition reduces over the devices ({loops} "
            f"iterations)")


def write(points: dict, probes: dict, recs: list[dict], command: str, task_of: dict,
          date: str = "") -> None:
    """`date`: when the runs and probes were measured (a refit writes later)."""
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    loads = [r["load"] for r in recs]
    kept = sorted({f"{r['point']} from `{r['session']}`" for r in recs
                   if r.get("session", command) != command})
    others = [r["other_share"] for r in recs  # calibrate_predict's; swe's sandboxes read as other
              if "other_share" in r and not r.get("own_work_escapes")]
    where = (f"`{command}` on {date}, {os.cpu_count()} cores ({platform.processor() or 'cpu'}),"
             f" load {min(loads):.1f}-{max(loads):.1f}"
             + (f", other processes <= {100 * max(others):.1f}% of the machine in each run"
                if others else "")
             + (f" (runs kept from an earlier calibration: {'; '.join(kept)})" if kept else ""))
    probe_src = f"benchmarks/predict_probes.py, run by {where}"
    a2, b2 = ring_fit(probes["allreduce_2"])
    a4, b4 = ring_fit(probes["allreduce_4"])
    f = fits(points, recs)
    fit_json = {}
    for key, kinds in f.items():
        fit_json[key] = {}
        for kind, v in kinds.items():
            src = (f"fitted to {v['points']} N = 1 runs ({kind} phase; 1 and 2 cores) of {where}; "
                   f"relative error of the fit: median {v['median_rel_err']:.0%}, max "
                   f"{v['max_rel_err']:.0%}; no N > 1 run used")
            fit_json[key][kind] = {"fixed_s": c(v["a"], "s per call", "fitted", src),
                                   "flops_per_s": c(v["F1"], "FLOP/s on one core", "fitted", src),
                                   "parallel": c(v["phi"], "share", "fitted", src)}
    fit_json["default"] = fit_json.get(shape_key(model_config.small()), {})
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    na = "not used: cpu-here's program times come from `fits`"
    profile = {
        "name": "cpu-here", "kind": "cpu",
        "peak_flops": {"float32": c(probes["matmul_2"]["matmul_flops_per_s"], "FLOP/s",
                                    "measured", f"f32 2048^3 matmul, {probe_src}")},
        "hbm_bytes": c(ram, "bytes", "measured", "host RAM (sysconf), shared by its processes"),
        "hbm_bandwidth": c(probes["stream"]["copy_bytes_per_s"], "bytes/s", "measured",
                           f"256 MB numpy copy, {probe_src}"),
        "chips_per_host": c(1, "devices", "spec", "bench_modes/bench_placement hosts: "
                            "`locojax launch --devices-per-host 1`"),
        "host_cores": c(os.cpu_count(), "cores", "measured", "os.cpu_count()"),
        "ici_bandwidth": c(probes["stream"]["copy_bytes_per_s"], "bytes/s", "measured",
                           f"in-process copies between simulated devices: {probe_src}"),
        "ici_latency": c(1e-5, "s", "assumed", "in-process hand-off between device threads"),
        "ici_domain": c(1, "devices", "spec", "each simulated host is its own process: every "
                        "cross-host collective goes over gloo (the dcn_* entries)"),
        "ici_topology": "loopback",
        "dcn_bandwidth": c(b2, "bytes/s", "fitted", f"ring all-reduce fit over 4 sizes, 2 "
                           f"processes (no more processes than cores): {probe_src}"),
        "dcn_latency": c(a2, "s", "fitted", f"same fit as dcn_bandwidth: {probe_src}"),
        "dcn_bandwidth_oversubscribed": c(b4, "bytes/s", "fitted", "ring all-reduce fit, 4 "
                                          f"processes on {os.cpu_count()} cores: {probe_src}"),
        "dcn_latency_oversubscribed": c(a4, "s", "fitted", "same fit, 4 processes: "
                                        f"{probe_src}"),
        "collective_algorithm": "ring",
        "matmul_efficiency": c(1.0, "fraction", "assumed", na),
        "hbm_efficiency": c(1.0, "fraction", "assumed", na),
        "loop_iteration_s": c(0.0, "s", "assumed", na + " (the fits' fixed_s per call)"),
        "host_core_speed": c(1.0, "x this machine's core", "spec", "this machine, by definition"),
        "shared_cores": os.cpu_count(),
        "lease_fixed_s": c(probes["ray"]["ray_call_s"], "s per lease", "measured",
                           f"Ray actor call round trip, {probe_src}"),
        "weight_sync_fixed_s": c(probes["ray"]["ray_push_s"], "s per push", "measured",
                                 f"Ray put + actor fetch of {probes['ray']['push_bytes']} bytes "
                                 f"(TINY's f32 weights), {probe_src}"),
        "fits": fit_json,
        "matmul_one_core": c(probes["matmul_1"]["matmul_flops_per_s"], "FLOP/s", "measured",
                             f"taskset -c 0, {probe_src}"),
    }
    profile.update(machine_terms(probes, probe_src))
    (PREDICT / "hardware" / "cpu-here.json").write_text(json.dumps(profile, indent=1) + "\n")

    rates_path = PREDICT / "host_rates.json"
    rates = json.loads(rates_path.read_text())
    h = host_rates(points, recs, task_of)
    src = f"through-origin fit over the 2-core N = 1 runs of {where}"
    rates["admission_per_prompt"] = c(h["admission_per_prompt"], "s per prompt", "measured", src)
    rates["batch_per_row"] = c(h["batch_per_row"], "s per row", "measured", src)
    rates["step_fixed"] = c(h["step_fixed"], "s per step per process", "measured",
                            f"median of step minus its phases, 2-core N = 1 runs of {where}")
    for task, v in h["reward_per_row"].items():
        rates["reward_per_row"][task] = c(v, "s per row", "measured", f"{task} runs: {src}")
    for task, v in h["env_per_row_turn"].items():
        rates["env_per_row_turn"][task] = c(v, "s per row per env turn", "measured",
                                            f"{task} runs' env phase, one env worker: {src}")
    rates["controller_dispatch_s"] = c(probes["ray"]["ray_call_s"], "s per host per controller "
                                       "round trip", "measured", "Ray actor call round trip "
                                       f"(issue 24's controller is a Ray driver): {probe_src}")
    rates_path.write_text(json.dumps(rates, indent=1) + "\n")

    wl_path = PREDICT / "workloads.json"
    wls = json.loads(wl_path.read_text())
    for rec in recs:
        if rec.get("lengths"):
            name = rec["point"]
            wls[name]["completion"] = {"samples": rec["lengths"]}
            wls[name]["source"] = (f"`--dump-rollouts` of the N = 1 calibration run "
                                   f"({len(rec['lengths'])} rows): `{rec['command']}` ({where})")
    wl_path.write_text(dumps(wls))
    print("\n## fits (t(1 core) = a + flops / F1; parallel share φ)\n")
    print("| model shape | kind | a (ms) | F1 (GFLOP/s, 1 core) | φ | points | median / max "
          "rel. err |")
    print("|---|---|---|---|---|---|---|")
    for key, kinds in f.items():
        for kind, v in kinds.items():
            f1 = "inf" if v["F1"] >= 1e29 else f"{v['F1'] / 1e9:.1f}"
            print(f"| {key} | {kind} | {v['a'] * 1e3:.2f} | {f1} | {v['phi']:.2f}"
                  f" | {v['points']} | {v['median_rel_err']:.0%} / {v['max_rel_err']:.0%} |")
    print(f"\nhost rates: {json.dumps(h)}")
    for name, table in machine_terms(probes, "").items():
        print(f"{name}: " + ", ".join(f"{k}: {v['value']:.4g}" for k, v in table.items()))
    print(f"gloo ring fit: 2 processes α {a2 * 1e3:.3f} ms β {b2 / 1e9:.2f} GB/s; "
          f"4 processes α {a4 * 1e3:.3f} ms β {b4 / 1e9:.2f} GB/s")


def main(points: dict, run_probes, run_points, task_of: dict) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", nargs="+", default=["tiny-arith", "tiny-arith-var",
                                                    "placement-arith", "gsm8k", "math", "swe"],
                    choices=sorted(points))
    ap.add_argument("--work-dir", default="/tmp/locojax_calibrate")
    ap.add_argument("--refit", action="store_true", help="no runs: fit the saved ones again")
    ap.add_argument("--no-probes", action="store_true", help="reuse the saved probes")
    ap.add_argument("--redo-probes", nargs="+", default=[], metavar="PROBE",
                    help="with --refit: measure these probes again (e.g. oversub multidev), "
                         "keep the rest and the runs")
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "calibration.json"
    data = json.loads(saved.read_text()) if saved.exists() else {"runs": []}
    if args.redo_probes:
        if not args.refit:
            raise SystemExit("--redo-probes goes with --refit (the runs are kept)")
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        command = " ".join(["benchmarks/calibrate_predict.py", *sys.argv[1:]])
        for name, res in run_probes(args.redo_probes).items():
            res["command"] = f"`{command}` on {date}, load {res['load']:.1f}"
            data["probes"][name] = res
        saved.write_text(json.dumps(data, indent=1))
    if not args.refit:
        if not args.no_probes or "probes" not in data:
            data["probes"] = run_probes()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        for r in data["runs"]:  # the session each kept run came from, for the sources
            r.setdefault("session", f"{data.get('command', '?')}` before `{date}")
        new = run_points(args.points, work, args.timeout, args.sft_steps)
        data["command"] = " ".join(["benchmarks/calibrate_predict.py", *sys.argv[1:]])
        data["date"] = date
        for r in new:
            r["session"] = data["command"]
        data["runs"] = [r for r in data["runs"] if r["point"] not in args.points] + new
        saved.write_text(json.dumps(data, indent=1))
    write(points, data["probes"], data["runs"], data.get("command", "calibrate_predict.py"),
          task_of, date=data.get("date", ""))
    return 0
