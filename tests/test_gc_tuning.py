"""locojax's own processes run with `gc_tuning.THRESHOLD`: the CLI and every Ray actor."""

import gc
import logging

import pytest

from locojax import cli, gc_tuning
from locojax.fleet import actors


@pytest.fixture
def default_threshold():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default
    yield
    gc.set_threshold(*before)


def test_the_cli_sets_the_threshold_before_its_subcommand(default_threshold, capsys):
    assert cli.main(["--help"]) == 0
    assert gc.get_threshold() == gc_tuning.THRESHOLD
    assert "usage: locojax" in capsys.readouterr().out


@pytest.fixture
def root_logging():
    """The worker's logging as it was: `setup_process` also configures an actor's logging
    (`basicConfig(force=True)`, its noisy loggers at WARNING), which would outlive this test
    here."""
    root = logging.getLogger()
    handlers = root.handlers[:]
    levels = {name: logging.getLogger(name).level for name in ("", *actors.NOISY_LOGGERS)}
    yield
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_every_actor_process_sets_it(default_threshold, root_logging):
    actors.setup_process()  # the first call of every actor's __init__
    assert gc.get_threshold() == gc_tuning.THRESHOLD

