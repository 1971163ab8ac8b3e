"""The `locojax` entry point and its small subcommands."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def locojax(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "locojax.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_subcommand():
    out = locojax("--help")
    assert out.returncode == 0
    for name in ("train", "launch", "demo", "sft", "generate", "plot", "devices"):
        assert f"  {name}" in out.stdout


def test_unknown_subcommand_is_exit_2():
    out = locojax("fly")
    assert out.returncode == 2 and "unknown subcommand 'fly'" in out.stderr


@pytest.mark.slow
def test_generate_from_the_embedded_checkpoint_answers_in_format():
    out = locojax("generate", "--model", "embedded", "--prompt", "12+34=", "--batch", "2",
                  "--temperature", "0", "--max-new-tokens", "12")
    assert out.returncode == 0, out.stderr
    assert "12+34=####" in out.stdout  # the SFT'd format, greedy
    assert "tokens/s" in out.stdout and "compile" in out.stdout

