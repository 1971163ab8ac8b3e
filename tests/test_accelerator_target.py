"""`make test-accelerator` runs pytest without xdist (`-p no:xdist`: one process holds a
chip). CI never runs that target (it has no chip), so this checks here that the suite's
conftest still loads that way: an xdist-only hook made it stop with pytest's "unknown
hook" INTERNALERROR before any test ran."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_suite_collects_without_xdist():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
         "--collect-only", "-q", "-m", "accelerator", "tests/test_advantages.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "INTERNALERROR" not in out.stdout + out.stderr
