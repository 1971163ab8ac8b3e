"""`locojax train`: a GRPO run (see `locojax.train.config.RunConfig` for every field).

    locojax train demo                         # the embedded default, overridable:
    locojax train demo --steps 80 --mode single
    locojax launch --hosts 2 -- train demo     # colocated over 2 local hosts
    locojax train gsm8k --model DIR --task.data train.jsonl
    locojax train gsm8k --model DIR --task.data train.jsonl --plan-only   # memory plan, exit
    locojax train demo --mode disaggregated --rollout-fraction 0.75   # Ray: 1 learner, 3 workers
    locojax train demo --mode async --max-staleness 4 --workers 3     # Ray: parameter server
    locojax launch --hosts 2 -- train calc-demo   # multi-turn tool use (docs/calc_demo.md)
    locojax train swe --model DIR               # multi-turn bug fixing in the sandbox
"""

from __future__ import annotations

import logging
import sys

import tyro

from locojax import failure, trackers
from locojax.train.config import PRESETS
from locojax.train.placement_config import RAY_MODES


def main(argv: list[str]) -> int:
    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv, prog="locojax train")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:  # a tracker this install lacks stops the run now, not after compiling
        trackers.check(cfg.report_to)
    except ValueError as e:
        print(f"locojax train: {e}", file=sys.stderr)
        return 2
    if cfg.mode in RAY_MODES:
        return _run_ray(cfg)
    from locojax.train import out_of_memory, wiring
    from locojax.train.loop import start

    try:
        joined = wiring.join(cfg.mode, cfg.devices_per_host, cfg.train, cfg.rollout.tp)
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"locojax train: {e}", file=sys.stderr)
        return 2
    host = joined.host
    try:  # prints the memory plan; refuses a run that cannot start or does not fit
        trainer = start(cfg, joined)
    except (ValueError, FileNotFoundError, TypeError) as e:
        if host.is_multihost:  # said last, and this host leaves now (`failure.py`)
            return failure.stop("train", e, 2, host.process_id, host.num_processes,
                                show_traceback=False)
        print(f"locojax train: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if host.is_multihost:
            return failure.stop("train", e, 1, host.process_id, host.num_processes)
        raise
    if trainer is None:  # --plan-only
        return 0
    try:
        final = trainer.run()
    except Exception as e:
        oom = out_of_memory.is_out_of_memory(e)  # past the plan: say so, and what to change
        if oom:
            e = RuntimeError(out_of_memory.runtime_message(e, trainer.memory))
        if host.is_multihost:
            return failure.stop("train", e, 1, host.process_id, host.num_processes,
                                show_traceback=not oom)
        if oom:
            print(f"locojax train: {e}", file=sys.stderr)
            return 1
        raise
    if trainer.is_main:
        _report(final)
    return 0


def _run_ray(cfg) -> int:
    """The Ray modes: one driver process places the hosts (and is the controller)."""
    from locojax.fleet import controller, driver

    mode = controller if cfg.mode == "controller" else driver
    try:
        mode.check_settings(cfg)  # before Ray or any actor starts
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"locojax train: {e}", file=sys.stderr)
        return 2
    try:
        _report(mode.run(cfg))
    except driver.RunFailed as e:  # stopped by the dispatcher, which said why
        print(f"locojax train: {e}", file=sys.stderr)
        return 1
    return 0


def _report(final: dict) -> None:
    if "eval/accuracy" in final:
        before = final.get("before/eval/accuracy")
        prefix = f"{before:.3f} -> " if before is not None else ""
        print(f"held-out accuracy: {prefix}{final['eval/accuracy']:.3f}")
        if "eval/tool_call_rate" in final:  # multi-turn tasks: where the accuracy came from
            fmt = lambda k: "n/a" if k not in final else f"{final[k]:.3f}"  # noqa: E731
            for key, what in (("eval/tool_call_rate", "tool-call rate"),
                              ("eval/accuracy_no_tool", "accuracy without a tool call")):
                was = "" if "before/eval/accuracy" not in final else f"{fmt('before/' + key)} -> "
                print(f"held-out {what}: {was}{fmt(key)}")
