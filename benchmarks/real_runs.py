"""What the real-model comparisons share: the work every side runs and how a run is read.

bench_real_trl.py, bench_real_tunix.py, ab_sample_trl.py, ab_update_trl.py and
paired_seeds.py compare locojax with TRL and Tunix on the real SmolLM2-135M-Instruct: the
settings every side runs (`SETTINGS`), the command line of each side's run and of the
held-out eval, and what is read back from a run (rewards, step times, peak RSS, the reward
per block of steps), in one leaf so that the scripts import it and not each other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import harness
from benchmarks.peers import install

SETTINGS = dict(level=0, reward="flexible", prompts_per_step=8, group_size=8,
                max_new_tokens=32, max_prompt_tokens=48, lr=1e-5, weight_decay=0.0, beta=0.0,
                eps=0.2,
                temperature=1.0, loss_agg="token-mean", trl_loss_type="dapo")
"""What both sides run; the locojax side takes them as `train real-demo` flags. Adam's β and
ε and the gradient clip (1.0) are both sides' defaults; weight decay is TRL's (0)."""


def ab_refusal(model: str, need_trl: bool = True) -> str:
    """Why an A/B against TRL (ab_update_trl, ab_sample_trl) cannot start, "" when it can:
    TRL's venv missing (an A/B never installs it) or no checkpoint at `model`. Checked
    before any import of jax, so a refusal is cheap."""
    peer = install.PEERS["trl"]
    if need_trl and not install.is_ready(peer):
        return ("TRL's venv is not installed (`python -m benchmarks.peers.install trl`; "
                f"expected at {peer.root(install.DEFAULT_CACHE)})")
    if not Path(model, "config.json").is_file():
        return f"no checkpoint at {model}: make real-model"
    return ""


GSM8K_DATA = "/work/shared/data/gsm8k/train.jsonl"
"""The GSM8K training rows of this machine (HF format), the default of `gsm8k_settings`."""


def gsm8k_settings(data: str = GSM8K_DATA, prompts: int = 8, group: int = 4,
                   new_tokens: int = 128) -> dict:
    """Issue 56 item 5's longer completions: GSM8K's questions in the checkpoint's chat
    template, `prompts` x G `group`, exactly `new_tokens` new tokens a completion (EOS
    ignored by locojax, suppressed in TRL), SETTINGS' learning values otherwise. The prompt
    width is locojax's `auto` (the data's longest prompt); TRL 1.16 truncates none."""
    learning = {k: v for k, v in SETTINGS.items() if k not in ("level", "reward")}
    return dict(learning, task="gsm8k", data=str(data), template="chat", reward="strict",
                prompts_per_step=prompts, group_size=group, max_new_tokens=new_tokens,
                max_prompt_tokens="auto", ignore_eos=True)


def task_flags(s: dict) -> tuple[str, list[str]]:
    """The `locojax train` preset and task flags of settings `s`: real-demo's chat arith
    level, or `gsm8k_settings`' data file with EOS ignored in single mode (the issue's own
    command, whose preset is the `gsm8k` one)."""
    if s.get("task") == "gsm8k":
        return "gsm8k", ["--task.data", s["data"], "--task.template", s["template"],
                         "--task.reward", s["reward"], "--rollout.ignore-eos",
                         "--mode", "single", "--no-progress"]
    return "real-demo", ["--task.level", str(s["level"]), "--task.reward", s["reward"]]


def locojax_argv(model: str, seed: int, steps: int, run_dir: Path, eval_every: int,
                 extra: tuple[str, ...] = (), s: dict = SETTINGS) -> list[str]:
    """`locojax train` with settings `s` (SETTINGS, the real demo's work, unless given),
    then `extra` flags (`--locojax-flags`)."""
    preset, task = task_flags(s)
    return [*harness.CLI, "train", preset, "--model", model, "--seed", str(seed),
            "--steps", str(steps), "--run-dir", str(run_dir), *task,
            "--rollout.prompts-per-step", str(s["prompts_per_step"]),
            "--algo.group-size", str(s["group_size"]),
            "--rollout.max-new-tokens", str(s["max_new_tokens"]),
            "--rollout.max-prompt-tokens", str(s["max_prompt_tokens"]),
            "--optim.lr", str(s["lr"]), "--optim.weight-decay", str(s["weight_decay"]),
            "--algo.beta", str(s["beta"]),
            "--algo.eps-low", str(s["eps"]), "--algo.eps-high", str(s["eps"]),
            "--rollout.temperature", str(s["temperature"]), "--algo.loss-agg", s["loss_agg"],
            "--eval.every", str(eval_every), "--checkpoint.no-resume", *extra]


def trl_argv(python: Path, model: str, seed: int, steps: int, out: Path,
             device: str = "cpu", s: dict = SETTINGS) -> list[str]:
    """TRL's worker on settings `s`; it builds its task from them (`trl_real_worker`)."""
    return [str(python), "-m", "benchmarks.peers.trl_real_worker", "--model", model,
            "--out", str(out), "--seed", str(seed), "--steps", str(steps),
            "--settings", json.dumps(s), "--device", device]


def with_peak_rss(argv: list[str]) -> list[str]:
    """argv under GNU time, which prints the process's peak RSS (kB) as its last line."""
    time_bin = shutil.which("time") or "/usr/bin/time"
    return [time_bin, "-f", "peak_rss_kb %M", *argv] if Path(time_bin).exists() else argv


def peak_rss_gb(log: Path) -> float:
    lines = [ln for ln in log.read_text(errors="replace").splitlines()
             if ln.startswith("peak_rss_kb ")]
    return int(lines[-1].split()[1]) * 1024 / 1e9 if lines else harness.NAN


def eval_argv(model: str, seed: int, out: Path, rows: int, *extra: str) -> list[str]:
    """`locojax eval` of `model` on SETTINGS' task and lengths, the first `rows` of this
    seed's 200 held-out problems (0: all), rows to `out`; then `extra` flags."""
    s = SETTINGS
    return [*harness.CLI, "eval", "--model", model, "--task", "arith", "--level",
            str(s["level"]), "--limit", str(rows), "--template", "chat", "--reward", s["reward"],
            "--max-new-tokens", str(s["max_new_tokens"]),
            "--max-prompt-tokens", str(s["max_prompt_tokens"]), "--seed", str(seed),
            "--out", str(out), *extra]


def held_out(model: str, seed: int, out: Path, rows: int) -> dict:
    """`locojax eval`'s summary of `model` on the first `rows` of this seed's 200 held-out
    problems (0: all), greedy."""
    code, tail = harness.run_logged(eval_argv(model, seed, out, rows, "--batch-size", "100"),
                                    out.with_suffix(".log"), timeout=1800)
    if code:
        raise RuntimeError(f"locojax eval of {model} failed ({code}):\n{tail}")
    return json.loads(Path(str(out) + ".summary.json").read_text())


def rewards(run_dir: Path) -> list[float]:
    rows = harness.read_steps(run_dir / "metrics.jsonl")
    return [rows[s]["reward/mean"] for s in sorted(rows) if "reward/mean" in rows[s]]


def step_times(run_dir: Path, log: str) -> list[float]:
    """Each step's wall seconds, less a checkpoint saved inside it (locojax's last step saves
    the final one, which TRL and Tunix do after their loop, outside any step)."""
    rows = harness.read_steps(run_dir / log)
    return [rows[s]["perf/step_time"] - rows[s].get("perf/phase/checkpoint", 0.0)
            for s in sorted(rows) if "perf/step_time" in rows[s]]


MICRO = dict(train_micro_prompts=1, rollout_micro_prompts=2)
"""Tunix's micro-batches, in prompts (x G rows): the step's update is still one AdamW step on
the mean of the micro-batches' gradients (`optax.MultiSteps`), and generation runs in
micro-batches of this many prompts. Sized for this machine's shared memory: with the whole
step's 64 rows in one batch the process passed 11 GB before its first step ended."""


def tunix_argv(python: Path, model: str, seed: int, steps: int, out: Path) -> list[str]:
    return [str(python), "-m", "benchmarks.peers.tunix_real_worker", "--model", model,
            "--out", str(out), "--seed", str(seed), "--steps", str(steps),
            "--settings", json.dumps(SETTINGS),
            "--train-micro-prompts", str(MICRO["train_micro_prompts"]),
            "--rollout-micro-prompts", str(MICRO["rollout_micro_prompts"])]


BLOCK = 10
"""Steps per block of the reward-per-block table."""


def block_means(rewards: list[float]) -> list[float]:
    """The mean reward of each whole block of BLOCK steps."""
    return [sum(rewards[i:i + BLOCK]) / BLOCK for i in range(0, len(rewards) - BLOCK + 1, BLOCK)]
