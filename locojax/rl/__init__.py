"""The learner: advantages, the policy objective, global loss aggregation and the train step.

Start at `train_step.py`; the objective is `losses.py` + `aggregation.py`; algorithms are
registry entries in `algorithms.py`; docs/objectives.md has the equations.

    config.py           the learner's config: algorithm, optimizer, the update's layout
    advantages.py       outcome advantages from per-sequence rewards
    algorithms.py       named algorithms: an advantage estimator plus loss settings
    losses.py           the per-token objective: clipped ratio, KL, truncated IS weight
    aggregation.py      loss aggregation over tokens, normalised by global counts
    batch.py            the train batch: one pytree of [B, T] arrays
    buckets.py          the batch cut to the step's real length
    logprobs.py         per-token logprobs of a batch under a policy
    gradients.py        one update's sums over micro-batches and devices
    logprob_gap.py      the sampler-learner logprob gap: metrics, bound, the check
    micro_batches.py    how many micro-batches, when the config says auto
    train_state.py      params, optimizer state, counters
    host_memory.py      held state kept in host memory between the programs that read it
    train_step.py       one learner step
    split_step.py       the train step as separate programs, timed apart
"""
