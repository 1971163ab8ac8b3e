"""One persistent XLA compilation cache for a test run and every process it starts.

Most of the suite's time is XLA compiling the same tiny programs again: in another test, in
the other pytest worker, in each host of a multi-process run, in each Ray worker. With one
cache on disk each program is compiled once per run. A hit is the executable that the same
HLO, compile options, devices and XLA flags compiled to (JAX's cache key), so it cannot
change a bit. Two things XLA:CPU depends on are not in the key:
- the CPU: hence one folder per CPU model and ISA (a clone moved or shared between machines);
- the intra-op thread count: at compile time it only partitions loop fusions along their
  outer dimension, which leaves every element's arithmetic alone; the split of a sum by
  thread count that changes bits (`locojax/float_context.py`) is made when the program runs
  (a 1-thread executable run by a 2-thread process gave the 2-thread process's bits, while
  the two compiled executables differ in those partitions: checked on Zen 4, jax 0.10.2).

`LOCOJAX_TEST_XLA_CACHE=off` compiles everything afresh; `=DIR` puts the cache in DIR.
Must run before jax is imported: JAX reads these settings from the environment then, and the
subprocesses of the tests inherit them.
"""

import hashlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def folder() -> str:
    """.cache/xla/<hash of the CPU model and ISA> in the checkout."""
    from locojax import float_context  # no jax import: safe before the backend is set

    tag = hashlib.sha1(" ".join(float_context.cpu_model()).encode()).hexdigest()[:12]
    return os.path.join(ROOT, ".cache", "xla", tag)


def configure() -> str | None:
    """Point this process and its children at the cache; the folder, or None when off."""
    choice = os.environ.get("LOCOJAX_TEST_XLA_CACHE", "")
    if choice == "off":
        return None
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", choice or folder())
    # Every program, however quick to compile: most of the suite's take under a second.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    return os.environ["JAX_COMPILATION_CACHE_DIR"]


class Tally:
    """This process's compiles: cache hits, misses, and the compile seconds the hits saved
    (JAX's own monitoring events; the children's compiles are not seen here)."""

    def __init__(self):
        self.counts = {"hits": 0, "requests": 0}
        self.seconds = {"saved": 0.0, "compiling": 0.0}  # compiling: misses and loads

    def listen(self) -> None:
        from jax import monitoring

        events = {"/jax/compilation_cache/cache_hits": "hits",
                  "/jax/compilation_cache/compile_requests_use_cache": "requests"}
        durations = {"/jax/compilation_cache/compile_time_saved_sec": "saved",
                     "/jax/core/compile/backend_compile_duration": "compiling"}

        def on_event(event, **_):
            if event in events:
                self.counts[events[event]] += 1

        def on_duration(event, seconds, **_):
            if event in durations:
                self.seconds[durations[event]] += seconds

        monitoring.register_event_listener(on_event)
        monitoring.register_event_duration_secs_listener(on_duration)

    def as_dict(self) -> dict:
        return {**self.counts, **self.seconds}


def summary(tallies: list[dict], where: str | None) -> str:
    """One line for the end of the run: the pytest processes' compiles, summed."""
    if where is None:
        return "XLA compilation cache: off"
    total = {k: sum(t.get(k, 0) for t in tallies) for k in ("hits", "requests", "saved",
                                                            "compiling")}
    return (f"XLA compilation cache {where}: {total['hits']} hits of {total['requests']} "
            f"compiles in the pytest processes, {total['compiling']:.0f} s compiling or "
            f"loading, {total['saved']:.0f} s of compiling saved by the hits (their "
            f"subprocesses not counted)")
