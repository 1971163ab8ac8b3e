"""Deadlines scaled to the work they wait on (issue 38).

The Ray verifier's deadline was a fixed 150 s per call whatever the call's size, so a unit
of slow-but-legal rewards (each under its own `RewardConfig.timeout_s`, or scored 0 at it, as
single mode does) stopped the run. The env pool's deadline equalled the sandbox's wall
clock, so a slow test run counted as an env timeout and a second sandbox started beside the
first. Both are arithmetic on the settings, checked here without timing anything.
"""

import pytest

from locojax.envs.base import combine_rewards
from locojax.envs.rewards import RewardConfig

pytest.importorskip("ray")

from locojax.fleet.verifier import VerifierPool, scoring_bound_s  # noqa: E402


def _reward(completion, example):
    return 1.0


def _other(completion, example):
    return 0.0


def test_the_verifier_deadline_grows_with_the_rows_it_scores():
    reward = RewardConfig(timeout_s=5.0, workers=2)
    pool = VerifierPool([], timeout_s=150.0, reward=reward)
    two_parts = combine_rewards([(_reward, 1.0), (_other, 0.5)])
    # 64 rows, 2 at a time, 2 parts, each call at its 5 s deadline: 32 * 2 * 5 s of scoring.
    assert scoring_bound_s(64, 2, reward) == 320.0
    assert pool.deadline_s(two_parts, 64) == 150.0 + 320.0
    assert pool.deadline_s(_reward, 64) == 150.0 + 160.0
    for rows in (1, 7, 64, 1000):  # every row may run to its deadline and still be scored
        assert pool.deadline_s(two_parts, rows) - pool.timeout_s >= \
            scoring_bound_s(rows, 2, reward) > 0


def test_the_env_pools_deadline_is_above_the_sandboxs_wall_clock():
    """The default `multi_turn.env_timeout_s` (30 s) equalled the swe task's sandbox wall
    clock (30 s): the pool's deadline is raised above the task's own bound on a step."""
    from locojax.envs.pool import env_deadline_s
    from locojax.envs.swe import SWEConfig, workload
    from locojax.rollout.limits import MultiTurnConfig

    task = workload.task(level=1, train_size=2, test_size=1)
    wall = SWEConfig().limits.wall_seconds
    assert task.env_step_s > wall
    assert env_deadline_s(MultiTurnConfig().env_timeout_s, task) > wall
    assert env_deadline_s(1e4, task) == 1e4  # a longer deadline asked for is kept


def test_a_lease_outlasts_the_verifier_calls_it_waits_on():
    """The lease's deadline grows by its largest chunk's scoring bound (the dispatcher adds
    what each worker's `ready` reports), keeping `--verifier-timeout-s < --lease-timeout-s`
    true of the scaled deadlines: else the lease expired first and the unit failed anyway."""
    reward = RewardConfig(timeout_s=5.0, workers=2)
    pool = VerifierPool([object(), object()], timeout_s=150.0, reward=reward)
    lease_timeout_s = 300.0
    for rows in (1, 8, 64, 513):
        chunk = -(-rows // 2)  # the pool's largest chunk over two verifiers
        extra = pool.lease_extra_s(_reward, rows)
        assert extra == scoring_bound_s(chunk, 1, reward)
        assert pool.deadline_s(_reward, chunk) < lease_timeout_s + extra
