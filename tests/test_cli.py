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
    for name in ("train", "launch", "demo", "sft", "curate", "generate", "plot", "devices"):
        assert f"  {name}" in out.stdout


def test_unknown_subcommand_is_exit_2():
    out = locojax("fly")
    assert out.returncode == 2 and "unknown subcommand 'fly'" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--loose-format", "1.5"], "--loose-format must be in [0, 1]"),
    (["--task", "calc", "--loose-format", "0.5"], "arith task only"),
])
def test_sft_rejects_bad_loose_format(tmp_path, args, message):
    out = locojax("sft", "--out", str(tmp_path / "m"), *args)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_generate_from_the_embedded_checkpoint_answers_in_format():
    out = locojax("generate", "--model", "embedded", "--prompt", "12+34=", "--batch", "2",
                  "--temperature", "0", "--max-new-tokens", "12")
    assert out.returncode == 0, out.stderr
    # Greedy follows the SFT data's majority answer format, which the demo's GRPO replaces.
    assert "12+34=The answer" in out.stdout
    assert "tokens/s" in out.stdout and "compile" in out.stdout



@pytest.mark.slow
def test_the_demo_checkpoint_answers_in_the_strict_format():
    out = locojax("generate", "--model", "embedded-strict", "--prompt", "12+34=", "--batch",
                  "2", "--temperature", "0", "--max-new-tokens", "12")
    assert out.returncode == 0, out.stderr
    # All its SFT data end on the `#### N` line the strict reward reads, so what the demo's
    # GRPO can improve is the number on that line, not the format.
    assert "12+34=#### " in out.stdout
