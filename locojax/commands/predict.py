"""`locojax predict`: memory per device, the layout, step time per phase for each mode,
throughput and chip-hours with their range, and the best placement, before launch, from
the cost model in locojax/predict (docs/pod_scale.md).

    locojax predict train PRESET [train flags] --cluster PROFILE-CHIPS [predict flags]
    locojax predict workload NAME --model MODEL --cluster PROFILE-CHIPS [predict flags]
    locojax predict fields                       # which train flags predict reads
    locojax predict calibrate [--out FILE]       # measure this machine (minutes)

`train ...` takes exactly `locojax train`'s arguments, so the prediction is of the run that
command would make: on this machine `locojax predict train demo ... --cluster cpu-here-2`
predicts `locojax launch --hosts 2 -- train demo ...` (docs/pod_scale.md, "Pairing"). Every
train flag is honoured, refused by name, or declared irrelevant (`predict fields`); the
controller's decode chunk is train's `--controller.decode-chunk`.

predict flags:
  --cluster PROFILE-CHIPS  v5e-64, tpu-v7x-256, h100-16, cpu-here-4 (default: cpu-here with
                           the run's hosts)
  --hardware FILE          a profile JSON of your own (--cluster may then be just the count)
  --lengths-from PATH      completion lengths from a run dir (rollouts/) or a data jsonl
  --chars-per-token X      for lengths from text (default 4, or 1 for char-level models)
  --kv-read static|actual  decode reads what locojax's engine reads, or the filled part
  --constants              every constant the prediction used, with its origin

Exit status: 0 a prediction; 2 bad input (named); 3 the run fits in no layout of the
cluster (the smallest that fits is named).
"""

from __future__ import annotations

import sys

FLAGS = {"--cluster": "", "--hardware": "", "--lengths-from": "", "--chars-per-token": "0",
         "--kv-read": "static"}
SWITCHES = ("--constants",)
DOES_NOT_FIT = 3
ENDS = ("faster end", "slower end")  # of the range, for colocated


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
    if argv[0] == "calibrate":  # measure this machine: locojax/commands/predict_calibrate.py
        from locojax.commands import predict_calibrate

        return predict_calibrate.main(argv[1:])
    from locojax.predict.hardware import UnknownHardware
    from locojax.predict.spec import UncostableModel

    try:
        own, rest = _split(argv)
        what, rest = rest[0], rest[1:]
        if what == "fields":
            from locojax.commands import predict_fields

            print(predict_fields.table())
            return 0
        if what == "train":
            return _train(rest, own)
        if what == "workload":
            return _workload(rest, own)
        raise ValueError(f"unknown target {what!r}: train, workload or fields (the paper's "
                         "studies are a benchmark: python -m benchmarks.paper_report)")
    except (UnknownHardware, UncostableModel, ValueError, FileNotFoundError) as e:
        print(f"locojax predict: {e}", file=sys.stderr)
        return 2


def _train(rest: list[str], own: dict) -> int:
    from locojax.commands import predict_train

    run = predict_train.parse(rest, own["--cluster"], own["--hardware"], own["--lengths-from"],
                           float(own["--chars-per-token"]), own["--kv-read"])
    cfg = run.cfg
    return _predict(run.ctx, run.source, own, only=cfg.mode if run.explicit_mode else None,
                    placement=cfg.placement, given=run.given, steps=cfg.steps)


def _workload(rest: list[str], own: dict) -> int:
    """`workload NAME [--model M] [--controller.decode-chunk K]`; anything else is refused."""
    from locojax.predict import hardware, presets, spec
    from locojax.predict.phases import Ctx

    if not rest or rest[0].startswith("-"):
        raise ValueError(f"workload NAME: one of {', '.join(presets.names())}")
    name, opts, args = rest[0], {"--model": "qwen3-0.6b", "--controller.decode-chunk": "0"}, \
        rest[1:]
    while args:
        key, _, val = args.pop(0).partition("=")
        if key not in opts:
            raise ValueError(f"workload: unknown argument {key!r} (workload NAME takes "
                             f"{', '.join(opts)}; a run's flags go to `predict train`)")
        if not val and not args:
            raise ValueError(f"{key} needs a value")
        opts[key] = val or args.pop(0)
    wl, env_workers = presets.load(name)
    model_cfg, source = spec.load(opts["--model"])
    cluster = hardware.parse_cluster(own["--cluster"] or "cpu-here-1", own["--hardware"])
    ctx = Ctx(model_cfg, opts["--model"], wl, cluster, dtype="bfloat16",
              kv_read=own["--kv-read"], env_workers=env_workers,
              decode_chunk=int(opts["--controller.decode-chunk"]))
    return _predict(ctx, source, own)


def _header(ctx) -> None:
    model_cfg, wl, cluster = ctx.cfg, ctx.wl, ctx.cluster
    print(f"model: {ctx.model_name} ({model_cfg.num_params() / 1e9:.3f}B parameters)")
    print(f"workload: {wl.name}: B {wl.prompts} x G {wl.group} = {wl.rows} rows, P "
          f"{wl.prompt_columns}, N <= {wl.max_new}, completion mean "
          f"{wl.completion.mean:.0f}, longest of the step's rows {wl.decode_steps(wl.rows) + 1:.0f}"
          f" ({wl.completion.source})")
    print(f"cluster: {cluster.describe()} [{cluster.hw.path}]; {ctx.dtype}, KV read "
          f"{ctx.kv_read}")


def _predict(ctx, source: str, own: dict, only: str | None = None, placement=None,
             given=None, steps: int = 0) -> int:
    from locojax.commands import predict_report as report
    from locojax.predict import layout

    _header(ctx)
    print(f"  (model config: {source})")
    given = given or layout.Given()
    choice = layout.choose(ctx, given)
    print(report.memory_text(choice.plan))
    if ctx.cluster.hw.is_cpu:
        print("  (on this machine `locojax train ... --plan-only` gives XLA's exact plan)")
    elif not choice.fits:
        print(f"locojax predict: {report.refusal(choice, ctx, given)}", file=sys.stderr)
        return DOES_NOT_FIT
    else:
        print(f"layout: {choice.describe()}: the fastest of {choice.tried} that fit (fixed by "
              f"the command: {given.describe()})")
        if report.wave_note(choice):
            print(f"  {report.wave_note(choice)}")
    ctx = choice.ctx
    _modes(ctx, only, placement, steps)
    if own["--constants"]:
        print("\nconstants used (origin [source]):")
        print("\n".join(f"  {line}" for line in report.constants(ctx.ledger)))
    return 0


def _modes(ctx, only, placement, steps: int) -> None:
    from locojax.commands import predict_report as report
    from locojax.predict import uncertainty
    from locojax.predict import placement as place

    preds = place.predict_modes(ctx, only, placement)
    print("\nstep time per phase (critical path; milliseconds):")
    print(report.phase_table(preds))
    for p in preds:
        print(f"  {p.mode}: {p.layout}" + (f"; {report.staleness_line(p)}" if p.staleness else "")
              + ("".join(f"; {n}" for n in p.notes)))
    rng = uncertainty.step_range(ctx, lambda c: place.predict_modes(c, only, placement))
    print(f"\nthroughput (in brackets: the range with every assumed or fitted constant from "
          f"{uncertainty.LOW:.2g}x to {uncertainty.HIGH:.2g}x; {len(rng.constants)} such "
          "constants):")
    print("\n".join(report.throughput_lines(ctx, preds, rng, steps)))
    if len(rng.nominal) > 1:
        print("verdicts that flip in that range: " + ("; ".join(rng.flips) or "none"))
    if ctx.cluster.hosts >= 2:
        _advice(ctx, rng)


def _advice(ctx, rng) -> None:
    """The best DA fraction and async workers and k, and what they are at the ends of the
    range (colocated's: the constants that make colocated faster, then slower)."""
    from locojax.commands import predict_report as report
    from locojax.predict import modes, uncertainty
    from locojax.predict import placement as place

    adv = place.advise(ctx)
    co = modes.colocated(ctx).step
    ends = [place.advise(uncertainty.at(ctx, s)) for s in rng.ends.get("colocated", ())]
    print("\nbest placement (in brackets: the best at the ends of colocated's range):")
    if adv.best_da:
        f, p = adv.best_da
        alt = "; ".join(f"{end}: {e.best_da[0]:g}" for end, e in zip(ENDS, ends) if e.best_da)
        print(f"  disaggregated: rollout fraction {f:g} ({alt}) ({p.layout}): {p.step:.3f} "
              f"s/step, {co / p.step:.2f}x colocated")
    if adv.best_async:
        w, k, p = adv.best_async
        alt = "; ".join(f"{end}: {e.best_async[0]} workers, k = {e.best_async[1]}"
                        for end, e in zip(ENDS, ends) if e.best_async)
        print(f"  async: {w} workers, k = {k} ({alt}) ({p.layout}): {p.step:.3f} s/step, "
              f"{co / p.step:.2f}x colocated; {report.staleness_line(p)}")
