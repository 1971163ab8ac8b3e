"""A `locojax train` run in this process (modes single and colocated, one host) whose sampler
keeps the starting weights from step `AT` on, while the step's record names the learner's
version: the stale-weights bug class, planted (tests/test_logprob_gap_runs.py).

    PYTHONPATH=. python tests/stale_sampler_run.py AT -- TRAIN_ARGS...   (from the repo root)
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from locojax.commands import train
from locojax.train import source


def plant(at: int) -> None:
    take, kept = source.InlineSource.take, {}

    def stale_take(self, step, params, timer):
        if step == 0:  # host copies of version 0: the update donates the device buffers
            kept["v0"] = jax.tree.map(np.array, params)
        if step < at:
            return take(self, step, params, timer)
        return take(self, step, jax.tree.map(jnp.asarray, kept["v0"]), timer)

    source.InlineSource.take = stale_take


if __name__ == "__main__":
    at, sep, *args = sys.argv[1:]
    assert sep == "--"
    plant(int(at))
    sys.exit(train.main(args))
