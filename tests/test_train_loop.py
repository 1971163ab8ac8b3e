"""`locojax train` end to end: mode equivalence, exact resume, bad config, the HF path.

The runs use a TINY-shaped model given a short SFT on arith level 1 (a module fixture), so
that rewards vary within groups and every step really moves the params. The mode-equivalence
and resume runs also turn on pass-rate curation and dynamic sampling (`CURATED`) over a pool
of 12 training problems, so prompts recur and get held back, and groups without signal get
refilled. One uninterrupted run per mode serves both (`straight_runs`).
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import psutil
import pytest

from locojax import float_context
from locojax.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = [
    "--task.level", "1", "--rollout.prompts-per-step", "8", "--algo.group-size", "4",
    "--rollout.max-new-tokens", "10", "--rollout.max-prompt-tokens", "8",
    "--eval.every", "3", "--eval.num-examples", "16", "--eval.batch-size", "16",
    "--optim.lr", "3e-4", "--optim.warmup-steps", "0", "--no-progress", "--no-tensorboard", "--dump-rollouts",
]


CURATED = ("--task.train-size", "12", "--curation.enabled", "--curation.readmit-after", "2",
           "--dynamic.max-rounds", "2")


def locojax(*args, timeout=600, check=True, env=None):
    out = subprocess.run([sys.executable, "-m", "locojax.cli", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"locojax {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "model"
    locojax("sft", "--out", str(out), "--arch", "tiny", "--level", "1", "--sft.steps", "120",
            "--sft.batch-size", "32", "--eval-examples", "0")
    return str(out)


def _train_argv(model, run_dir, mode, steps, extra=(), hosts=1, devices=1):
    """The CLI arguments of a `train demo` run: under `launch` when it has several hosts."""
    args = ["train", "demo", "--model", model, "--mode", mode, "--steps", str(steps),
            "--run-dir", str(run_dir), *COMMON, *extra]
    if hosts > 1:
        # Unpinned, as single's one process and the Ray modes' actors run, so that every
        # process has XLA:CPU's intra-op pool of the machine's cores and the bitwise
        # comparisons below compare like with like (locojax/float_context.py): pinned to one
        # core each, launch's default, a host's pool has one thread.
        return ["launch", "--hosts", str(hosts), "--devices-per-host", str(devices),
                "--heartbeat-s", "10", "--no-pin-cpus", "--", *args]
    return [*args, "--devices-per-host", str(devices)]


def _train(model, run_dir, mode, steps, extra=(), hosts=1, devices=1, **kw):
    return locojax(*_train_argv(model, run_dir, mode, steps, extra, hosts, devices), **kw)


def _final_params(run_dir):
    """(last checkpoint step, the exported final params)."""
    from locojax.model.loader import load

    step = Checkpointer(os.path.join(run_dir, "checkpoints")).latest_step()
    return step, load(os.path.join(run_dir, "final_model"), param_dtype="float32").weights


def _rollouts(run_dir, fields=("group_ids", "tokens", "mask")):
    """{step name: (one array per field, rows in group-id order)} from a run's rollout dumps
    (one file per host and step)."""
    by_step = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "rollouts", "*.npz"))):
        step = os.path.basename(path).split(".")[0]
        d = np.load(path)
        by_step.setdefault(step, []).append([d[f] for f in ("group_ids", *fields)])
    out = {}
    for step, parts in by_step.items():
        order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
        out[step] = tuple(np.concatenate([p[i + 1] for p in parts])[order]
                          for i in range(len(fields)))
    return out


STEPS = 6
RESUMABLE = ("--checkpoint.every", "3")
LAYOUTS = {"single": dict(hosts=1, devices=2), "colocated": dict(hosts=2, devices=1)}
"""1 process x 2 devices (single) vs 2 processes x 1 device (colocated)."""


def _extra(mode, root):
    # The single runs also write a profiler trace and probe the all-reduce: both are outside
    # the computation, so they must change neither the outcome nor a resumed run.
    outside = ("--profile-dir", str(root / "trace"), "--probe-allreduce") if mode == "single" else ()
    return (*outside, *RESUMABLE, *CURATED)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """The environment of the runs below: one JAX compilation cache (the suite's, else this
    module's), so a killed-and-resumed twin loads the programs its uninterrupted run compiled
    (about 10 s a run). Every host of a twin finds every program there, so the hosts stay in
    step as without a cache."""
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax_cache")))
    return env


@pytest.fixture(scope="module")
def straight_runs(sft_model, compile_cache, tmp_path_factory):
    """The uninterrupted runs, one per mode, with curation and dynamic sampling on: compared
    with each other, and each with its killed-and-resumed twin (one run serves both)."""
    runs = {}
    for mode, layout in LAYOUTS.items():
        root = tmp_path_factory.mktemp(f"straight-{mode}")
        _train(sft_model, root / "run", mode, STEPS, _extra(mode, root), **layout,
               env=compile_cache)
        runs[mode] = root / "run"
    return runs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_single_and_colocated_give_the_same_run(sft_model, straight_runs):
    """Admission, refills and updates are the same on both layouts."""
    single, colo = straight_runs["single"], straight_runs["colocated"]
    assert glob.glob(str(single.parent / "trace" / "**" / "*.xplane.pb"), recursive=True)
    perf = [json.loads(line) for line in open(single / "perf.jsonl")]
    assert all(p["perf/comm/allreduce_grads"] > 0 for p in perf)
    assert all(p[f"perf/phase/{name}"] > 0 for p in perf for name in ("prefill", "decode", "train"))
    ra, rb = _rollouts(str(single)), _rollouts(str(colo))
    assert sorted(ra) == sorted(rb) and len(ra) == STEPS
    # Bitwise: each row draws from its own key (its global index folded in), and each device
    # generates its own rows with the same local computation (the batch axis is split and no
    # reduction crosses rows), in single's SPMD generate as on each colocated host.
    for step in ra:
        for x, y in zip(ra[step], rb[step]):
            np.testing.assert_array_equal(x, y)
    mask = ra[sorted(ra)[0]][2]
    assert mask.sum() > 0
    (sa, pa), (sb, pb) = _final_params(str(single)), _final_params(str(colo))
    assert sa == sb == STEPS
    float_context.same_or_raise(str(single), str(colo))  # the precondition of bitwise
    # Bitwise, not a tolerance: with the same rollouts (above) both modes run one SPMD train
    # step over the same 2-device global mesh, each device the same local program on the same
    # rows; only the all-reduce's transport differs (in-process or gloo), and a 2-way sum is
    # one IEEE add, commutative. Any difference is a difference in what the modes compute.
    # (No f32 tolerance would do: Adam's first steps are ≈ lr·sign(g), so a rounding-level
    # gradient change can move an entry by the same ~lr as a real bug.)
    moved = False
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    _, p0 = _final_params_at_start(sft_model)
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(p0)):
        moved |= not np.array_equal(np.asarray(x), np.asarray(y))
    assert moved, "the steps did not change the params: the comparison would be vacuous"
    # The rewards varied, so the policy gradient was not zero; curation held prompts back
    # and skipped them, and dynamic sampling replaced groups: the features were exercised.
    rows = [json.loads(line) for line in open(single / "metrics.jsonl")]
    assert any(r.get("rollout/frac_zero_std", 1.0) < 1.0 for r in rows)
    assert any(r.get("curation/frac_filtered", 0) > 0 for r in rows)
    assert any(r.get("rollout/refill/replaced", 0) > 0 for r in rows)
    colo_rows = [json.loads(line) for line in open(colo / "metrics.jsonl")]
    for a, b in zip(rows, colo_rows, strict=True):  # the same table, so the same metrics
        assert {k: v for k, v in a.items() if k.startswith("curation/")} == \
            {k: v for k, v in b.items() if k.startswith("curation/")}


def _final_params_at_start(model_dir):
    from locojax.model.loader import load

    m = load(model_dir, param_dtype="float32")
    return 0, m.weights


def _kill_after_checkpoint(proc, run_dir, step, timeout=600):
    """SIGKILL `proc` and all its descendants as soon as checkpoint `step` is committed."""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.isdir(ckpt_dir) and Checkpointer(ckpt_dir).latest_step() == step:
            break
        if proc.poll() is not None:
            raise AssertionError(f"run ended before checkpoint {step}:\n{proc.stdout.read()}")
        time.sleep(0.2)
    family = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
    for p in family:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", list(LAYOUTS))
def test_killed_and_resumed_run_is_bitwise_identical(sft_model, straight_runs, compile_cache,
                                                      tmp_path, mode):
    """Killed right after the step-3 checkpoint and resumed, with the curation state and
    dynamic sampling in play: the same params and logs as the run that never stopped."""
    straight, resumed = straight_runs[mode], tmp_path / "resumed"
    layout, extra = LAYOUTS[mode], _extra(mode, tmp_path)
    args = _train_argv(sft_model, resumed, mode, STEPS, extra, **layout)
    proc = subprocess.Popen([sys.executable, "-m", "locojax.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=compile_cache)
    _kill_after_checkpoint(proc, str(resumed), 3)
    _train(sft_model, resumed, mode, STEPS, extra, **layout, env=compile_cache)

    (sa, pa), (sb, pb) = _final_params(str(straight)), _final_params(str(resumed))
    assert sa == sb == STEPS
    float_context.same_or_raise(str(straight), str(resumed))
    # Bitwise: the same programs on the same layout, from a bitwise-restored state (params,
    # optimizer, step, data cursor, RNG): no rounding can differ.
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    a = (straight / "metrics.jsonl").read_bytes()
    assert a == (resumed / "metrics.jsonl").read_bytes()
    rows = [json.loads(line) for line in a.decode().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    # The curation state was in play across the kill: the logs above agree on its metrics
    # (table size, held prompts), which a lost table would change.
    assert rows[3]["curation/held"] > 0 and rows[4]["curation/table_size"] > 0


@pytest.mark.parametrize("args,message", [
    (["--algo.group-size", "3", "--rollout.prompts-per-step", "5", "--devices-per-host", "2"],
     "do not split over 2 devices"),
    (["--task.name", "nope"], "unknown task 'nope'"),
    (["--model", "/no/such/dir"], "neither a shipped checkpoint (embedded, "),
    (["--task.name", "gsm8k"], "needs --task.data"),
    (["--task.name", "gsm8k", "--task.data", "/no/such.jsonl"], "does not exist"),
    (["--steps", "0"], "steps must be >= 1"),
    (["--algo.name", "ppo2"], "unknown algorithm"),
    (["--dynamic.overlong-buffer", "99"], "exceeds rollout.max_new_tokens"),
    (["--rollout.cache-dtype", "fp8"],
     "invalid choice 'fp8' for argument '--rollout.cache-dtype'"),
])
def test_bad_config_fails_before_any_work(args, message, tmp_path):
    out = locojax("train", "demo", "--model", "tiny", "--run-dir", str(tmp_path / "r"), *args,
                  check=False, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    # Refused while parsing, tyro prints the message in a box, wrapped at the terminal width.
    assert message in " ".join(out.stderr.replace("│", " ").split())
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_plan_only_prints_the_plan_and_runs_nothing(tmp_path):
    out = locojax("train", "demo", "--model", "tiny", "--mode", "single", "--run-dir",
                  str(tmp_path / "r"), *COMMON, "--plan-only", timeout=300)
    assert "memory plan per device" in out.stdout and "train_step" in out.stdout
    assert not (tmp_path / "r").exists()


def test_help_documents_fields():
    out = locojax("train", "demo", "--help", timeout=120)
    for field in ("--rollout.prompts-per-step", "--algo.beta", "--checkpoint.every",
                  "--eval.every", "--mode", "--plan-only", "--multi-turn.max-turns"):
        assert field in out.stdout
    assert "prompts per step, over all hosts" in out.stdout


@pytest.mark.slow
def test_time_limit_stops_after_a_step_with_eval_and_checkpoint(tmp_path):
    """A limit that has run out before the first step ends: one step, then the last-step
    duties (evaluation, checkpoint, exported model), and the elapsed time in perf.jsonl."""
    run = tmp_path / "r"
    locojax("train", "demo", "--model", "tiny", "--mode", "single", "--steps", "50",
            "--time-limit-s", "0.001", "--run-dir", str(run), *COMMON, timeout=300)
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and "eval/accuracy" in rows[1]
    assert Checkpointer(os.path.join(run, "checkpoints")).latest_step() == 1
    perf = [json.loads(line) for line in open(run / "perf.jsonl")]
    assert perf[0]["perf/elapsed_s"] > 0
    assert json.loads((run / "final_model" / "locojax.json").read_text())["steps"] == 1
