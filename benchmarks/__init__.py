"""The benchmarks: scripts that print the exact command, machine and load they ran with.

Each script is a short caller of `benchmarks.harness` (what they all repeat) and runs both
ways, from the repository root:

    .venv/bin/python -m benchmarks.bench_engine --shapes tiny
    .venv/bin/python benchmarks/bench_engine.py --shapes tiny

The second form puts `benchmarks/` first on sys.path instead of the repository root, so each
script opens with the same two lines that put the root there, as `-m` does (the only sys.path
change in the package; the commands in the docs, the Makefile and the calibration data's
sources use this form). `tests/test_benchmarks_smoke.py` runs every script at a toy size.
"""
