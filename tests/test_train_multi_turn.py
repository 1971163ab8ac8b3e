"""`locojax train` on multi-turn tasks end to end: `swe` in colocated mode with the sandbox,
and single vs colocated giving the same multi-turn run (calc, from the shipped tiny-calc
checkpoint, which samples tool calls in about a quarter of its answers).
"""

import glob
import json
import os

import numpy as np
import pytest

from calc_demo_run import CALC_DEMO_ARGS
from test_train_loop import _final_params, _rollouts, locojax

from locojax import float_context

TASK_JSON = {"description": "f() should return 1.", "tests": ["test_m.py"], "runner": "minitest"}
TESTS = {"pass": "def test_f():\n    assert f() == 1\n",
         "fail": "def test_f():\n    assert f() == 2\n",
         "sleep": "import time\n\n\ndef test_f():\n    time.sleep(4)\n    assert f() == 1\n"}


def write_tasks(root, kinds):
    """One minimal user task per kind (layout of locojax/envs/swe/tasks.py): its test passes
    as given, fails, or passes after sleeping past `--multi-turn.env-timeout-s`."""
    for i, kind in enumerate(kinds):
        d = root / f"{i}-{kind}"
        (d / "repo").mkdir(parents=True)
        (d / "task.json").write_text(json.dumps(TASK_JSON))
        (d / "repo" / "m.py").write_text("def f():\n    return 1\n")
        (d / "repo" / "test_m.py").write_text("from m import f\n\n\n" + TESTS[kind])
    return str(root)


def _metrics(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def _segments(mask):
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]))
    return list(zip(edges[::2], edges[1::2]))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_swe_two_steps_colocated_with_the_sandbox(tmp_path):
    """2 hosts x 1 device, the user task loader, 2 steps. TINY (random) never fixes a bug,
    so each trajectory is: a turn without a tool call, an error observation (cut to
    max_obs_tokens), a second turn, then autosubmit runs the tests in the sandbox. The
    sleeping task's test takes 4 s, past --multi-turn.env-timeout-s 1.5 but well within the
    sandbox's wall clock: the env pool's deadline stays above the swe task's own bound on a
    step (issue 38: at 1.5 s its rows were env timeouts, and the abandoned sandbox ran on),
    so its rows pass."""
    train = write_tasks(tmp_path / "train", ["pass", "fail", "sleep", "fail"])
    n_obs, budget = 48, 80
    run = tmp_path / "run"
    locojax("launch", "--hosts", "2", "--devices-per-host", "1", "--heartbeat-s", "10", "--",
            "train", "swe", "--task.data", train, "--steps", "2", "--run-dir", str(run),
            "--rollout.prompts-per-step", "4", "--algo.group-size", "2",
            "--rollout.max-new-tokens", "16", "--multi-turn.max-turns", "2",
            "--multi-turn.max-obs-tokens", str(n_obs),
            "--multi-turn.max-trajectory-tokens", str(budget), "--multi-turn.env-timeout-s", "1.5",
            "--no-progress", "--no-tensorboard", "--dump-rollouts", timeout=900)
    steps = [m for m in _metrics(run) if m["step"] > 0]
    assert len(steps) == 2
    for m in steps:  # no env timeouts or crashes, all 8 rows cut
        assert m["env/timeouts"] == 0 and m["env/errors"] == 0
        assert m["env/turns/mean"] == 2 and m["env/obs_truncated"] == 8
        assert m["reward/mean"] == 4 / 8  # the rows of the two tasks whose test passes
    for path in glob.glob(str(run / "rollouts" / "*.npz")):
        d = np.load(path)
        mask, env, lp = d["mask"], d["env_mask"], d["logprobs"]
        assert mask.shape == (4, budget) and not (mask & env).any()
        assert (lp[mask] < 0).all() and (lp[~mask] == 0).all()
        for row in range(4):
            obs = _segments(env[row])
            assert len(obs) == 1 and obs[0][1] - obs[0][0] == n_obs
            assert len(_segments(mask[row])) == 2 and mask[row].sum() <= 2 * 16
        texts = [str(t) for t in d["texts"]]
        assert all("<result>error: no tool" in t for t in texts)
        assert set(d["rewards"].tolist()) <= {0.0, 1.0}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_multi_turn_single_and_colocated_give_the_same_run(calc_demo_colocated, tmp_path):
    """calc-demo from the shipped checkpoint, 2 steps: 1 process x 2 devices (single) vs
    2 processes x 1 device (colocated, the shared reference run): the same trajectories,
    tool calls included, and the same final params."""
    locojax("train", "calc-demo", "--mode", "single", "--devices-per-host", "2",
            "--run-dir", str(tmp_path / "single"), *CALC_DEMO_ARGS)
    colo = str(calc_demo_colocated)
    a, b = _rollouts(str(tmp_path / "single")), _rollouts(colo)
    assert sorted(a) == sorted(b) and len(a) == 2
    for step in a:
        for x, y in zip(a[step], b[step]):
            np.testing.assert_array_equal(x, y)
    envs = [np.load(p)["env_mask"] for p in glob.glob(str(tmp_path / "single/rollouts/*.npz"))]
    assert sum(e.any(1).sum() for e in envs) >= 2  # some trajectories called the calculator
    (sa, pa), (sb, pb) = _final_params(str(tmp_path / "single")), _final_params(colo)
    assert sa == sb == 2
    float_context.same_or_raise(str(tmp_path / "single"), colo)  # the precondition of bitwise
    import jax

    from locojax.model import loader

    start, moved = loader.load("embedded-calc", param_dtype="float32").weights, False
    for x, y, x0 in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), jax.tree.leaves(start)):
        # Bitwise, as test_train_loop's single-turn check and for its reason: the same rows
        # (above), one SPMD train step over the same 2-device mesh, each device the same
        # local program on the same rows; only the all-reduce's transport differs, and a
        # 2-way sum is one IEEE add. No f32 tolerance would do: AdamW's first steps move
        # each entry by about lr = 1e-4 whatever the gradient's size, so a rounding-level
        # difference and a real one look alike.
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
        moved |= not np.array_equal(np.asarray(x), np.asarray(x0))
    assert moved, "the steps did not change the params: the comparison would be vacuous"
    rows = _metrics(str(tmp_path / "single"))
    assert any(r.get("env/tool_call_rate", 0) > 0 for r in rows)


def test_limits_that_cannot_fit_fail_before_any_work(tmp_path):
    """The CLI path of `limits.resolve` (its other refusals: test_multi_turn_rollout)."""
    out = locojax("train", "calc-demo", "--model", "tiny", "--run-dir", str(tmp_path / "r"),
                  "--multi-turn.max-turns", "400", check=False, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "KV-cache slots per row" in out.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
