"""Every benchmark script runs, at a toy size, and prints its table or ratio lines.

Each runs as a user starts it (`python -m benchmarks.x`, the only way: tests/test_import_layers.py),
in its own process, with the suite's XLA flags. What is asserted is the output's content:
the header, the table's head and a row of figures, the ratio. The peers' parts never
install anything: bench_peers runs locojax's side only, with `--no-install` and an empty
cache; bench_engine runs without Tunix. Not run here: bench_engine's `--sweep` and
`--trace` (engine_sweeps.py: SMALL's constants, minutes), calibrate_predict's runs (it
writes the repository's calibration data; `--help` checks that it starts) and the peers'
installer. The real SmolLM2's runs are in test_benchmarks_smoke_real.py.
`test_every_script_has_a_smoke_test` keeps that list whole: a script that can be
run (it has a `__main__` block) and is not named here fails it.
"""

import json
from pathlib import Path

import pytest
from bench_smoke import ROOT, bench, table_rows

GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


# Scripts run only through another script here, or not at all (and why).
COVERED_ELSEWHERE = {
    "peers/install": "installs the peers' venvs: never in a test",
    "peers/locojax_worker": "bench_peers' locojax side, below",
    "peers/trl_real_worker": "bench_real_trl's TRL side: refused without its venv (_real.py)",
    "peers/trl_update_worker": "ab_update_trl's TRL side: refused without its venv (_real.py)",
    "peers/trl_sample_worker": "ab_sample_trl's TRL side: refused without its venv (_real.py)",
    "peers/trl_worker": "bench_peers' TRL side: needs its venv",
    "peers/tunix_worker": "bench_peers' Tunix side: needs its venv",
    "peers/tunix_sampler": "bench_engine's Tunix arm: needs its venv",
    "peers/tunix_real_worker": "bench_real_tunix's worker (_real.py): needs Tunix's venv",
    "peers/tunix_real_model": "tests/test_tunix_real.py runs it: needs Tunix's venv",
    "tpu/decode_blocks": "tests/test_tpu_probes.py runs it at a toy size, in-process",
    "tpu/decode_profile": "tests/test_tpu_probes.py runs it at a toy size, in-process",
    "tpu/peak_probe": "tests/test_tpu_probes.py runs it on the CPU, in-process",
    "tpu/random_model": "tpu/lora_runs' qwen smoke, below, writes its model with it",
    "price_child": "predict_programs compiled's child: tests/test_kernel_model.py runs it",
    "measure_child": "predict_programs measure's child: tests/test_predict_measure.py runs it",
    "paper_report": "tests/test_pod_scale_doc.py runs it and checks docs/pod_scale.md's copy",
    "carried_profile": "tests/test_carried_profile.py runs its command and reads its output",
}


def test_every_script_has_a_smoke_test():
    """Each runnable benchmark script is run by a test in this file or in
    test_benchmarks_smoke_real.py (the real model's), or is listed above with the reason it
    is not."""
    this = Path(__file__).read_text() + (ROOT / "tests" / "test_benchmarks_smoke_real.py"
                                         ).read_text()
    runnable = sorted(str(p.relative_to(ROOT / "benchmarks").with_suffix(""))
                      for p in (ROOT / "benchmarks").rglob("*.py")
                      if '__name__ == "__main__"' in p.read_text())
    missing = [name for name in runnable
               if f'bench("{name}"' not in this and name not in COVERED_ELSEWHERE]
    assert runnable and not missing, f"benchmark scripts no smoke test runs: {missing}"


def test_predict_sweep_over_the_sizes_draws_its_plot(tmp_path):
    plot = tmp_path / "sizes.png"
    out = bench("predict_sweep", "sizes", "--workload", "gsm8k", "--cluster", "v7x-64",
                "--plot", str(plot))
    assert "llama-3.1-405b" in out and plot.stat().st_size > 0


def test_chip_rates_prints_the_probes_and_their_share():
    out = bench("chip_rates", "--runs", "1", "--values", "4096", "--matmul-n", "32")
    assert "# chip_rates: " in out and "bandwidth probe " in out and "matmul probe " in out
    assert "no published figures for this device" in out  # the CPU


def test_host_overlap_two_sides_of_this_tree_and_the_scoring_alone():
    """benchmarks/host_overlap.py: one round, one timed step a run, β 0.04 (the reference
    dispatched before scoring: some host time may be hidden), this tree as both sides."""
    out = bench("host_overlap", "--sides", "a=.", "b=.", "--rounds", "1", "--steps", "1",
                "--beta", "0.04", "--", "demo", "--model", "embedded",
                "--rollout.prompts-per-step", "4", "--algo.group-size", "2",
                "--rollout.max-new-tokens", "6", "--rollout.max-prompt-tokens", "8")
    assert "# benchmarks/host_overlap.py " in out
    assert "| β | side | step ms | decode ms | reference ms | train ms | detokenize_reward ms " \
        "| host ms | host_hidden ms | host_exposed ms |" in out
    rows = table_rows(out, "0.04")
    assert [r[1] for r in rows] == ["a", "b"] and all(float(r[2]) > 0 for r in rows)
    assert all(abs(float(r[8]) + float(r[9]) - float(r[7])) <= 0.11 for r in rows)  # 1 decimal
    assert any(line.startswith("β 0.04: a / b: step ") for line in out.splitlines())
    out = bench("host_overlap", "--scoring", "--sides", "a=.", "--rounds", "1", "--", "demo",
                "--rollout.prompts-per-step", "4")
    assert any(line.startswith("a: detokenize ") and "reward" in line
               for line in out.splitlines())


def test_bench_extend_tiny():
    out = bench("bench_extend", "--shapes", "tiny", "--repeats", "1")
    assert "# bench_extend: " in out and "load average at start" in out
    assert "| turn | live rows | extend s | mask s | reprefill s | reprefill / extend" in out
    (row,) = table_rows(out, "trajectory")
    assert float(row[2]) > 0 and float(row[5]) > 0  # extend seconds; reprefill / extend
    assert len(table_rows(out, "4")) == 1  # TINY's 4 turns
    (line,) = [ln for ln in out.splitlines() if ln.startswith("roofline of the trajectory")]
    assert "share reached: extend " in line and "reprefill " in line


@pytest.mark.slow  # torch and HF generate beside the engine
def test_bench_engine_tiny_against_hf():
    out = bench("bench_engine", "--shapes", "tiny", "--runs", "1", "--peer-runs", "1",
                "--no-tunix")
    assert "# bench_engine: " in out and "memory bandwidth" in out
    rows = table_rows(out, "tiny")
    assert len(rows) == 2  # printed as the shape ends, then in the whole table
    assert rows[0][1] == str(8 * 4 * 32)  # tokens: exactly N a row
    assert rows[-1][5].endswith("x") and rows[-1][6] == "-"  # vs HF; no Tunix
    assert rows[-1][8].endswith(("(bytes)", "(FLOPs)")) and "%" in rows[-1][8]  # roofline


def test_bench_engine_locojax_alone():
    """--no-hf --no-tunix: locojax's rate and roofline share, no peer column filled."""
    out = bench("bench_engine", "--shapes", "tiny", "--runs", "1", "--no-hf", "--no-tunix")
    row = table_rows(out, "tiny")[-1]
    assert float(row[2].replace(",", "")) > 0 and row[3] == row[5] == "-"  # no HF rate/ratio
    assert row[8].endswith(("(bytes)", "(FLOPs)"))


def test_profile_generate_smoke():
    out = bench("profile_generate", "--smoke", "--runs", "1")
    assert "tiny-64 (8 rows): first run (compiles)" in out
    assert "ms/token" in out and "decode" in out and "rest (host syncs" in out


def test_profile_train_and_train_step_memory_tiny():
    out = bench("profile_train", "--shape", "tiny", "--steps", "1", "--traced", "1",
                "--top", "3")
    assert "steady steps: " in out and "op kind" in out and "kernels launched per step: " in out
    out = bench("train_step_memory", "tiny")
    assert "tiny" in out and "temporaries" in out and "XLA/expected" in out


def test_real_step_seconds_tiny():
    out = bench("real_step_seconds", "--model", "tiny", "--prompts", "1", "--group", "2",
                "--prompt-tokens", "8", "--new-tokens", "8", "--steps", "1", "--remat", "on")
    assert "remat on: wall s " in out and "; CPU s " in out and "peak RSS" in out


@pytest.mark.slow  # compiles a real config's programs on 8 simulated devices
def test_plan_real_size_of_the_smallest_config():
    out = bench("plan_real_size", "smollm2-135m-instruct", "--remat", "on", "--grad-accum",
                "1", "--no-eval")
    assert "# plan_real_size: " in out and "memory plan per device" in out
    assert "; fits" in out


def test_predict_probes_and_calibrate_start():
    probe = json.loads(bench("predict_probes", "stream").splitlines()[-1])
    assert probe["copy_bytes_per_s"] > 0 and probe["mb"] == 256
    out = bench("calibrate_predict", "--help")
    assert "locojax predict calibrate" in out  # a short caller of the command
    out = bench("predict_programs", "--help")  # test_kernel_model.py, test_predict_measure.py
    assert "predict_programs compiled" in out


@pytest.fixture(scope="module")
def modes_run(tmp_path_factory):
    """bench_modes at its smallest: TINY arith, single mode at N = 1, 3 steps."""
    work = tmp_path_factory.mktemp("bench_modes")
    out = bench("bench_modes", "--workloads", "arith", "--shapes", "tiny", "--hosts", "1",
                "--modes", "single", "--repeats", "1", "--steps", "3", "--skip", "0",
                "--work-dir", str(work), "--json", str(work / "modes.json"))
    return work, out


@pytest.mark.slow  # a `locojax train` run
def test_bench_modes_single_n1(modes_run):
    _, out = modes_run
    assert "# bench_modes: " in out and "## Commands" in out
    (row,) = table_rows(out, "1")[:1]
    assert float(row[2]) > 0 and row[3] == "-" and row[4] == "-"  # single's s/step only
    assert "| single |" in out  # the A/A table's row (one run: no spread)


@pytest.mark.slow  # predicts the bench_modes run above
def test_validate_predict_reports_the_bench_modes_run(modes_run):
    work, _ = modes_run
    out = bench("validate_predict", "--work-dir", str(work))
    assert "## bench_modes.py: predicted / measured" in out
    assert len(table_rows(out, "arith TINY N=1 single")) == 1


@pytest.mark.slow
@pytest.mark.multiprocess  # a worker process per arm
def test_ab_train_step_two_arms_of_this_tree():
    out = bench("ab_train_step", "--shape", "tiny", "--arm", "a=", "--arm", "b=",
                "--block", "1", "--rounds", "2")
    assert "# ab_train_step: " in out
    lines = [ln for ln in out.splitlines() if "x vs a" in ln]
    assert len(lines) == 2 and "1.00x vs a" in lines[0] and "over 2 steps" in lines[1]


def test_bench_invariant():
    out = bench("bench_invariant", "--shape", "tiny", "--rounds", "1")
    assert "# bench_invariant: " in out
    lines = [ln for ln in out.splitlines() if "x vs default" in ln]
    assert [ln.split()[0] for ln in lines] == ["learn", "generate"]


@pytest.mark.slow
@pytest.mark.multiprocess  # the locojax side's worker process
def test_bench_peers_locojax_side_only_installs_nothing(tmp_path):
    out = bench("bench_peers", "--shapes", "tiny", "--betas", "0", "--sides", "locojax",
                "--no-install", "--cache", str(tmp_path / "no-peers"), "--warmup", "1",
                "--block", "1", "--repeats", "1", "--work-dir", str(tmp_path),
                "--json", str(tmp_path / "results.json"))
    assert not (tmp_path / "no-peers").exists()
    (ours,) = [r for r in table_rows(out, "TINY") if r[2] == "locojax"]
    assert float(ours[3]) > 0 and ours[10] == "1"  # step seconds; 1 steady step
    assert float(ours[8]) > 0 and ours[9].endswith("%")  # train tokens/s, share of the peak
    assert "| TINY | 0 | n/a | n/a | n/a |" in out  # no peer: no speed-up
    assert json.loads((tmp_path / "results.json").read_text())["results"][0]["sides"][
        "locojax"]["steps"]


@pytest.mark.slow
@pytest.mark.multiprocess  # 2 `locojax train` runs; no Ray cluster without da or async points
def test_ab_runs_one_point_in_two_trees(tmp_path):
    out = bench("ab_runs", "--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--points",
                "single-1", "--rounds", "1", "--steps", "3", "--skip", "0", "--work-dir",
                str(tmp_path))
    assert "# ab_runs: " in out
    (row,) = table_rows(out, "single-1")
    assert float(row[-1]) > 0  # a / b


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.multiprocess  # 4 simulated hosts: launch's processes, Ray's actors
def test_bench_placement_colocated_and_one_da_point(tmp_path):
    # async is the same wiring as DA with other counts (and another ~25 s here): left out
    out = bench("bench_placement", "--fractions", "0.5", "--ks", "--prompts", "4",
                "--group", "2", "--new-tokens", "4", "--steps", "3", "--skip", "0",
                "--work-dir", str(tmp_path), timeout=600)
    assert "# bench_placement: " in out and "FAILED" not in out
    for point in ("colocated", "da-0.5 (2 workers)"):
        (row,) = table_rows(out, point)
        assert float(row[1]) > 0, row  # s/step
    assert "# best DA point: da-0.5" in out and "async" not in out


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.multiprocess  # a learner host and 2 rollout workers: Ray's actors
def test_bench_inflight_one_round_of_both_arms(tmp_path):
    out = bench("bench_inflight", "--prompts", "4", "--group", "2", "--new-tokens", "16",
                "--tail-median", "4", "--chunk", "2", "--steps", "3", "--skip", "0",
                "--rounds", "1", "--work-dir", str(tmp_path), timeout=600)
    assert "# bench_inflight: " in out and "FAILED" not in out
    for arm in ("off", "on"):
        (row,) = table_rows(out, arm)
        assert float(row[2]) > 0 and float(row[3]) > 0, row  # tokens/s, steps/s
    assert "on / off: tokens/s x" in out
    # the long tail reached the run: rows capped below N = 16 (median 4)
    rows = [json.loads(line) for line in (tmp_path / "off-1" / "metrics.jsonl").open()]
    assert all(r["rollout/response_length/mean"] < 16 for r in rows)


def test_kernel_profile_joins_the_trace_and_kernel_rates_prices_from_its_tables(tmp_path):
    """A TINY update and generate traced: the dot row's FLOPs are the train step's matmuls,
    which the cost model counts exactly, and its kernels ran. The kernel tables that run
    measured (`--tables`) then price a program in kernel_rates: one kernel_profile run for
    both, since `--tables` only adds the write of what it measures either way."""
    from locojax.model import config
    from locojax.predict.flops import ModelCosts

    tables = tmp_path / "tables.json"
    out = bench("kernel_profile", "--model", "tiny", "--shape", "2", "2", "8", "8", "--quick",
                "--calls", "1", "--top", "2", "--tables", str(tables))
    assert "# kernel_profile: " in out and "## train step" in out and "## generate" in out
    train = out.split("## generate")[0]
    (dot,) = table_rows(train, "dot")
    flops = ModelCosts(config.tiny(), "float32").train_step(4, 2, 8, 8).flops
    assert float(dot[8]) == pytest.approx(flops / 1e9, abs=5e-4)  # printed to 3 decimals
    assert float(dot[1]) > 0 and float(dot[4]) > 0  # kernel runs, active ms
    assert float(dot[3]) >= float(dot[4])  # its tasks' events cover at least its active time
    out = bench("kernel_rates", "--tables", str(tables), "--program", "tiny", "2", "2", "8",
                "4", "--calls", "1")
    assert out.count("calibration ") == 2 and "concurrency" in out
    (update,) = table_rows(out, "tiny update 2 x 2 x 8 x 4")
    assert float(update[1]) > 0 and float(update[2]) > 0  # wall, model ms
    assert len(table_rows(out, "tiny generate 2 x 2 x 8 x 4")) == 1


def test_paired_seeds_on_the_kept_table():
    out = bench("paired_seeds", "--blocks", "2", "--table",
                "benchmarks/data/real_trl_blocks_seeds012.json")
    assert "# paired_seeds: " in out and "3 seeds" in out
    (row,) = table_rows(out, "0")
    assert row[1] == "-0.108"  # seed 0, steps 1-10: 0.239 - 0.347
    assert "paired test over every block: " in out


@pytest.mark.slow  # a `locojax train` run with evaluations, then its plot
def test_bench_learning_one_arm(tmp_path):
    out = bench("bench_learning", "--model", "tiny", "--arms", "grpo", "--seeds", "0",
                "--time-limit-s", "2", "--max-steps", "2", "--eval-every", "1", "--mode",
                "single", "--train-args", "--eval.num-examples 4", "--out", str(tmp_path))
    assert "# bench_learning: " in out
    (row,) = table_rows(out, "grpo")
    assert 0 <= float(row[1]) <= 1 and row[-1].count("-") >= 1  # start accuracy; load
    assert (tmp_path / "learning.png").stat().st_size > 0


@pytest.mark.slow  # writes a random HF model with transformers, trains one step
@pytest.mark.skipif(not GSM8K.exists(), reason=f"needs GSM8K rows at {GSM8K}")
def test_bench_real_size_one_layer(tmp_path):
    out = bench("bench_real_size", "--config", "smollm2-135m-instruct", "--layers", "1",
                "--data", str(GSM8K), "--steps", "1", "--prompts", "1", "--group", "2",
                "--new-tokens", "4", "--tokenizer-vocab", "512", "--work", str(tmp_path))
    assert "# bench_real_size: " in out and "measured/plan" in out
    assert "step 1: " in out and "tokens/s" in out


@pytest.mark.slow  # a 6-step `locojax train` run of the smallest pre-registered point
def test_validate_heldout_one_point_from_the_shipped_profile(tmp_path):
    profile = ROOT / "locojax" / "predict" / "hardware" / "cpu-here.json"
    out = bench("validate_heldout", "--profile", str(profile), "--only", "tiny-s1-f",
                "--work-dir", str(tmp_path))
    assert "# validate_heldout: " in out and "load average at the end" in out
    (row,) = table_rows(out, "tiny-s1-f")
    assert float(row[7]) > 0 and float(row[8]) > 0  # measured and predicted s/step


@pytest.mark.slow  # writes a random model, then a 3-step `locojax train` GSM8K run
def test_validate_heldout_a_published_configs_point_dry_run(tmp_path):
    """Set 10's kind of point (benchmarks/predict_validation_points_v10_tpu.json): a published
    config on random weights, GSM8K, a precision and remat; here cut to 2 layers (--tiny)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "qwen3-0.6b.json").write_text(json.dumps(json.loads(
        (ROOT / "tests" / "data" / "hf_configs.json").read_text())["qwen3-0.6b"]))
    spec = json.loads((ROOT / "benchmarks" / "predict_validation_points_v10_tpu.json")
                      .read_text())
    spec["points"] = [{"id": "q", "config": "qwen3-0.6b", "prompts": 2, "group": 2,
                       "prompt_tokens": 64, "new_tokens": 8, "precision": "bf16",
                       "remat": "on", "steps": 3}]
    (tmp_path / "points.json").write_text(json.dumps(spec))
    common = ["--profile", str(ROOT / "locojax" / "predict" / "hardware" / "cpu-here.json"),
              "--points", str(tmp_path / "points.json"), "--configs", str(configs),
              "--data", str(ROOT / "tests" / "data" / "gsm8k_small.jsonl"), "--tiny",
              "--work-dir", str(tmp_path / "w")]
    # Predictions committed before the run (a registration's): the run must use them, so the
    # committed step is set to a value the cost model would not give.
    predicted = tmp_path / "predicted.json"
    out = bench("validate_heldout", *common, "--write-predictions", str(predicted))
    made = json.loads(predicted.read_text())
    assert f"q: predicted {made['points']['q']['step']:.3f} s/step" in out
    made["points"]["q"]["step"] = 123.456
    predicted.write_text(json.dumps(made))
    out = bench("validate_heldout", *common, "--predicted", str(predicted))
    (row,) = table_rows(out, "q")
    assert row[1] == "qwen3-0.6b-tiny" and float(row[7]) > 0 and row[8] == "123.456"
    config = json.loads((tmp_path / "w" / "models" / "qwen3-0.6b-tiny" / "config.json")
                        .read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 151936


PLAN_LOG = """memory plan per device (1 local device; data parallel; bf16, remat on, 2 micro-batches, logits in chunks of 2 positions):
  held             params 2.38 GB, optimizer 4.77 GB; KV cache: rollout 1.23 GB (bfloat16)
  train_step       +5.57 GB (XLA temporaries 5.57 GB) -> 12.72 GB   [compiled in 28.0 s]
  peak             12.72 GB in train_step, of 16.91 GB (tpu memory_stats), 75%
"""  # the head of a chip run's log (set 12's qwen-r48 point), micro-batches made 2


def test_memory_vs_plan_reads_a_plan_and_predicts_at_its_micro_batches(tmp_path):
    """benchmarks/memory_vs_plan.py: the plan's micro-batches and compiled peak from a run's
    log, `predict train` at those micro-batches, a point without a log reported as such."""
    from benchmarks import memory_vs_plan

    assert memory_vs_plan.compiled_plan(PLAN_LOG) == (2, 12.72e9)
    assert memory_vs_plan.compiled_plan(PLAN_LOG.replace("12.72 GB in", "512.0 MB in")) == (
        2, 512e6)
    assert memory_vs_plan.compiled_plan("no plan here") is None
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "qwen3-0.6b.json").write_text(json.dumps(json.loads(
        (ROOT / "tests" / "data" / "hf_configs.json").read_text())["qwen3-0.6b"]))
    spec = json.loads((ROOT / "benchmarks" / "predict_validation_points_v12_tpu.json")
                      .read_text())
    point = {"config": "qwen3-0.6b", "prompts": 2, "group": 2, "prompt_tokens": 64,
             "new_tokens": 8, "precision": "bf16", "remat": "on", "steps": 3}
    spec["points"] = [{"id": "q", **point}, {"id": "unrun", **point}]
    (tmp_path / "points.json").write_text(json.dumps(spec))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "q.log").write_text(PLAN_LOG)
    out = bench("memory_vs_plan", "--points", str(tmp_path / "points.json"), "--profile",
                str(ROOT / "locojax" / "predict" / "hardware" / "cpu-here.json"),
                "--configs", str(configs), "--tiny", "--work-dir", str(tmp_path / "w"),
                "--data", str(ROOT / "tests" / "data" / "gsm8k_small.jsonl"))
    (row,) = table_rows(out, "q")
    assert row[1] == "2" and row[2] == "12.72" and float(row[3]) > 0
    assert row[4] == f"{100 * (float(row[3]) / 12.72 - 1):+.1f}%"
    assert "no plan in" in out and "of 1 points with a plan (1 without)" in out


def test_tpu_lora_runs_qwen_stage_at_a_toy_size(tmp_path):
    """benchmarks/tpu/lora_runs.py's qwen stage (LoRA GRPO on a random model written from a
    published config, cut to 2 layers by --toy) runs and tabulates; the registered sweep rule
    and verdict, on numbers (docs/lora.md)."""
    import json

    config = tmp_path / "qwen3-1.7b.json"
    config.write_text(json.dumps(json.loads((ROOT / "tests" / "data" / "hf_configs.json")
                                            .read_text())["qwen3-1.7b"]))
    out = bench("tpu/lora_runs", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"),
                "--qwen-config", str(config), "--toy", "qwen")
    (row,) = table_rows(out, "qwen3-1.7b-lora")
    assert float(row[3]) > 0  # median step seconds
    from benchmarks.tpu import lora_runs as runs

    assert runs.choose([(8, 1e-4, 0.7), (32, 5e-4, 0.8), (8, 5e-4, 0.8)]) == (8, 5e-4)
    assert runs.verdict([0.70, 0.76, 0.82], [0.69, 0.70, 0.74]).startswith("PASS")
    assert "within" in runs.verdict([0.70, 0.76, 0.82], [0.69, 0.70, 0.74])
    assert runs.verdict([0.70, 0.76, 0.82], [0.60, 0.70, 0.74]).startswith("FAIL")


def test_tpu_decode_parts_times_every_part_at_a_toy_size(tmp_path):
    """benchmarks/tpu/decode_parts.py on SmolLM2-135M's config cut to 2 layers (--toy): its
    table has a row per part (the timed ones and the differences), its JSON every part, and
    the per-layer fit over 1 and 2 layers is finite. The figures are the chip's to judge."""
    config = tmp_path / "smollm2-135m-instruct.json"
    config.write_text(json.dumps(json.loads((ROOT / "tests" / "data" / "hf_configs.json")
                                            .read_text())["smollm2-135m-instruct"]))
    out = bench("tpu/decode_parts", "--config", str(config), "--toy", "--rows", "4",
                "--prompt", "8", "--n1", "2", "--n2", "6", "--rounds", "1", "--reps", "2",
                "--out", str(tmp_path))
    parts = ["iteration", "forward_1", "forward_2", "forward_2_block1", "logits", "sample_t1",
             "sample_greedy", "stream", "step", "rest", "sampler_t1", "kv_reads", "dispatch"]
    for name in parts:
        (row,) = table_rows(out, name)
        assert float(row[1]) == float(row[1]) and float(row[2]) >= 0, row  # ms, bytes' ms
    arm = json.loads((tmp_path / "decode_parts.json").read_text())["arms"]["default"]
    assert arm["rounds_done"] == 1 and not arm["failed"]
    assert sorted(arm["parts"]) == sorted(parts)
    fit = arm["fit"]
    assert fit["layers"] == [1, 2] and all(
        abs(fit[k]) < float("inf") for k in ("slope_ms", "intercept_ms", "slope_bytes_ms"))
    assert "per layer: " in out
