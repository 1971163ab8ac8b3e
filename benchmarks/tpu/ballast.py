"""The memory plan's peak checked on a device by ballast (issue 55's "peak within 10% of
the plan"), since the device's own peak statistic counts no XLA temporaries there
(`peak_probe`).

A step that runs with B bytes of ballast held beside the run's own buffers needed at most
limit - B at its peak. So, with the run's programs compiled and one step done:

1. ballast limit - plan: the step must run (the plan is not low);
2. ballast limit - 0.9 x plan: the step must run out of memory (the plan is not more than
   10% high). Last, because a step that ran out may leave the run's donated buffers gone.

`check` runs both, prints what it saw and returns the verdict; `qwen3_fit.sh` calls it with
BALLAST=1. A device without a byte limit (XLA:CPU) has nothing to check.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp

from locojax.train import out_of_memory

CHUNK = 1 << 30
"""Ballast is held in 1 GiB buffers (and one remainder): one buffer as large as the free
memory may not find a contiguous range where the same bytes in pieces would."""


def hold(nbytes: int) -> list:
    sizes = [CHUNK] * (nbytes // CHUNK) + ([nbytes % CHUNK] if nbytes % CHUNK else [])
    held = [jnp.zeros(s // 4, jnp.float32) for s in sizes if s >= 4]
    jax.block_until_ready(held)
    return held


def runs_with(step, nbytes: int) -> tuple[bool, str]:
    """Whether `step()` runs with `nbytes` of ballast held; the error's first line if not."""
    held = []
    try:
        held = hold(nbytes)
        step()
        return True, ""
    except Exception as e:  # noqa: BLE001 - only the device's out-of-memory is an answer
        if not out_of_memory.is_out_of_memory(e):
            raise
        return False, str(e).splitlines()[0][:200]
    finally:
        del held
        gc.collect()


def check(step, plan_peak: int, device=None, share: float = 0.9) -> str:
    """The verdict on `plan_peak` (bytes) for this run's `step` (a callable doing one step)."""
    device = device or jax.local_devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if not limit:
        return "ballast: this device reports no byte limit; nothing to check"
    fits, why = runs_with(step, max(limit - plan_peak, 0))
    print(f"ballast {(limit - plan_peak) / 1e9:.2f} GB (the plan's peak free): "
          f"{'ran' if fits else 'ran out: ' + why}", flush=True)
    if not fits:
        return f"ballast: the plan is LOW: a step needs more than its {plan_peak / 1e9:.2f} GB"
    tight = int(limit - share * plan_peak)
    fits, why = runs_with(step, tight)
    print(f"ballast {tight / 1e9:.2f} GB ({share:.0%} of the plan's peak free): "
          f"{'ran' if fits else 'ran out: ' + why}", flush=True)
    if fits:
        return (f"ballast: the plan is more than {1 - share:.0%} high: a step ran in "
                f"{share * plan_peak / 1e9:.2f} GB of its {plan_peak / 1e9:.2f} GB")
    return (f"ballast: the step's peak lies in ({share * plan_peak / 1e9:.2f}, "
            f"{plan_peak / 1e9:.2f}] GB: within {1 - share:.0%} of the plan")
