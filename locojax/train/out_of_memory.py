"""XLA's "out of device memory", read as an answer rather than a traceback.

An accelerator's compiler refuses a program whose buffers cannot fit the device: XLA:TPU
raises `jax.errors.JaxRuntimeError` with `RESOURCE_EXHAUSTED` from `.compile()` ("... HLO
temporaries (183.19G) exceeds available HBM (15.75G)", or "Ran out of memory in memory space
hbm. Used 20.60G of 15.75G hbm"), before the memory plan has the program's own
`memory_analysis()` to read. The plan (`memory_plan.py`) catches it where it compiles
(`train_step.compile_update`, `Engine.compile`, the reference program) and keeps the program
as `refused`: a `ProgramCost` whose temporaries are the size the compiler said it needed
(`needed_bytes`), or failing that more than the whole device, so the plan does not fit, tries
its next setting and, if none compiles, refuses the run naming what it tried (`MemoryPlanError`).

At run time the same error can still come (the allocator's fragmentation, buffers the plan
does not see); `runtime_message` turns it into one paragraph naming the plan's figures and what
to change. XLA:CPU never raises it (its "device memory" is the host's, unbounded to XLA), so
the CPU tests raise the real exception type with such a message (tests/test_memory_plan_oom.py).

XLA prints sizes with binary prefixes (`HumanReadableNumBytes`: 1G = 2^30 bytes), which is why
a 16 GiB v5e chip reads "15.75G" available.
"""

from __future__ import annotations

import re

import jax

from locojax.train.program_cost import ProgramCost

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
# The compiler's figure for what the program needs: XLA:TPU names its temporaries, or the
# total it tried to use (arguments included, so an upper bound on the temporaries).
_NEEDED = (re.compile(r"temporaries \(([\d.]+)\s*([KMGTP]?)i?B?\)"),
           re.compile(r"[Uu]sed ([\d.]+)\s*([KMGTP]?)i?B? of"))


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is XLA refusing or failing an allocation on the device."""
    return isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error)


def needed_bytes(message: str) -> int | None:
    """The bytes the compiler said the program needs, read from its message; None if it
    gives no figure."""
    for pattern in _NEEDED:
        found = pattern.search(message)
        if found:
            return int(float(found.group(1)) * _UNITS[found.group(2)])
    return None


def refused(name: str, phase: str, error: BaseException, device_memory: int | None,
            held_arguments: int, compile_s: float) -> ProgramCost:
    """A program the compiler refused for want of memory, as the plan counts it: its
    temporaries are the compiler's figure, else one more byte than the whole device (it did
    not fit; by how much is unknown). `ProgramCost.compiled` is None, `refused` True."""
    needed = needed_bytes(str(error))
    if needed is None:
        needed = (device_memory or 0) + 1
    return ProgramCost(name, phase, held_arguments, 0, 0, needed, held_arguments, compile_s,
                       refused=first_line(error))


def first_line(error: BaseException) -> str:
    """The compiler's message, its first line only (the rest is a buffer listing)."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def runtime_message(error: BaseException, plan, step: int | None = None) -> str:
    """What to tell a user whose run ran out of device memory after the plan let it start:
    where, the plan's figures, and what to change."""
    where = f"in step {step + 1}" if step is not None else "while running"
    planned = ""
    if plan is not None and plan.device_memory:
        planned = (f" The memory plan expected a peak of {plan.peak / 1e9:.2f} GB "
                   f"({plan.peak_program.name}) of the {plan.device_memory / 1e9:.2f} GB it "
                   f"counted ({plan.device_source});")
    return (f"the device ran out of memory {where}: {first_line(error)}.{planned} XLA's "
            "allocator needs room the plan does not see (fragmentation, the runtime's own "
            "buffers). Give the plan less to fit with --device-memory-gb (e.g. 90% of the "
            "device), or shrink the step: more --grad-accum, --remat on, --precision bf16, a "
            "smaller --rollout.prompts-per-step or --rollout.max-new-tokens.")
