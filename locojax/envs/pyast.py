"""`parse`: `ast.parse` that many threads may call at once.

CPython 3.11 keeps the recursion counter of its C-AST-to-Python conversion in per-interpreter
state (since gh-95185), and the conversion can switch threads midway (for instance when the
garbage collector runs a finalizer). Two threads converting at once then corrupt the counter
and one raises `SystemError: AST constructor recursion depth mismatch` (reproduced here with
8 threads calling the calc tool, a `__del__` in the collector as the switch point; seen twice
in one `calc-demo` run, each ending a trajectory with reward 0 for nothing the model did).
The env pool runs tools and reward checks in threads, so every `ast.parse` of ours goes
through one re-entrant lock (re-entrant: a finalizer that parses while the lock is held must
not deadlock). Third-party parsing in other threads is not covered; rewards that parse
(sympy) run in worker processes by default (`rewards.py`).

References: CPython gh-106905 (spurious "recursion depth mismatch" SystemErrors).
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.RLock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
