"""A host's error, said once, last, and where in the user's code it came from.

On a multi-host run (jax.distributed) a host that raises and then exits as Python does
waits in the distributed runtime's shutdown barrier for peers that never arrive: a reward
module that failed to import on host 1 of 2 was followed by five minutes of waiting and
then pages of coordination-service stack traces from both hosts, the user's error lost at
the top. `stop` prints the traceback, then one line naming the host, the exception and
the innermost frame of the user's own code (`user_frame`: not locojax, not the standard
library or an installed package), and leaves at once (`os._exit`, past the barrier).
`locojax launch` then stops the other hosts, keeps their dying output off the screen, and
repeats that line as the last thing printed (`commands/launch.py`).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def user_frame(error: BaseException) -> str:
    """`file:line` of the innermost frame of user code in `error`'s traceback, or deeper, in
    the exceptions it was raised from (a cause's frames are inner to its wrapper's); "" if
    there is none."""
    from locojax.envs.user import installed_dirs

    installed = [*installed_dirs(), _PACKAGE]
    found, seen = "", set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for frame in traceback.extract_tb(e.__traceback__):
            path = Path(frame.filename).resolve()
            if frame.filename.startswith("<") or any(path.is_relative_to(d) for d in installed):
                continue
            found = f"{frame.filename}:{frame.lineno}"
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return found


def describe(error: BaseException, process_id: int, num_processes: int) -> str:
    """One line: the host (on several), the exception, and where in the user's code."""
    where = user_frame(error)
    host = f"host {process_id} of {num_processes}: " if num_processes > 1 else ""
    return f"{host}{type(error).__name__}: {error}" + (f" (at {where})" if where else "")


def stop(command: str, error: BaseException, code: int, process_id: int,
         num_processes: int, show_traceback: bool = True) -> int:
    """Report `error` (the traceback if `show_traceback`, then its one line, last) and return
    `code`; on a multi-host run exit with it at once instead."""
    if show_traceback:
        traceback.print_exception(error, file=sys.stderr)
    print(f"locojax {command}: {describe(error, process_id, num_processes)}", file=sys.stderr,
          flush=True)
    if num_processes > 1:
        sys.stdout.flush()
        os._exit(code)  # not Python's exit: its jax.distributed shutdown waits for the peers
    return code
