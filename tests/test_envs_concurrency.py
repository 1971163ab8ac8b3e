"""Environment tools under many concurrent calls: the calc tool never fails because two env
pool threads parse at once.

CPython 3.11 raises `SystemError: AST constructor recursion depth mismatch` when two threads
convert ASTs at once and one is switched out midway (`locojax/envs/pyast.py`). A garbage
collector that runs often, with a finalizer that yields the GIL, makes such switches common:
without the lock this test saw the SystemError in each of 3 runs (8 threads, 12k calls).
"""

import gc
import time

from locojax.envs.pool import EnvPool
from locojax.envs.tasks.calc import calculator

# Deep parentheses keep each conversion long; within the tool's 100-character limit.
EXPRS = ["(" * 40 + "1+2" + ")" * 40 + "*(7+8)*(9+1)", "374*29", "((2*(3+4))-5)/2", "1/0"]


class _Yields:
    """Garbage whose finalizer hands the GIL over: a thread switch inside the collector."""

    def __init__(self):
        self.me = self  # a cycle: only the collector frees it

    def __del__(self):
        time.sleep(0)


def _calc_with_garbage(expr: str) -> str:
    _Yields()
    return calculator(expr)


def test_calc_tool_is_safe_under_many_concurrent_calls():
    want = {e: calculator(e) for e in EXPRS}
    assert want[EXPRS[0]] == "450" and want["1/0"] == "error: division by zero"
    threshold = gc.get_threshold()
    gc.set_threshold(5, 1, 1)
    try:
        with EnvPool(workers=8, timeout_s=60) as pool:
            args = [(EXPRS[i % len(EXPRS)],) for i in range(8 * 1500)]
            outcomes = pool.run(_calc_with_garbage, args)
    finally:
        gc.set_threshold(*threshold)
    errors = [o.detail for o in outcomes if o.status != "ok"]
    assert errors == [], errors[:3]
    assert [o.value for o in outcomes] == [want[a[0]] for a in args]
