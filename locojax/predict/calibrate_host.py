"""The host half of `locojax predict calibrate`: a step's Python work, timed through the
run's own functions on this machine.

- `admission_per_prompt`: tokenize one arith prompt (`envs.prompt.encode_prompt`);
- `reward_fixed` + `reward_per_row.arith` · rows: the `detokenize_reward` phase
  (`single_turn.scored`) on completions of `COMPLETION` char tokens;
- `batch_fixed` + `batch_per_row` · rows: a single host's `batch` phase
  (`Producer.assemble`, `buckets.fit`, the device put);
- `step_fixed`, `tensorboard_s`: one metrics line written by `MetricsLogger.log` (20
  numbers fetched from the device, 20 floats), and what TensorBoard adds to it.
The fixed and per-row parts are the line through `ROWS`' two sizes: small batches cost
mostly their call's Python and device put, which one rate per row cannot say.
"""

from __future__ import annotations

import statistics
import time
import types

ROWS = (16, 256)
"""The two batch sizes of each line: the smallest and largest a validation point runs."""
COMPLETION = 32
GROUP = 4


def median_time(fn, reps: int, warm: int = 2) -> float:
    """The median seconds of `reps` calls of `fn` after `warm` untimed ones."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_flops(n: int = 1024, reps: int = 5, dtype: str = "float32") -> float:
    """Matmul FLOP/s of this process's default device in `dtype` (2 n^3 per product)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(jnp.dot)
    return 2 * n ** 3 / median_time(lambda: f(a, b).block_until_ready(), reps)


def _line(time_of, sizes=ROWS) -> tuple[float, float]:
    """(fixed seconds, seconds per row) through the times at two sizes; a slope that noise
    made negative is 0 (the larger batch costs no less), the fixed part at least 0."""
    (n1, n2), (t1, t2) = sizes, (time_of(sizes[0]), time_of(sizes[1]))
    slope = max((t2 - t1) / (n2 - n1), 0.0)
    return max(t1 - slope * n1, 0.0), slope


def _rollouts(rows: int):
    """An arith step's producer and its scored rollouts of `rows` random char completions,
    with the function that scores them again (the `detokenize_reward` phase)."""
    import jax
    import numpy as np

    from locojax.engine.sampling import SamplingConfig
    from locojax.envs.registry import make_task
    from locojax.envs.rewards import RewardRunner
    from locojax.rl.config import AlgoConfig
    from locojax.rollout import single_turn
    from locojax.tokenizer.char import CharTokenizer
    from locojax.train.producer import Producer

    task, tok, runner = make_task("arith", level=3), CharTokenizer(), RewardRunner()
    examples = [task.train[i] for i in range(rows // GROUP)]
    prompts, mask = single_turn.encode_prompts(tok, examples, 48)
    rng = np.random.default_rng(0)
    gen = types.SimpleNamespace(
        tokens=rng.integers(1, tok.vocab_size, (rows, COMPLETION)).astype(np.int32),
        mask=np.ones((rows, COMPLETION), bool), logprobs=np.zeros((rows, COMPLETION),
                                                                  np.float32),
        steps=COMPLETION)
    producer = Producer(None, tok, task, runner, None, AlgoConfig(group_size=GROUP),
                        SamplingConfig(max_new_tokens=COMPLETION), len(examples), 48,
                        jax.random.key(0))

    def score():
        rows = single_turn.unscored(gen, examples, prompts, mask, 0, GROUP)
        return producer.shaped(single_turn.scored(rows, tok, task, runner))
    return producer, score


def reward_seconds(rows: int) -> float:
    _, score = _rollouts(rows)
    return median_time(score, 5)


def batch_seconds(rows: int) -> float:
    import jax
    import numpy as np

    from locojax.rl import batch as batch_lib
    from locojax.rl import buckets
    from locojax.train import meshes

    producer, score = _rollouts(rows)
    out = score()
    mesh, rules = meshes.train_mesh(meshes.TrainConfig(), jax.devices()[:1])

    def batch():
        _, local, stats = producer.assemble([out], np.zeros(rows // GROUP, np.int64), 0)
        local, _ = buckets.fit(local)
        return jax.block_until_ready(batch_lib.shard(local, mesh, rules))
    return median_time(batch, 5)


def admission_seconds(prompts: int = 256) -> float:
    from locojax.envs.prompt import encode_prompt
    from locojax.envs.registry import make_task
    from locojax.tokenizer.char import CharTokenizer

    task, tok = make_task("arith", level=3), CharTokenizer()
    t0 = time.perf_counter()
    for i in range(prompts):
        encode_prompt(tok, task.train[i])
    return (time.perf_counter() - t0) / prompts


def _log_seconds(tensorboard: bool, reps: int = 20) -> float:
    """Seconds of one `MetricsLogger.log` of a step's metrics line: 20 numbers still on the
    device (the train step's, each fetched to the host as it is written) and 20 floats."""
    import tempfile

    import jax
    import jax.numpy as jnp

    from locojax.metrics import MetricsLogger

    f = jax.jit(lambda x: {f"actor/m{i}": x * i for i in range(20)})
    floats = {f"rollout/m{i}": float(i) for i in range(20)}
    with tempfile.TemporaryDirectory() as d:
        logger = MetricsLogger(d, tensorboard=tensorboard)
        step = [0]

        def one():
            step[0] += 1
            logger.log(step[0], {**f(jnp.float32(step[0])), **floats})
        t = median_time(one, reps)
        getattr(logger, "close", lambda: None)()
    return t


def step_bookkeeping() -> tuple[float, float]:
    """(seconds of a step's metrics line without TensorBoard, the seconds TensorBoard adds):
    what a step does inside its clock besides its phases (`loop.py` logs its timings after
    the clock stops)."""
    plain = _log_seconds(False)
    return plain, max(_log_seconds(True) - plain, 0.0)


def host_rates() -> dict[str, float]:
    """Every rate of the module docstring, in seconds."""
    reward_fixed, reward_row = _line(reward_seconds)
    batch_fixed, batch_row = _line(batch_seconds)
    step_fixed, tensorboard = step_bookkeeping()
    return {"admission_per_prompt": admission_seconds(), "reward_fixed": reward_fixed,
            "reward_per_row.arith": reward_row, "batch_fixed": batch_fixed,
            "batch_per_row": batch_row, "step_fixed": step_fixed, "tensorboard_s": tensorboard}
