"""The settings a refused memory plan suggests: for each buffer that matters, the flags that
shrink it, biggest first (`MemoryPlan.hints`, printed by `MemoryPlan.check`)."""

from __future__ import annotations

from locojax.model import decoder
from locojax.train.program_cost import size


def hints(plan) -> list[str]:
    """Settings that shrink the buffers that matter (>= 5% of the peak), in this order."""
    st, e = plan.settings, plan.expected
    acts, logits = e.get("activations", 0), e.get("logits", 0)
    cache = max(plan.caches.values(), default=0)
    state = plan.held.get("params", 0) + plan.held.get("optimizer", 0) + e["gradients"]
    found = []  # (bytes it acts on, hint)
    found.append((acts + logits, f"--grad-accum N: N micro-batches instead of "
                                 f"{st['grad_accum']} of {st['rows_per_micro']} rows per "
                                 f"device divide the activations and logits "
                                 f"({size(acts + logits)}) by ~N"))
    if not st["remat"]:
        found.append((acts, f"--remat on: keep only each layer's input for the backward "
                            f"(activations {size(acts)})"))
    if st["logprob_chunk"] == 0 and logits > 3 * decoder.LOGITS_WHOLE_BYTES:
        found.append((logits, f"--logprob-chunk -1: chunk the logits ({size(logits)})"))
    if st["precision"] == "f32":
        found.append((acts + cache, "--precision bf16: bf16 activations and KV cache; "
                                    "master weights and optimizer stay f32 (on CPU its "
                                    "bf16 embedding copy costs more than it saves)"))
    if st["cache_dtype"] == "float32":
        found.append((cache // 2, f"--rollout.cache-dtype bf16: a bf16 KV cache, half the "
                                  f"{size(cache)} (attention still accumulates in f32)"))
    found.append((cache, f"--rollout.waves N: the rollout as N generates one after another, "
                         f"one wave's KV cache ({size(cache)} now) at a time"))
    found.append((cache, f"a smaller --rollout.prompts-per-step, --rollout.max-new-tokens "
                         f"or --eval.batch-size (KV cache {size(cache)})"))
    if plan.held.get("reference", 0):
        found.append((plan.held["reference"], f"--algo.beta 0: no reference copy "
                                              f"({size(plan.held['reference'])})"))
    found.append((state, fsdp_hint(plan, state)))
    tp = tp_hint(plan, cache)
    if tp:
        found.append((st["rollout_copy"] + cache, tp))
    # A program XLA refused has no analysis of its own: its figure is the compiler's
    # total, so the buffers that matter are measured against what the plan counts.
    scale = (sum(plan.held.values()) + sum(e.values()) if plan.refused else plan.peak)
    return [h for b, h in found if b >= 0.05 * scale]

def fsdp_hint(plan, state: int) -> str:
    """`--train.mesh` with the fewest FSDP ways, over this run's devices, whose saving
    closes the gap (all of them if none does)."""
    st = plan.settings
    n, now = st["devices"], st["fsdp"]
    what = (f"shard params, gradients and optimizer state ({size(state)} per device) over "
            "`fsdp`")
    if n == 1:
        return (f"--train.mesh data=D,fsdp=F on D x F devices (this run has 1): {what}, "
                f"{size(state)} / F each")
    ways = [f for f in range(now + 1, n + 1) if n % f == 0]
    if not ways:
        return (f"more devices: this run already shards over all {n} (--train.mesh "
                f"data=1,fsdp={n}); {what}")
    gap = plan.peak - (plan.device_memory or plan.peak)
    f = next((f for f in ways if state * (1 - now / f) >= gap), ways[-1])
    return (f"--train.mesh data={n // f},fsdp={f}: {what}, {size(state * now / f)} each "
            f"instead of {size(state)}")

def tp_hint(plan, cache: int) -> str | None:
    """`--rollout.tp N` over the engine's devices (this host's), when the KV heads
    split N ways."""
    st = plan.settings
    n = st["rollout_devices"]
    ways = [t for t in range(st["rollout_tp"] + 1, n + 1)
            if n % t == 0 and st["kv_heads"] % t == 0]
    if not ways:
        return None
    t = ways[-1]
    return (f"--rollout.tp {t}: shard the engine's weights and KV cache ({size(cache)}) by "
            f"heads over {t} of this host's devices")
