"""SFT: a run cut short on a longer schedule equals that longer run at the same step."""

import jax
import numpy as np

from locojax import sft
from locojax.envs.registry import make_task
from locojax.model import config as model_config, params
from locojax.tokenizer import CharTokenizer


def test_schedule_steps_stops_a_longer_run_early():
    tok, task = CharTokenizer(), make_task("arith", level=1)
    cfg = model_config.PRESETS["tiny"]()
    seen = {}

    def sample_batch(rng, n):
        return [sft.demo_sequence(tok, task.demo(task.train[int(i)]))
                for i in rng.integers(0, len(task.train), n)]

    def run(name, **kw):
        def on_step(i, loss, weights):
            if i == 2:  # the third update: the first whose lr depends on the length
                seen[name] = jax.tree.map(np.asarray, weights)
        sft.train(params.init(cfg, jax.random.key(0)), cfg,
                  sft.SFTConfig(batch_size=4, warmup_steps=1, **kw), sample_batch, tok.pad_id,
                  on_step)

    run("long", steps=4)
    run("cut", steps=3, schedule_steps=4)
    run("short", steps=3)
    same = [np.array_equal(a, b) for a, b in zip(jax.tree.leaves(seen["long"]),
                                                 jax.tree.leaves(seen["cut"]))]
    assert all(same)
    # A 3-step schedule decays faster: without schedule_steps the weights differ.
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(seen["long"]),
                                                        jax.tree.leaves(seen["short"])))
