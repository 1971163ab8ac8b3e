"""The discrete-event simulation of the buffered modes against closed forms.

- DA with one-step overlap (k = 1) and fixed times is a two-stage pipeline: its steady step
  is max(train + push, one step's rollout), rollout = ceil(leases / workers) x lease time.
- Lock-step (k = 0) serialises them: rollout + train + push.
- Lock-step with W workers, one lease each, exponential lease times of mean D: the step
  waits for the slowest, E[max of W Exp(D)] = D H_W (H_W the harmonic number), plus train.
- async staleness: when training is the bottleneck the workers run ahead until the gate, so
  every sample is exactly k versions old; when rollout is (one lease per worker per step),
  each lease starts just before the previous version is published: staleness 1.
- Processor sharing: two equal one-core tasks on one shared core both end at twice the time.
- A short run's end: with k at least the run's steps, every lease may start on the first
  version, so the rollouts are all in early and the later updates have the cores alone.
"""

import math

import numpy as np
import pytest

from locojax.predict.simulate import Spec, Task, run


def spec(**kw):
    base = dict(steps=40, leases_per_step=4, workers=2, max_staleness=1, newest=False,
                lease=lambda g: Task.fixed(1.0), train=lambda g: Task.fixed(1.5),
                sync=lambda g: Task.fixed(0.1))
    base.update(kw)
    return Spec(**base)


def steady(res, skip=10):
    return res.step_times()[skip:]


def test_one_step_overlap_is_a_pipeline():
    # Rollout-bound: 4 leases on 2 workers = 2.0 s per step > train + push = 1.6 s.
    assert np.allclose(steady(run(spec())), 2.0)
    # Learner-bound: train 3.0 + push 0.1 > 2.0.
    assert np.allclose(steady(run(spec(train=lambda g: Task.fixed(3.0)))), 3.1)


def test_lock_step_serialises_rollout_and_training():
    assert np.allclose(steady(run(spec(max_staleness=0))), 2.0 + 1.5 + 0.1)


def test_lock_step_waits_for_the_slowest_of_exponential_leases():
    w, n, train = 4, 4000, 0.5
    res = run(spec(max_staleness=0, workers=w, leases_per_step=w, steps=n, seed=1,
                   lease=lambda g: Task.fixed(g.exponential(1.0)),
                   train=lambda g: Task.fixed(train), sync=lambda g: Task.fixed(0.0)))
    expected = sum(1 / i for i in range(1, w + 1)) + train
    # Var[max of W Exp(1)] = Σ 1/i²: 4 standard errors of the mean of n steps.
    se = math.sqrt(sum(1 / i ** 2 for i in range(1, w + 1)) / n)
    assert abs(res.step_times().mean() - expected) < 4 * se


def test_async_staleness_in_both_regimes():
    learner_bound = run(spec(newest=True, max_staleness=3, train=lambda g: Task.fixed(5.0)))
    assert np.all(learner_bound.staleness[20:] == 3)
    rollout_bound = run(spec(newest=True, max_staleness=3, workers=4, leases_per_step=4,
                             lease=lambda g: Task.fixed(2.0), train=lambda g: Task.fixed(0.5)))
    assert np.all(rollout_bound.staleness[20:] == 1)
    assert np.allclose(steady(rollout_bound), 2.0)
    # The deterministic DA schedule never exceeds k either.
    assert run(spec(max_staleness=2)).staleness.max() <= 2


def test_processor_sharing_splits_a_shared_core():
    one_core = lambda g: Task(lambda c: 1.0 / min(c, 1.0))  # noqa: E731  1 s on a whole core
    res = run(spec(steps=1, leases_per_step=2, workers=2, lease=one_core, shared_cores=1.0,
                   train=lambda g: Task.fixed(0.0), sync=lambda g: Task.fixed(0.0)))
    assert np.allclose(res.step_end, [2.0])


def test_a_chained_task_runs_after_its_first_with_its_own_processes():
    """Guards the lease's env part (`Task.then`): it starts when the first part ends and
    shares the cores as `procs` processes. Two leases at once on 2 shared cores: both first
    parts (1 core-second, 1 process each) take 1 s; then 2 x 4 env processes get 0.25 core
    each, and 4 processes x 0.25 core-second each take 1 s more."""
    core_s = lambda c: 1.0 / min(c, 1.0)  # 1 s on a whole core
    env = Task(lambda c: 0.25 / min(c, 1.0), 4)
    res = run(spec(steps=1, leases_per_step=2, workers=2, shared_cores=2.0,
                   lease=lambda g: Task(core_s, 1, env), train=lambda g: Task.fixed(0.25),
                   sync=lambda g: Task.fixed(0.1)))
    assert np.allclose(res.step_end, [2.0 + 0.25 + 0.1])


def test_a_short_runs_rollouts_are_in_early_when_k_covers_it():
    """One worker and the learner share one core; a lease is 0.1 core-second, an update 1,
    a push nothing; one lease a step, 6 steps.
    - k = 1: each update overlaps the next step's lease, so the core does 1.1 s of work
      a step: steps [1.2, 1.1, 1.1, 1.1, 1.1, 1.0] (the first pays lease 0 alone, the last
      has no lease beside it).
    - k = 6: all six leases may use version 0. The other five (0.5 core-s) share the core
      with the first update (1.0 s for them, 0.5 of the update), which then ends alone at
      0.1 + 1.0 + 0.5 = 1.6; every later update has the core to itself: 1.0 s.
    bench_placement's steady steps of a 6-step run (placement.Window(6, 2): steps 3..5)
    then read 1.1 and 1.0: a long run's steady state (1.1) would overstate the second."""
    from locojax.predict.placement import Window

    core = lambda w: (lambda c: w / min(c, 1.0))  # noqa: E731  w seconds on a whole core
    base = dict(steps=6, leases_per_step=1, workers=1, shared_cores=1.0,
                lease=lambda g: Task(core(0.1)), train=lambda g: Task(core(1.0)),
                sync=lambda g: Task.fixed(0.0))
    k1 = run(spec(max_staleness=1, **base)).step_times()
    k6 = run(spec(max_staleness=6, **base)).step_times()
    assert np.allclose(k1, [1.2, 1.1, 1.1, 1.1, 1.1, 1.0])
    assert np.allclose(k6, [1.6, 1.0, 1.0, 1.0, 1.0, 1.0])
    w = Window(6, 2)
    kept = slice(w.skip, w.steps - 1)
    assert np.median(k1[kept]) == pytest.approx(1.1) and np.median(k6[kept]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no steady step"):
        Window(3, 2)
