"""benchmarks/probe_walls.py: workers started together, their walls read back, and a worker
that dies named with its own message (no hang, no JSON error). Timing is not asserted."""

import sys

import pytest

from benchmarks.probe_walls import walls

WORKER = ("import sys, time; from benchmarks.probe_walls import serve; "
          "serve(lambda: time.sleep(0.001), int(sys.argv[1]), int(sys.argv[2]))")


def test_two_workers_started_together_give_a_wall():
    cmd = [sys.executable, "-c", WORKER, "2", "2"]
    assert 0 < walls([cmd, cmd], 2) < 10


def test_a_worker_that_dies_is_named_with_its_message():
    bad = [sys.executable, "-c", "raise SystemExit('no program for this decoder')"]
    with pytest.raises(RuntimeError, match="worker died before it was ready"):
        walls([bad], 1)
