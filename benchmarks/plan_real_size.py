"""Real sizes, planned: the memory plan of a real config's run, compiled only, per device.

    python -m benchmarks.plan_real_size qwen3-1.7b --fsdp 8 --rollout-tp 8
    python -m benchmarks.plan_real_size llama-3.2-1b-instruct            # data parallel

Nothing runs and no weight exists: the run's programs (train step, rollout and evaluation
prefill and decode) are compiled from abstract shapes on 8 simulated CPU devices, with the
`gsm8k` preset's shapes (32 prompts x G 8 = 256 rows, 256 prompt + 512 new tokens, evaluation
batches of 64), bf16 compute over f32 master weights and Adam state, and planned against
--device-memory-gb (16: a TPU v5e chip). The config is a published config.json
(tests/data/hf_configs.json). FSDP is the learner's rules='train_fsdp' over a
{data, fsdp} mesh, tensor-parallel rollout the engine's ROLLOUT_TP over {data, tensor}
(`--train.mesh data=D,fsdp=F` and `--rollout.tp N` in `locojax train`).

`--remat auto` and `--grad-accum 0` (the defaults) let the plan choose as a run's would
(`plan_fit.fit`): each escalation compiles the train step again. XLA:CPU compiles what an
accelerator would compile otherwise (no bf16 dot, so bf16 operands get f32 copies), so the
figures are CPU's; docs/real_size.md has them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from benchmarks import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "tests", "data", "hf_configs.json")
DEVICES = 8


def published(name: str) -> dict:
    """The published config.json fields of `name` (a key of tests/data/hf_configs.json)."""
    with open(CONFIGS) as f:
        configs = json.load(f)
    if name not in configs:
        raise SystemExit(f"{name!r} is not in {CONFIGS}: one of {', '.join(sorted(configs))}")
    return configs[name]


def real_size_plan(name: str, fsdp: int = 1, rollout_tp: int = 1, remat: str = "auto",
                   grad_accum: int = 0, device_memory_gb: float = 16.0, evaluate: bool = True):
    """The `MemoryPlan` of `locojax train gsm8k` on config `name` over the first DEVICES
    devices (jax must already have that many): train mesh {data: DEVICES / fsdp, fsdp},
    rollout mesh {data: DEVICES / rollout_tp, tensor: rollout_tp}."""
    import jax

    from locojax.engine.engine import Engine
    from locojax.engine.sampling import SamplingConfig
    from locojax.model import hf_config
    from locojax.model.sharding import RULES, make_mesh
    from locojax.rl import batch as batch_lib
    from locojax.rl import train_state
    from locojax.train import memory_plan
    from locojax.train.config import gsm8k_qwen3

    devices = jax.devices()[:DEVICES]
    if len(devices) < DEVICES or DEVICES % fsdp or DEVICES % rollout_tp:
        raise ValueError(f"needs {DEVICES} devices, split by fsdp={fsdp} and tp={rollout_tp}")
    cfg = hf_config.config_from_dict(published(name), name, param_dtype="float32",
                                     compute_dtype="bfloat16")
    run = gsm8k_qwen3()
    rules = "train_fsdp" if fsdp > 1 else "train_dp"
    learner = dataclasses.replace(run.learner_config(), remat=remat == "on",
                                  grad_accum=grad_accum, rules=rules)
    train_mesh = make_mesh({"data": DEVICES // fsdp, "fsdp": fsdp}, devices)
    rollout_mesh = make_mesh({"data": DEVICES // rollout_tp, "tensor": rollout_tp}, devices)
    engine = Engine(cfg, mesh=rollout_mesh,
                    rules=RULES["rollout_tp" if rollout_tp > 1 else "rollout_replicated"])
    state = train_state.abstract(cfg, learner.optim, train_mesh, rules)
    ref = state.params if run.algo.beta > 0 else None
    p, n, g = run.rollout.max_prompt_tokens, run.rollout.max_new_tokens, run.group_size
    rows = run.rollout.prompts_per_step * g
    batch = batch_lib.abstract(rows, p + n, train_mesh, RULES[rules],
                               batch_lib.SharedPrefix(p, g))
    stop = (cfg.vocab_size - 1,)  # any id: stop tokens do not change a program's shapes
    sampling = SamplingConfig(max_new_tokens=n, temperature=run.rollout.temperature,
                              stop_token_ids=stop, pad_token_id=0)
    shapes = [memory_plan.EngineShape("rollout", run.rollout.prompts_per_step, p, g, sampling)]
    if evaluate:
        greedy = dataclasses.replace(sampling, temperature=0.0)
        shapes.append(memory_plan.EngineShape("eval", run.eval.batch_size, p, 1, greedy))
    return memory_plan.plan(cfg, learner, state, batch, ref, train_mesh, engine, shapes,
                            "bf16", device_memory_gb, auto_remat=remat == "auto")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a key of tests/data/hf_configs.json, e.g. qwen3-1.7b")
    ap.add_argument("--fsdp", type=int, default=1, help="F of the train mesh (1: data parallel)")
    ap.add_argument("--rollout-tp", type=int, default=1, help="tensor-parallel rollout ways")
    ap.add_argument("--remat", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--grad-accum", type=int, default=0, help="0: automatic")
    ap.add_argument("--device-memory-gb", type=float, default=16.0)
    ap.add_argument("--no-eval", action="store_true", help="plan without the eval shape")
    args = ap.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    print(harness.command_line())
    print(harness.header("plan_real_size"))
    t0 = time.perf_counter()
    plan = real_size_plan(args.model, args.fsdp, args.rollout_tp, args.remat, args.grad_accum,
                          args.device_memory_gb, not args.no_eval)
    print(plan.format())
    print(f"planned in {time.perf_counter() - t0:.0f} s; "
          + ("fits" if plan.fits else "DOES NOT FIT; settings that shrink it:\n  "
             + "\n  ".join(plan.hints())))
    print(f"load average at end {harness.loads()}")


if __name__ == "__main__":
    main()
