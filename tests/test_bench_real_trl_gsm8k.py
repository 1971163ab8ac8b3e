"""bench_real_trl's `--work gsm8k` (issue 56 item 5's longer completions), from its command
lines alone: both sides get the same GSM8K file, G, N and a fixed length, and the real
demo's default is what it was. Nothing runs; TRL is not needed."""

import json
from pathlib import Path

from benchmarks import bench_real_trl, real_runs


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_both_sides_carry_the_gsm8k_work():
    args = bench_real_trl.parse(["--work", "gsm8k", "--speed-rounds", "1",
                                 "--data", "/data/gsm8k.jsonl"])
    s = args.settings
    loco = real_runs.locojax_argv("m", 0, 3, Path("r"), 0, (), s)
    assert loco[loco.index("train") + 1] == "gsm8k"
    assert _flag(loco, "--task.data") == "/data/gsm8k.jsonl"
    assert _flag(loco, "--task.template") == "chat"
    assert _flag(loco, "--algo.group-size") == "4"
    assert _flag(loco, "--rollout.prompts-per-step") == "8"
    assert _flag(loco, "--rollout.max-new-tokens") == "128"
    assert _flag(loco, "--rollout.max-prompt-tokens") == "auto"
    assert _flag(loco, "--mode") == "single" and "--rollout.ignore-eos" in loco
    assert _flag(loco, "--optim.lr") == str(real_runs.SETTINGS["lr"])  # the same learning
    trl = json.loads(_flag(real_runs.trl_argv(Path("py"), "m", 0, 3, Path("o"), "cpu", s),
                           "--settings"))
    assert trl["task"] == "gsm8k" and trl["data"] == "/data/gsm8k.jsonl"
    assert (trl["group_size"], trl["prompts_per_step"], trl["max_new_tokens"]) == (4, 8, 128)
    assert trl["ignore_eos"] is True and trl["template"] == "chat"
    assert trl["trl_loss_type"] == "dapo" and trl["beta"] == 0.0


def test_the_real_demo_default_is_unchanged():
    args = bench_real_trl.parse([])
    assert args.work == "real-demo" and args.settings is real_runs.SETTINGS
    loco = real_runs.locojax_argv("m", 0, 3, Path("r"), 0)
    assert loco[loco.index("train") + 1] == "real-demo" and "--rollout.ignore-eos" not in loco
    assert _flag(loco, "--task.level") == "0" and "--mode" not in loco
    trl = json.loads(_flag(real_runs.trl_argv(Path("py"), "m", 0, 3, Path("o")), "--settings"))
    assert trl == real_runs.SETTINGS and "ignore_eos" not in trl


def test_gsm8k_work_times_the_step_only(capsys):
    assert bench_real_trl.main(["--work", "gsm8k", "--sides", "locojax"]) == 2
    assert "--speed-rounds" in capsys.readouterr().err
