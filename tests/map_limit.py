"""Keep a pytest process's memory mappings under the kernel's limit (`vm.max_map_count`).

An XLA:CPU executable maps its machine code as a few small regions per object file (a TINY
config's engine and train-step programs: ~500-1,000 regions), and it lives as long as the jit
cache that holds it. A worker of the in-process phase keeps the programs of ~700 tests in
the caches of locojax's module-level jits: at 53% of the phase one held 62,546 of the 65,530
mappings Linux allows a process. Past the limit LLVM's JIT fails to map an object and unmaps
what it had, while the object's unwind tables stay registered with libgcc; the next C++
exception in the process (jaxlib throws and catches them inside) then reads an unmapped
address in `_Unwind_Find_FDE`, and the worker dies of SIGSEGV "while running" whatever test
came next (docs/testing.md, "A worker that ran out of mappings").

So between test modules, past half the limit, jax's caches are cleared: the executables are
freed (unmapped and deregistered properly) and the next module compiles, or loads from the
persistent cache, what it needs again.
"""

from __future__ import annotations

import gc

SHARE = 0.5
"""Clear past this share of the limit; the other half is one module's headroom (a TINY
config's engine and train-step programs add ~500-1,000 mappings). The run's summary line
prints each process's highest count at a module boundary, so a module that comes near the
headroom shows there."""

STATE = {"clears": 0, "peak": 0}


def limit() -> int:
    """`vm.max_map_count`, or 0 where it cannot be read (not Linux: nothing is cleared)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def mappings() -> int:
    """This process's memory mappings: the lines of /proc/self/maps."""
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


def relieve() -> bool:
    """Clear jax's caches if this process holds more than `SHARE` of the limit; whether it
    did."""
    cap = limit()
    if not cap:
        return False
    held = mappings()
    STATE["peak"] = max(STATE["peak"], held)
    if held < SHARE * cap:
        return False
    import jax

    jax.clear_caches()
    gc.collect()  # executables that only cycles still held
    STATE["clears"] += 1
    return True


def summary(processes: list[dict]) -> str:
    """One line for the end of the run: each pytest process's clears and peak mappings (of
    the processes that ran a test: xdist's controller runs none, so never checked)."""
    parts = [f"{p['clears']} (peak {p['peak']:,} mappings)" for p in processes
             if p.get("peak")]
    return (f"jax caches cleared near the {limit():,}-mapping limit (tests/map_limit.py), "
            f"per pytest process: " + (", ".join(parts) or "none"))
