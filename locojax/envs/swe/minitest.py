"""A tiny test runner for sandboxed tasks: calls the top-level `test*` functions of given files.

It is copied into the sandbox and run there as a script, so it uses the standard library only.
It exists because starting pytest costs ~0.5 s even with plugin autoload off, while this costs
~0.05 s, and RL runs the tests of every episode.

    python minitest.py REPORT.json tests/test_a.py tests/test_b.py

Prints `PASSED key` / `FAILED key` with a short traceback per test and a summary line, then
writes {"path::name": passed} to REPORT.json (only if the run gets that far, so a test that
kills the interpreter cannot forge a pass). Exit 0 iff at least one test ran and all passed.
Supports plain `assert` tests; no fixtures, classes or parametrization (use pytest for those).
"""

import importlib.util
import json
import os
import sys
import traceback


def _load(path: str):
    name = path[:-3].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _short_tb(exc: BaseException) -> str:
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # drop this runner's frame
    lines = traceback.format_exception(type(exc), exc, tb, limit=-6)
    return "".join(lines).rstrip()


def main(argv: list[str]) -> int:
    report, paths = argv[0], argv[1:]
    sys.path.insert(0, os.getcwd())
    results: dict[str, bool] = {}
    for path in paths:
        try:
            module = _load(path)
        except BaseException as e:  # noqa: BLE001 - a broken test module is a failure
            results[f"{path}::<import>"] = False
            print(f"FAILED {path}::<import>\n{_short_tb(e)}")
            continue
        for name, fn in list(vars(module).items()):
            if not (name.startswith("test") and callable(fn)
                    and getattr(fn, "__module__", None) == module.__name__):
                continue
            key = f"{path}::{name}"
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - SystemExit from a test fails it too
                results[key] = False
                print(f"FAILED {key}\n{_short_tb(e)}")
            else:
                results[key] = True
                print(f"PASSED {key}")
    n_pass = sum(results.values())
    print(f"{n_pass} passed, {len(results) - n_pass} failed")
    with open(report, "w") as f:
        json.dump(results, f)
    return 0 if results and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
