"""The layout-invariance harness's fixed problem, its planted bugs, and its multi-process
worker.

Imported by `test_layout_invariance.py` for the fixed global batch and the one-update
runner; run as a script it is one process of a 2-process jax.distributed job on CPU:

    python tests/layout_worker.py PORT PROCESS_ID NPROCESSES DEVICES_PER_PROCESS OUT.npz JOB...

A JOB is `DTYPE/MODE`, `DTYPE/MODE/PLANT` (e.g. `float64/token-mean/host`) or
`DTYPE/MODE/fsdp` (params sharded over one `fsdp` axis spanning every process's devices);
a float64 job runs under `jax.enable_x64`. Process 0 writes every job's results to OUT.npz (keys
`JOB|name`) for the test to compare against its single-device reference.
"""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import numpy as np

B, P, R = 16, 6, 10  # rows (4 groups of 4), prompt columns, response columns
VOCAB = 512  # TINY
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def make_batch(extra_left: int = 0, extra_right: int = 0):
    """The fixed global batch: variable prompt and response lengths, half the rows stale.

    `extra_left` / `extra_right` add padding columns that must change nothing.
    """
    from locojax.rl import batch as batch_lib

    rng = np.random.default_rng(1234)
    prompt_len = rng.integers(2, P + 1, B)
    resp_len = rng.integers(1, R + 1, B)  # 1..R tokens: very uneven rows
    resp_len[3] = R  # someone hits the budget
    pm = np.arange(P)[None] >= (P - prompt_len)[:, None]
    rm = np.arange(R)[None] < resp_len[:, None]
    pt = np.where(pm, rng.integers(1, VOCAB, (B, P)), 0)
    rt = np.where(rm, rng.integers(1, VOCAB, (B, R)), 0)
    # Behaviour logprobs near the TINY model's (ln 1/512 = -6.24), so IS weights land on both
    # sides of the cap; the reference policy likewise.
    behav = rng.uniform(-7.2, -5.4, (B, R))
    ref = np.concatenate([np.zeros((B, P)), rng.uniform(-7.0, -5.5, (B, R))], axis=1)
    rewards = rng.integers(0, 2, B).astype(np.float32) + 0.1 * rng.normal(size=B)
    group = np.repeat(np.arange(B // 4), 4)
    adv = (rewards - rewards.reshape(-1, 4).mean(1).repeat(4)) / (
        rewards.reshape(-1, 4).std(1, ddof=1).repeat(4) + 1e-6)
    batch = batch_lib.from_rollout(pt, pm, rt, rm, behav, adv, group,
                                   staleness=np.arange(B) % 2, ref_logprobs=ref)
    if extra_left or extra_right:
        def pad(x):
            if x.ndim == 1:
                return x
            return np.pad(x, ((0, 0), (extra_left, extra_right)))  # zeros: pad id, False masks
        batch = batch_lib.TrainBatch(**{f: (None if getattr(batch, f) is None else
                                            pad(np.asarray(getattr(batch, f))))
                                        for f in batch.__dataclass_fields__})
    return batch


def learner_config(mode: str, grad_accum: int = 1, rules: str = "train_dp"):
    from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig

    algo = AlgoConfig(name="grpo", loss_agg=mode, beta=0.04, kl_estimator="k3", is_cap=2.0,
                      max_response_len=R)
    # lr 1e-6 (a typical RL lr): Adam's first step is ≈ lr·sign(g), so a gradient entry at
    # the float noise floor may flip sign between layouts; at this lr that moves a param
    # by ≤ 2e-6 absolute, visible but far below the harness tolerance relative to the params.
    optim = OptimConfig(lr=1e-6, weight_decay=0.01, max_grad_norm=1.0)
    return LearnerConfig(algo=algo, optim=optim, grad_accum=grad_accum, rules=rules)


def pg_loss_scale(mode: str) -> float:
    """Σ of |terms| of `actor/pg_loss` on the fixed batch, aggregated like the loss: the scale
    its float error is relative to (the loss is a sum of terms of both signs that largely
    cancel). On-policy ratio is 1, so |term| = |A|·w with w ≤ the IS cap on stale rows."""
    b = make_batch()
    m = np.asarray(b.loss_mask, np.float64)
    stale = np.asarray(b.staleness) > 0
    terms = np.abs(np.asarray(b.advantages, np.float64))[:, None] * np.where(
        stale, learner_config(mode).algo.is_cap, 1.0)[:, None] * m
    n, seqs = m.sum(1), (m.sum(1) > 0).sum()
    return float({
        "token-mean": terms.sum() / m.sum(),
        "seq-mean-token-mean": (terms.sum(1)[n > 0] / n[n > 0]).sum() / seqs,
        "seq-mean-token-sum": terms.sum() / seqs,
        "seq-mean-token-sum-norm": terms.sum() / (seqs * R),
    }[mode])


def planted_aggregate(groups: int, micro_batches: int):
    """A known normalisation bug, for proving that the harness reports it: the loss's
    denominators are counted over the rows in reach instead of the whole update batch.

    The micro-batch's rows are split into `groups` consecutive blocks (each device's or each
    host's rows: `split_rows` keeps every device's rows local, so a micro-batch is laid out
    like the batch), each block is aggregated with counts of its own rows, and the block
    losses are averaged over blocks and micro-batches, as a trainer does that takes a local
    mean on each device (or host, or micro-batch) and then averages gradients. With equal
    counts in every block this is the correct objective; with uneven ones it is not.
    `groups=1` is the micro-batch-local denominator, `groups=devices` the per-device one,
    `groups=hosts` the per-host one.
    """
    import jax

    from locojax.rl import aggregation

    def buggy(values, mask, counts, mode, max_len=0):
        del counts  # the global counts the library computed: the bug ignores them
        split = lambda x: x.reshape(groups, -1, *x.shape[1:])  # noqa: E731  [G, B/G, T]
        local = lambda v, m: aggregation.aggregate(  # noqa: E731
            v, m, aggregation.global_counts(m), mode, max_len)
        return jax.vmap(local)(split(values), split(mask)).sum() / (groups * micro_batches)

    return buggy


PLANTS = ("device", "micro-batch", "host")


def block_token_counts(plant: str, blocks: int) -> list[int]:
    """Response tokens of each block a planted bug normalises by on the fixed batch (each
    device's or host's contiguous rows, or each micro-batch's strided rows): if they were
    all equal, the bug would change nothing and could not be caught."""
    n = np.asarray(make_batch().loss_mask).sum(1)
    parts = n.reshape(blocks, -1) if plant in ("device", "host") else n.reshape(-1, blocks).T
    return [int(x) for x in parts.sum(1)]


@contextlib.contextmanager
def planted(plant: str | None, mesh, grad_accum: int):
    """Patch one of `PLANTS` into the loss's aggregation (see `planted_aggregate`)."""
    if plant is None:
        yield
        return
    import jax

    groups = {"device": mesh.shape["data"], "micro-batch": 1, "host": jax.process_count()}[plant]
    with mock.patch("locojax.rl.losses.aggregate", planted_aggregate(groups, grad_accum)):
        yield


def host_value(x) -> np.ndarray:
    """A global array's full value on this host (gathering it if other hosts hold parts)."""
    from jax.experimental import multihost_utils

    if x.is_fully_addressable:
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))  # collective


def flat(tree, prefix: str) -> dict[str, np.ndarray]:
    import jax

    return {prefix + jax.tree_util.keystr(path): host_value(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def run_layout(mesh, mode: str, grad_accum: int = 1, extra_left: int = 0, extra_right: int = 0,
               process_local: bool = False, rules: str = "train_dp", dtype: str = "float32",
               plant: str | None = None) -> dict[str, np.ndarray]:
    """One update of the fixed problem on `mesh`: grads, optimizer moments, counts, params.

    dtype: params and compute (float64 needs `jax_enable_x64`); the same initial values
    either way (f32 draws, cast). plant: one of `PLANTS`, a known bug (see `planted`).
    """
    import jax

    from locojax.model import config, params
    from locojax.model.sharding import RULES, weight_shardings
    from locojax.rl import batch as batch_lib
    from locojax.rl import train_state, train_step

    if dtype == "float64" and not jax.config.jax_enable_x64:
        raise RuntimeError("run_layout(dtype='float64') needs jax_enable_x64")
    model_cfg = config.tiny(param_dtype=dtype, compute_dtype=dtype)
    cfg = learner_config(mode, grad_accum, rules)
    shardings = weight_shardings(model_cfg, mesh, RULES[rules])
    weights = jax.device_put(params.init(model_cfg, jax.random.key(0)), shardings)
    full = make_batch(extra_left, extra_right)
    if process_local:  # this process's rows only: those of its devices
        per = B // jax.process_count()
        mine = slice(jax.process_index() * per, (jax.process_index() + 1) * per)
        local = jax.tree.map(lambda x: np.asarray(x)[mine], full)
        batch = batch_lib.from_process_local(local, mesh, RULES[rules])
    else:
        batch = batch_lib.shard(full, mesh, RULES[rules])
    train_step.check(batch, cfg)
    state = train_state.init(weights, cfg.optim, model_cfg)
    step = train_step.train_step
    if plant is not None:  # a jit of its own, so no compiled correct step is reused
        step = jax.jit(lambda *a, **k: train_step._train_step(*a, **k),
                       static_argnames=("model_cfg", "cfg", "mesh", "return_grads"))
    with planted(plant, mesh, grad_accum):
        state, metrics, grads = step(state, batch, model_cfg=model_cfg, cfg=cfg, mesh=mesh,
                                     return_grads=True)
    assert jax.tree.leaves(state.params)[0].dtype == np.dtype(dtype)
    # The step keeps every weight and moment where it was (what makes donation useful).
    for tree in (state.params, state.opt_state[1][0].mu, state.opt_state[1][0].nu):
        for got, want in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
            assert got.sharding.is_equivalent_to(want, got.ndim), (got.sharding, want)
    out = flat(grads, "grads")
    out.update(flat(state.params, "params"))
    out.update(flat(state.opt_state, "opt"))
    out["step"] = host_value(state.step)
    out.update({k: host_value(v) for k, v in metrics.items()})
    return out


def main(argv: list[str]) -> int:
    port, pid, nproc, ndev, out_path, *jobs = argv
    import jax

    # Both before the backend starts: devices per process, and gloo for cross-process
    # collectives on CPU.
    jax.config.update("jax_num_cpu_devices", int(ndev))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Short heartbeat: if the peer dies the survivor aborts in seconds, not minutes.
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=int(nproc), process_id=int(pid),
                               initialization_timeout=120, heartbeat_timeout_seconds=10,
                               shutdown_timeout_seconds=30)
    from locojax.model.sharding import make_mesh

    assert jax.process_count() == int(nproc) and len(jax.devices()) == int(nproc) * int(ndev)
    n = len(jax.devices())
    meshes = {"train_dp": make_mesh({"data": n}), "train_fsdp": make_mesh({"data": 1, "fsdp": n})}
    results = {}
    for job in jobs:
        dtype, mode, *extra = job.split("/")
        rules = "train_fsdp" if extra == ["fsdp"] else "train_dp"
        plant = extra[0] if extra and rules == "train_dp" else None
        with jax.enable_x64(dtype == "float64"):
            got = run_layout(meshes[rules], mode, process_local=True, rules=rules,
                             dtype=dtype, plant=plant)
        results.update({f"{job}|{name}": value for name, value in got.items()})
    if jax.process_index() == 0:
        np.savez(out_path, **results)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
