"""The cyclic garbage collector's threshold for locojax's own processes: the CLI (and so
every host `launch` starts) and each Ray actor (`fleet.actors.setup_process`).

Tracing and lowering a program builds millions of objects that live until the trace is
done. At CPython's default threshold the collector runs every 700 net allocations, walking
the young objects, and as often as every 70,000 the whole heap (every jaxpr, module and
import). `perf record -a` over a warm-cache two-host `launch ... train demo` put
`gc_collect_main` and its visitors at 7% of the samples, 9% of the busy ones. At
`THRESHOLD` a warm 3-step `train demo` took 5.6 s of wall time where it took 6.4 s (means
of three interleaved pairs); a cold one, bound by XLA's compiles, changed within its noise;
the test suite's in-process workers ran 1.09x faster on compile-heavy modules, and no faster
over a whole phase, where cold compiles dominate (tests/conftest.py, docs/testing.md).

The counts are of net allocations: a training loop whose objects die by reference counting
barely moves them, and a cycle that dies young is still collected with generation 0, after
up to 100,000 net allocations instead of 700; only cycles among long-lived objects wait for
the rarer full collections.
"""

from __future__ import annotations

import gc

THRESHOLD = (100_000, 50, 100)
"""Generation 0 after 100,000 net allocations (CPython: 700); generations 1 and 2 after 50
and 100 collections of the one below (CPython: 10 and 10), so that full collections of a
large heap (a pytest worker's, a learner's) stay rare."""


def tune() -> None:
    """Set `THRESHOLD` for this process."""
    gc.set_threshold(*THRESHOLD)
