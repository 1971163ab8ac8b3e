"""Host work off the critical path (issue 56 item 1): the reference forward dispatched before
the rows are scored, bitwise the run that computed it in the update (`train/early.py`); the
host time the timer reports hidden behind device work and exposed (`profiler.py`); rewards
scored one thread per batch (`envs/rewards.py`); completions decoded in one batch call
(`tokenizer/base.decode_all`)."""

import dataclasses
import functools
import math
import threading
import time

import jax
import numpy as np

from locojax.envs.base import Example
from locojax.envs.rewards import RewardConfig, RewardRunner
from locojax.profiler import HOST_PHASES, StepTimer, overlap_seconds
from locojax.tokenizer import HFTokenizer, decode_all
from locojax.train.config import EvalConfig, RolloutConfig, demo

EX = Example("e0", "1+1=", "2")


def test_overlap_seconds_is_the_host_time_inside_busy_intervals():
    # Every end point a multiple of 1/8: the sums are exact in binary floating point.
    busy = [(1.0, 2.0), (1.5, 2.5), (4.0, 4.5)]  # overlapping ones merged: [1, 2.5], [4, 4.5]
    spans = [(0.5, 1.25), (2.0, 3.0), (3.5, 5.0), (6.0, 7.0)]
    assert overlap_seconds(spans, busy) == 0.25 + 0.5 + 0.5
    assert overlap_seconds(spans, []) == 0.0


class _Work:
    """Stands for dispatched device work: ready once `done` is set (what `block_until_ready`
    waits for, as it waits for a jax.Array)."""

    def __init__(self):
        self.done = threading.Event()

    def block_until_ready(self):
        self.done.wait()
        return self


def test_timer_splits_host_phases_into_hidden_and_exposed():
    timer, work = StepTimer(), _Work()
    timer.device_busy(work)
    with timer.phase("detokenize_reward"):  # host work while the device is busy: hidden
        time.sleep(0.05)
    work.done.set()
    while not timer._busy:  # the watcher has seen it ready: nothing in flight from here
        time.sleep(0.001)
    with timer.phase("admission"):  # host work with nothing in flight: exposed
        time.sleep(0.03)
    with timer.phase("decode"):  # not host work: in neither
        time.sleep(0.01)
    perf = timer.finish_step()
    # Each is a difference of perf_counter readings: a few roundings at their magnitude.
    tol = 8 * math.ulp(time.perf_counter())
    assert abs(perf["perf/host_hidden"] - perf["perf/phase/detokenize_reward"]) <= tol
    assert abs(perf["perf/host_exposed"] - perf["perf/phase/admission"]) <= tol


def _one_thread(seen, completion, example):
    seen.append(threading.current_thread())  # the objects kept: none is reused
    return float(completion == example.answer)


def _slow_on(word, seen, completion, example):
    seen.append(threading.current_thread())
    end = time.monotonic() + (2.0 if completion == word else 0.0)
    while time.monotonic() < end:  # holds the GIL in slices, as a real hang does
        pass
    return 1.0


def test_thread_rewards_run_one_thread_per_batch_each_row_its_own_deadline():
    seen: list = []
    run = RewardRunner(RewardConfig(isolation="thread"))
    scores = run.score_batch(functools.partial(_one_thread, seen), ["2", "3", "2", "2"], [EX] * 4)
    np.testing.assert_array_equal(scores.total, [1, 0, 1, 1])
    assert len(seen) == 4 and all(t is seen[0] for t in seen)
    assert seen[0] is not threading.current_thread()
    # A row past its deadline scores a timeout; the rows after it go on in a fresh thread.
    seen.clear()
    run = RewardRunner(RewardConfig(timeout_s=0.3, isolation="thread"))
    t0 = time.monotonic()
    scores = run.score_batch(functools.partial(_slow_on, "hang", seen), ["a", "hang", "b", "c"],
                             [EX] * 4)
    assert 0.3 <= time.monotonic() - t0 < 2.0  # the one deadline, not the hang's 2 s
    np.testing.assert_array_equal(scores.total, [1, 0, 1, 1])
    assert run.metrics()["reward/timeouts"] == 1
    assert seen[0] is seen[1] and seen[2] is seen[3] and seen[1] is not seen[2]


def test_decode_all_decodes_the_batch_in_one_call(monkeypatch):
    from tests.test_tokenizer import build_hf_tokenizer
    tok = HFTokenizer(build_hf_tokenizer())
    rows = [tok.encode(t) for t in ("12 + 30 = 42", "", "<|im_end|>7")]
    calls = []
    batch = tok.tokenizer.decode_batch
    monkeypatch.setattr(tok.tokenizer, "decode_batch",
                        lambda *a, **k: calls.append(a) or batch(*a, **k), raising=False)
    assert decode_all(tok, rows) == [tok.decode(r) for r in rows]
    assert len(calls) == 1


def _config(tmp_path, name):
    """Two steps of the embedded model at β 0.04, 4 prompts x G 2."""
    base = demo()
    return dataclasses.replace(
        base, model="embedded", mode="single", steps=2, run_dir=str(tmp_path / name),
        progress=False, tensorboard=False,
        algo=dataclasses.replace(base.algo, group_size=2, beta=0.04),
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=6, max_prompt_tokens=8),
        eval=EvalConfig(every=0), remat="off", grad_accum=1)


def test_reference_dispatched_before_scoring_is_bitwise_the_update_computing_it(tmp_path):
    from locojax.train import wiring
    from locojax.train.loop import start

    early = start(_config(tmp_path, "early"), wiring.join("single"))
    late = start(_config(tmp_path, "late"), wiring.join("single"))
    late.early = late.producer.early = None  # as before: the update computes it
    in_flight = []  # at each scoring: were the reference logprobs already dispatched?
    score = early.runner.score_batch

    def watched(*args, **kwargs):
        in_flight.append(early.early is not None and early.early._ref is not None)
        return score(*args, **kwargs)

    early.runner.score_batch = watched
    perfs = []
    for step in range(2):
        for trainer in (early, late):
            timer = StepTimer()
            trainer.step(step, timer)
            perfs.append(timer.finish_step())
    assert in_flight == [True, True]
    for x, y in zip(jax.tree.leaves(early.state.params), jax.tree.leaves(late.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # How much of the scoring the reference hid depends on the machine's load; that the two
    # parts make up the host phases does not: two sums of at most 5 phases in different
    # orders, a difference and a sum, each rounding by at most ulp(host) / 2.
    for perf in perfs:
        host = sum(v for k, v in perf.items() if k[len("perf/phase/"):] in HOST_PHASES)
        gap = perf["perf/host_hidden"] + perf["perf/host_exposed"] - host
        assert abs(gap) <= 10 * math.ulp(host) / 2
    assert all(perf["perf/host_hidden"] == 0.0 for perf in perfs[1::2])  # nothing in flight
