"""The analytic memory plan (`locojax/predict/memory.py`): it reads the train step's own rules
(`locojax/train/train_memory.py`) rather than restating them, sizes a multi-turn run's cache
and batch from the whole trajectory as the compiled plan does, and its planner's choices.
"""

import dataclasses
import json
import pathlib

import jax
import pytest

from benchmarks.paper import memory_fit
from locojax.model import config, decoder
from locojax.predict import hardware, memory, spec
from locojax.predict.phases import Ctx
from locojax.predict.workload import Lengths, Workload
from locojax.train import train_memory


PUBLISHED = pathlib.Path(__file__).parent / "data" / "hf_configs.json"
QWEN = ["demo", "--model", "qwen3-0.6b", "--rollout.max-prompt-tokens", "256",
        "--rollout.max-new-tokens", "512", "--algo.group-size", "8", "--precision", "bf16",
        "--remat", "on"]
VALIDATION = {  # the shapes predict was validated at on a TPU v5e (issue 58)
    "smollm2-135m real-demo": ["real-demo", "--rollout.max-prompt-tokens", "48"],
    "qwen3-0.6b 32 rows": QWEN + ["--rollout.prompts-per-step", "4"],
    "qwen3-0.6b 32 rows beta": QWEN + ["--rollout.prompts-per-step", "4", "--algo.beta", "0.04"],
    "qwen3-0.6b 128 rows": QWEN + ["--rollout.prompts-per-step", "16"],
}


def _plans_account(run):
    """The memory plan's analytic account of `run` as `memory_plan.plan` builds it for one
    device, without compiling: held, the train state's (`train_state.abstract`, the reference
    a copy of its params); the engine's cache (`KVCache.empty` at the engine's slots); the
    train step's `expected_train_temporaries` of the run's batch (`loop.plan_memory`'s)."""
    from locojax.model.attention import KVCache
    from locojax.model.sharding import make_mesh
    from locojax.rl import train_state
    from locojax.rl.batch import SharedPrefix
    from locojax.rl.config import AlgoConfig, LearnerConfig
    from locojax.train.program_cost import device_bytes

    # f32 masters whatever the config's torch_dtype, as `build._dtypes` loads them.
    cfg = dataclasses.replace(run.ctx.cfg, param_dtype="float32", compute_dtype=run.ctx.dtype)
    wl = run.ctx.wl
    state = train_state.abstract(cfg, run.cfg.optim, make_mesh({"data": 1}, jax.devices()[:1]))
    held = {"params": device_bytes(state.params), "optimizer": device_bytes(state.opt_state),
            "reference": device_bytes(state.params) if wl.beta else 0}
    p, g = run.cfg.rollout.max_prompt_tokens, run.cfg.algo.group_size
    slots = p + run.cfg.rollout.max_new_tokens - 1  # `engine.generate_slots`
    cache = jax.eval_shape(lambda: KVCache.empty(cfg, wl.rows, slots))
    learner = LearnerConfig(algo=AlgoConfig(group_size=g, beta=wl.beta), grad_accum=1,
                            remat=run.cfg.remat == "on")
    train = train_memory.expected_train_temporaries(
        cfg, learner, wl.rows, p + run.cfg.rollout.max_new_tokens, 1, "tpu",
        SharedPrefix(p, g), held["params"])
    return train_memory.Account(held, {"KV cache": device_bytes(cache)}, train)


@pytest.mark.parametrize("name", list(VALIDATION))
def test_predict_is_the_plans_analytic_account_at_the_validation_shapes(name, tmp_path):
    """One memory account (issue 58): predict's per-device memory at the validation shapes
    (one v5e chip, no sharding) is the plan's analytic account, held, rollout and train step
    each within 10% (the bound the issue sets: the terms are the same functions of the same
    shapes, so only the KV cache's block rounding and the optimizer's 8 bytes of step counts
    separate them). Predict once restated the step and left out the embedding gradient's
    partial and compute copy, and counted the reference in the compute dtype."""
    from locojax.commands import predict_train

    argv = list(VALIDATION[name])
    if argv[0] == "real-demo":  # SmolLM2-135M-Instruct's published config, no checkpoint
        published = json.loads(PUBLISHED.read_text())["smollm2-135m-instruct"]
        (tmp_path / "config.json").write_text(json.dumps(published))
        argv += ["--model", str(tmp_path)]
    run = predict_train.parse(argv, "v5e-1")
    remat = run.cfg.remat == "on"
    plan = memory.plan_for(run.ctx, fsdp=1, mp=1, grad_accum=1, remat=remat)
    ours = dataclasses.replace(plan.account, offloaded=())
    theirs = _plans_account(run)
    for phase in ("held", "rollout", "train"):
        a, b = (sum(getattr(x, phase).values()) for x in (ours, theirs))
        assert a == pytest.approx(b, rel=0.10), (phase, a, b)
    assert ours.peak == pytest.approx(theirs.peak, rel=0.10)


def test_logits_follow_the_decoders_chunking_rule():
    """SMALL's canonical batch (128 rows x 64 targets x V 4096, 134 MB of f32 logits) stays
    whole under the decoder's LOGITS_WHOLE_BYTES (256 MiB); the predictor once chunked it at
    64 MiB, the decoder's chunk size, and so disagreed with the program it models."""
    cfg = config.small()
    wl = Workload("w", 16, 8, 32, 64, Lengths.fixed(64, "test"))
    ctx = Ctx(cfg, "small", wl, hardware.parse_cluster("cpu-here-1"), dtype="float32")
    plan = memory.plan_for(ctx, fsdp=1, mp=1, grad_accum=1, remat=False)
    assert 128 * 64 * cfg.vocab_size * 4 <= decoder.LOGITS_WHOLE_BYTES
    assert plan.parts["logits"] == 5 * 128 * 64 * cfg.vocab_size * 4


def _ctx(model, cluster, rows=(128, 16)):
    cfg, _ = spec.load(model)
    wl = Workload("w", rows[0], rows[1], 256, 1024, Lengths.fixed(512, "test"))
    return Ctx(cfg, model, wl, hardware.parse_cluster(cluster))


def test_small_model_fits_unsharded_and_405b_needs_sharding():
    small = memory_fit(_ctx("qwen3-0.6b", "v7x-8"))
    assert small.fits and small.settings["fsdp"] == 1
    big = memory_fit(_ctx("llama-3.1-405b", "v7x-256"))
    # 18 bytes of train state a parameter (7.3 TB) cannot sit on one 192 GiB chip.
    assert big.settings["fsdp"] >= 64 and big.settings["mp"] > 1
    assert big.parts["params"] + big.parts["optimizer"] < 192 * 2 ** 30


def test_the_cache_and_the_train_step_are_never_counted_together():
    """The trainer frees the engine's cache before the train step (`Engine.release_cache`):
    the peak is the held state plus the larger of the two phases, not their sum."""
    p = memory.plan_for(_ctx("qwen3-4b", "v5e-8"), fsdp=8, mp=8, grad_accum=32, remat=True)
    rollout = p.parts["KV cache"]
    train = sum(p.account.train.values())
    held = sum(p.parts.values()) - sum(p.account.rollout.values()) - train
    assert rollout > 0 and train > 0
    assert p.peak == pytest.approx(held + max(sum(p.account.rollout.values()), train),
                                   rel=1e-12)
    assert p.peak < sum(p.parts.values())


def test_multi_turn_is_sized_from_the_trajectory_as_the_compiled_plan_is(tmp_path,
                                                                        monkeypatch):
    """A small calc (multi-turn) run, planned by `locojax train --plan-only`'s compiles: the
    predictor's KV cache is the engine's, byte for byte (both count rows x the engine's
    slots, `extend.slots_needed`, of f32 keys and values), and its train columns are the
    compiled batch's: the whole trajectory, not one turn's cap (the bug of issue 37, which
    sized both from the per-turn N)."""
    from locojax.commands import predict_train
    from locojax.train import memory_plan, wiring
    from locojax.train.loop import start

    argv = ["calc-demo", "--mode", "single", "--rollout.prompts-per-step", "4",
            "--algo.group-size", "2", "--multi-turn.max-turns", "3", "--eval.every", "0",
            "--steps", "1", "--no-progress", "--no-tensorboard"]
    devices = len(jax.devices())  # the session's simulated CPU devices, one row each
    run = predict_train.parse(argv, f"cpu-here-{devices}")
    seen = {}
    real_plan = memory_plan.plan

    def spy(*args, **kw):
        seen["batch"] = args[3]
        seen["plan"] = real_plan(*args, **kw)
        return seen["plan"]

    monkeypatch.setattr(memory_plan, "plan", spy)
    cfg = dataclasses.replace(run.cfg, plan_only=True, run_dir=str(tmp_path / "run"))
    assert start(cfg, wiring.join("single")) is None
    compiled, wl = seen["plan"], run.ctx.wl
    predicted = memory.plan_for(run.ctx, fsdp=1, mp=1, grad_accum=1, remat=False)
    assert seen["batch"].tokens.shape[0] == devices
    assert wl.turns == 3 and wl.response_columns > wl.max_new
    # The compiled cache of one device also holds the validity mask of the other devices'
    # rows (replicated: one bool per row and slot) and the write index (4 bytes): beyond the
    # predictor's count by exactly those, whole bytes, no rounding.
    slots = _engine_slots(wl)
    others = (devices - 1) * (wl.rows // devices) * slots
    assert compiled.caches["rollout"] - predicted.parts["KV cache"] == others + 4
    assert wl.prompt_columns + wl.response_columns == seen["batch"].tokens.shape[1]
    # And the compiled plan's analytic account (`MemoryPlan.analytic`) is predict's, held
    # and train step term by term, byte for byte: the same functions of the same shapes.
    ours, theirs = predicted.account, compiled.analytic
    assert (ours.held, ours.train) == (theirs.held, theirs.train)


def _engine_slots(wl) -> int:
    from locojax.engine.extend import slots_needed
    from locojax.model.attention import KVCache

    n, block = KVCache.blocks(slots_needed(wl.prompt_columns, wl.max_new, wl.turns,
                                           1 + wl.obs_tokens))
    return n * block


def test_the_swe_workload_is_sized_from_its_trajectory_and_gets_remat():
    """The issue's figure: swe-agent (8 turns of <= 512 tokens, 512-token observations, P
    2048) at Qwen3-0.6B on 8 v5e chips holds 35.7 GB of bf16 cache per chip (32 rows x 9,728
    slots x 114,688 bytes, plus a validity byte a slot), not one turn's 9.4 GB; and on 64 v7x
    chips the trajectory's activations need remat, which one turn's columns would not."""
    from locojax.predict import presets

    wl, workers = presets.load("swe-agent")
    cfg, _ = spec.load("qwen3-0.6b")

    def fitted(workload, cluster):
        return memory_fit(Ctx(cfg, "qwen3-0.6b", workload, hardware.parse_cluster(cluster),
                              env_workers=workers))

    cache = fitted(wl, "v5e-8").parts["KV cache"]
    assert 35.6e9 < cache < 35.8e9, cache
    one_turn = dataclasses.replace(wl, turns=1, obs_tokens=0, trajectory=0)
    assert fitted(wl, "v7x-64").settings["remat"]
    assert not fitted(one_turn, "v7x-64").settings["remat"]
