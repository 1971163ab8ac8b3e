"""Memory per device, for hardware that is not here: the memory plan's own analytic account
(`train_memory.Account`; `locojax train`'s plan is the same account plus XLA's compiled
figures, `MemoryPlan.analytic`) built from the target's shapes by the plan's functions, and
the settings that make a run fit. What it counts, and why, is in train_memory.py; here only
what a target adds: FSDP over `fsdp` chips shares the held state, the KV cache is the
engine's (`extend.slots_needed` slots, rounded up to whole blocks as `KVCache.empty`
allocates them: a multi-turn task's whole conversation) over tensor parallelism `mp`, the
engine's copy of the weights exists where it reads them in another layout (tp or FSDP) or
merges LoRA's adapters, and with `--offload auto` a plan that does not fit keeps the
reference, then AdamW's moments, in host memory (`Account.offload`; the copies' time over
the host link is not costed). `layout.py` times every plan that fits 90% of HBM and takes
the fastest. tests/test_predict_memory.py holds predict within 10% of the plan's account at
the validation shapes.
"""

from __future__ import annotations

import dataclasses
import functools

from locojax.engine.extend import slots_needed
from locojax.model import lora
from locojax.model.attention import KVCache
from locojax.predict.phases import Ctx
from locojax.rl.batch import SharedPrefix
from locojax.rl.config import AlgoConfig, LearnerConfig
from locojax.train import train_memory

HEADROOM = 0.9  # of HBM: what XLA and the runtime keep for themselves


@dataclasses.dataclass
class Plan:
    settings: dict
    account: train_memory.Account  # bytes per device
    hbm: float

    @property
    def parts(self) -> dict[str, float]:
        a = self.account
        return {**a.held, **a.rollout, **a.train}

    @property
    def peak(self) -> float:
        return self.account.peak

    @property
    def peak_phase(self) -> str:
        return self.account.peak_phase

    @property
    def fits(self) -> bool:
        return self.peak <= HEADROOM * self.hbm


@functools.lru_cache(maxsize=1024)
def _train_terms(cfg, learner: LearnerConfig, rows: int, columns: int, chips: int,
                 platform: str, prefix: SharedPrefix, param_bytes: int) -> dict[str, int]:
    """`expected_train_temporaries`, kept: a layout search asks for the same terms often."""
    return train_memory.expected_train_temporaries(cfg, learner, rows, columns, chips, platform,
                                                   prefix, param_bytes)


def plan_for(ctx: Ctx, fsdp: int, mp: int, grad_accum: int, remat: bool) -> Plan:
    wl = ctx.wl
    # As the run's builder loads the model (`build._dtypes`): f32 masters whatever the
    # checkpoint's dtype, the compute dtype from --precision.
    cfg = dataclasses.replace(ctx.cfg, param_dtype="float32", compute_dtype=ctx.dtype)
    held = dict(train_memory.held_bytes(cfg, fsdp, wl.beta > 0))
    p = cfg.num_params()
    rollout = {}
    n, block = KVCache.blocks(slots_needed(wl.prompt_columns, wl.max_new, wl.turns,
                                           1 + wl.obs_tokens))
    groups = max(1.0, ctx.cluster.chips / mp)  # each row's keys and values, and its validity
    rollout["KV cache"] = int(wl.rows / groups * n * block * (ctx.mc.kv_bytes_per_token() / mp
                                                               + 1))
    if lora.enabled(cfg):  # the sampler merges the adapters into f32 weights of its own
        rollout["merged weights"] = 4 * p // mp
    elif mp > 1 or fsdp > 1:  # another layout than training's: the plan's rollout copy
        rollout["rollout's copy of the weights"] = 4 * p // mp
    learner = LearnerConfig(algo=AlgoConfig(group_size=wl.group, beta=wl.beta,
                                            num_minibatches=ctx.minibatches),
                            grad_accum=grad_accum, remat=remat,
                            rules="train_fsdp" if fsdp > 1 else "train_dp")
    platform = ctx.cluster.hw.platform
    rows = max(wl.rows, learner.rows_multiple)
    columns = wl.prompt_columns + wl.response_columns  # multi-turn: the whole trajectory
    train = _train_terms(cfg, learner, rows, columns, ctx.cluster.chips, platform,
                         SharedPrefix(wl.prompt_columns, wl.group), held["params"])
    account = train_memory.Account(held, rollout, dict(train))
    hbm = float(ctx.cluster.hw.hbm_bytes.value)
    if ctx.offload:
        account = account.offload(HEADROOM * hbm)
    settings = {"fsdp": fsdp, "mp": mp, "grad_accum": grad_accum, "remat": remat,
                "dtype": ctx.dtype}
    return Plan(settings, account, hbm)

