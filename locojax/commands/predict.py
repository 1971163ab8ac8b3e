"""`locojax predict`: memory per device, step time per phase for each mode and the best
placement, before launch, from the cost model in locojax/predict (docs/pod_scale.md).

    locojax predict train PRESET [train flags] --cluster PROFILE-CHIPS [predict flags]
    locojax predict workload NAME --model MODEL --cluster PROFILE-CHIPS [predict flags]
    locojax predict paper [--plot-dir DIR]       # the paper's three studies, reproduced

`train ...` takes exactly `locojax train`'s arguments, so the prediction is of the run that
command would make: on this machine `locojax predict train demo ... --cluster cpu-here-2`
predicts `locojax launch --hosts 2 -- train demo ...` (docs/pod_scale.md, "Pairing").

predict flags:
  --cluster PROFILE-CHIPS  v5e-64, tpu-v7x-256, h100-16, cpu-here-4 (default: cpu-here with
                           the run's hosts)
  --hardware FILE          a profile JSON of your own (--cluster may then be just the count)
  --lengths-from PATH      completion lengths from a run dir (rollouts/) or a data jsonl
  --chars-per-token X      for lengths from text (default 4, or 1 for char-level models)
  --decode-chunk K         controller: decode iterations per round trip (default 0: one)
  --kv-read static|actual  decode reads the whole fixed cache (locojax) or the filled part
  --sweep sizes|chips      a sweep over the shipped model sizes or over chip counts
  --plot FILE              where the sweep's plot goes (default predict_sweep.png)
  --constants              every constant the prediction used, with its origin
"""

from __future__ import annotations

import sys

FLAGS = {"--cluster": "", "--hardware": "", "--lengths-from": "", "--chars-per-token": "0",
         "--decode-chunk": "0", "--kv-read": "static", "--sweep": "", "--plot": "",
         "--plot-dir": ""}
SWITCHES = ("--constants",)


def _split(argv: list[str]) -> tuple[dict, list[str]]:
    """predict's own flags out of argv; the rest (the train or workload arguments) kept."""
    own, rest, i = dict(FLAGS), [], 0
    own.update({s: False for s in SWITCHES})
    while i < len(argv):
        a = argv[i]
        key, _, val = a.partition("=")
        if key in FLAGS:
            if not val:
                if i + 1 >= len(argv):
                    raise ValueError(f"{key} needs a value")
                i, val = i + 1, argv[i + 1]
            own[key] = val
        elif a in SWITCHES:
            own[a] = True
        else:
            rest.append(a)
        i += 1
    return own, rest


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    from locojax.predict.hardware import UnknownHardware
    from locojax.predict.spec import UncostableModel

    try:
        own, rest = _split(argv)
        what, rest = rest[0], rest[1:]
        if what == "paper":
            from locojax.predict import paper_report

            print(paper_report.render(own["--plot-dir"] or None))
            return 0
        if what == "train":
            return _train(rest, own)
        if what == "workload":
            return _workload(rest, own)
        raise ValueError(f"unknown target {what!r}: train, workload or paper")
    except (UnknownHardware, UncostableModel, ValueError, FileNotFoundError) as e:
        print(f"locojax predict: {e}", file=sys.stderr)
        return 2


def _train(rest: list[str], own: dict) -> int:
    from locojax.predict import from_train

    run = from_train.parse(rest, own["--cluster"], own["--hardware"], own["--lengths-from"],
                           float(own["--chars-per-token"]), own["--kv-read"])
    cfg = run.cfg
    return _predict(run.ctx, run.source, own, only=cfg.mode if run.explicit_mode else None,
                    placement=getattr(cfg, "placement", None))


def _workload(rest: list[str], own: dict) -> int:
    from locojax.predict import presets, spec

    if not rest:
        raise ValueError(f"workload NAME: one of {', '.join(presets.names())}")
    name, model = rest[0], "qwen3-0.6b"
    if "--model" in rest:
        model = rest[rest.index("--model") + 1]
    from locojax.predict import hardware
    from locojax.predict.phases import Ctx

    wl, env_workers = presets.load(name)
    model_cfg, source = spec.load(model)
    cluster = hardware.parse_cluster(own["--cluster"] or "cpu-here-1", own["--hardware"])
    ctx = Ctx(model_cfg, model, wl, cluster, dtype="bfloat16", kv_read=own["--kv-read"],
              env_workers=env_workers)
    return _predict(ctx, source, own)


def _predict(ctx, source: str, own: dict, only: str | None = None, placement=None) -> int:
    from locojax.predict import memory, modes, placement as place, report

    model_cfg, model, wl, cluster = ctx.cfg, ctx.model_name, ctx.wl, ctx.cluster
    dtype, remat = ctx.dtype, ctx.remat
    print(f"model: {model} ({model_cfg.num_params() / 1e9:.3f}B parameters; {source})")
    print(f"workload: {wl.name}: B {wl.prompts} x G {wl.group} = {wl.rows} rows, P "
          f"{wl.prompt_columns}, N <= {wl.max_new}, completion mean "
          f"{wl.completion.mean:.0f}, longest of the step's rows {wl.decode_steps(wl.rows) + 1:.0f}"
          f" ({wl.completion.source})")
    print(f"cluster: {cluster.describe()} [{cluster.hw.path}]; {dtype}, KV read {ctx.kv_read}")
    plan = memory.fit(ctx)
    if cluster.hw.kind != "cpu":
        ctx.fsdp_chips, ctx.remat = plan.settings["fsdp"], plan.settings["remat"] or remat
    print(plan.format())
    if cluster.hw.kind == "cpu":
        print("  (on this machine `locojax train ... --plan` gives XLA's exact plan)")
    if own["--sweep"]:
        from locojax.predict import sweep

        print(sweep.run(own["--sweep"], ctx, own["--plot"] or "predict_sweep.png",
                        int(own["--decode-chunk"])))
        return 0
    preds = []
    want = lambda m: only in (None, m)  # noqa: E731
    if want("single") and (cluster.hosts == 1 or cluster.shared_cores):
        preds.append(modes.single(ctx))
    if want("controller"):
        preds.append(modes.controller(ctx, int(own["--decode-chunk"])))
    if want("colocated"):
        preds.append(modes.colocated(ctx))
    if cluster.hosts >= 2 and want("disaggregated"):
        f = getattr(placement, "rollout_fraction", 0.75)
        preds.append(place.disaggregated(ctx, f, getattr(placement, "max_staleness", 1)))
    if cluster.hosts >= 2 and want("async"):
        w = getattr(placement, "workers", max(1, cluster.hosts - 1))
        lh = getattr(placement, "learner_hosts", 1)
        if w + lh <= cluster.hosts:
            preds.append(place.async_(ctx, w, lh, getattr(placement, "max_staleness", 1)))
    print("\nstep time per phase (critical path; milliseconds):")
    print(report.phase_table(preds))
    for p in preds:
        print(f"  {p.mode}: {p.layout}" + (f"; {report.staleness_line(p)}" if p.staleness else "")
              + ("".join(f"; {n}" for n in p.notes)))
    if cluster.hosts >= 2:
        adv = place.advise(ctx)
        co = modes.colocated(ctx).step
        print("\nbest placement:")
        if adv.best_da:
            f, p = adv.best_da
            print(f"  disaggregated: rollout fraction {f:g} ({p.layout}): {p.step:.3f} s/step, "
                  f"{co / p.step:.2f}x colocated")
        if adv.best_async:
            w, k, p = adv.best_async
            print(f"  async: {w} workers, k = {k} ({p.layout}): {p.step:.3f} s/step, "
                  f"{co / p.step:.2f}x colocated; {report.staleness_line(p)}")
    if own["--constants"]:
        print("\nconstants used:")
        print("\n".join(f"  {line}" for line in ctx.ledger.lines()))
    return 0
