"""The Ray modes end to end: equivalence with colocated (single- and multi-turn), a
deterministic DA schedule, preemption (a killed or hung worker, a verifier stuck holding the
GIL, a killed learner, a killed parameter server) that changes nothing, and bounded retries
(a unit that kills or hangs every worker stops the run, naming it).

All runs share one local Ray cluster (2 CPUs) and one JAX compilation cache, so an actor
that Ray restarts, and every run after the first, loads its programs instead of compiling
them. The model is the embedded checkpoint, whose rewards vary within groups from the
first step, so every step really moves the params and a comparison of params is not
vacuous. Runs are 3 steps of 8 prompts x 4 samples (the multi-turn one: calc-demo's
embedded tiny-calc checkpoint, 2 steps, see calc_demo_run).

Bitwise comparisons hold because every run here has the same shapes everywhere: a lease of
4 prompts is generated as one batch of 16 rows on one device, like each colocated host's
share, and the learner trains the same global batch on the same devices.
"""

import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ray = pytest.importorskip("ray")

from calc_demo_run import CALC_DEMO_ARGS  # noqa: E402
from fsdp_run import FSDP_ARGS, tokens_by_step  # noqa: E402
from test_train_loop import _rollouts  # noqa: E402

from locojax import float_context  # noqa: E402
from locojax.train.config import PRESETS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
COMMON = [
    "--model", "embedded",  # the loose-format checkpoint: its rewards vary within groups
    "--rollout.prompts-per-step", "8", "--algo.group-size", "4", "--eval.every", "0",
    "--optim.lr", "3e-4", "--optim.warmup-steps", "0", "--no-progress", "--no-tensorboard",
    "--dump-rollouts", "--checkpoint.every", "1", "--steps", str(STEPS),
]


def worker_gap(key: str) -> bool:
    """The sampler-learner gap's metrics: in the Ray modes the rollout workers measure the
    gap with their own forward (`rollout/logprob_mismatch`, the histogram's
    `rollout/logprob_gap/*`), and the trainer's largest gap and its bound
    (`rl/logprob_gap.py`) are logged by the in-process modes only."""
    return key == "rollout/logprob_mismatch" or key.startswith(
        ("rollout/logprob_gap", "rollout/logit_terms"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tmp_path_factory.mktemp("jax_cache")
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache), "RAY_DEDUP_LOGS": "0",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0", "LOCOJAX_HEARTBEAT_S": "10"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # inherited by the cluster's workers and by subprocesses
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def config(run_dir, *args, preset=("demo", *COMMON)):
    import tyro

    name, *common = preset
    return tyro.extras.overridable_config_cli(
        PRESETS, args=[name, "--run-dir", str(run_dir), *common, *args])


def train(run_dir, *args, faults=None, preset=("demo", *COMMON)):
    from locojax.fleet import controller, driver
    from locojax.fleet.faults import Faults

    cfg = config(run_dir, *args, preset=preset)
    return (controller if cfg.mode == "controller" else driver).run(cfg, faults or Faults())


# A lease, and a verifier call, also cover their rows' worst-case scoring (`--reward.timeout-s`
# per call, 2 reward workers): a lease of 16 rows gets 40 s more at the default 5 s, which a
# test of a hung worker or verifier waits out. The demo's rewards take microseconds, so 2 s
# times none out (a timeout would score 0 and change the run), and a hang is found 24 s
# sooner per lease.
SHORT_SCORING = ("--reward.timeout-s", "2")
# A run that must stop on a poisoned unit reads no score: there a timed-out reward (0) changes
# nothing the test checks, so its rows' scoring adds 8 x 0.25 = 2 s to a lease, and each of
# the two hung attempts is found 14 s sooner (the healthy leases still get 8 s, their programs
# compiled at the worker's warm-up: `RolloutWorker.ready`).
NO_SCORES_READ = ("--reward.timeout-s", "0.25")

DA = ("--mode", "disaggregated", "--hosts", "3", "--rollout-fraction", "0.67",
      "--lease-timeout-s", "60")  # 1 learner host, 2 rollout workers


def params(run_dir):
    from locojax.model.loader import load

    return jax.tree.leaves(load(os.path.join(run_dir, "final_model"),
                                param_dtype="float32").weights)


def assert_bitwise_equal(a, b):
    float_context.same_or_raise(str(a), str(b))  # the precondition of bitwise
    pa, pb = params(a), params(b)
    assert len(pa) == len(pb)
    for x, y in zip(pa, pb):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def assert_same_tokens(a, b):
    """Every step's sampled tokens equal, whichever processes dumped them."""
    ta, tb = tokens_by_step(str(a)), tokens_by_step(str(b))
    assert ta and sorted(ta) == sorted(tb)
    for step in ta:
        np.testing.assert_array_equal(ta[step], tb[step])


def check_net_bytes(run_dir):
    """perf/net/*_bytes of a 2-device data-parallel run against its parameter count P: the
    ring all-reduce sends 2(D - 1)/D x 4 B x P = 4P per update (one here); a weight push or
    pull moves the f32 params, 4P; the controller's dispatch is the prompts' int32 tokens
    and bool masks, its gather the rows' int32 tokens, bool masks and f32 logprobs and each
    host's int32 iteration count."""
    from locojax.train.build import sized

    cfg = sized(config(run_dir))[0]  # P as the run resolved it (auto)
    p = sum(np.asarray(x).size for x in params(run_dir))
    b, r = cfg.rollout.prompts_per_step, cfg.rollout.prompts_per_step * cfg.group_size
    for row in jsonl(os.path.join(run_dir, "perf.jsonl")):
        assert row["perf/net/allreduce_bytes"] == 4 * p
        if "perf/net/dispatch_bytes" in row:
            assert row["perf/net/dispatch_bytes"] == b * cfg.rollout.max_prompt_tokens * 5
            assert row["perf/net/gather_bytes"] == r * cfg.rollout.max_new_tokens * 9 + 2 * 4
            assert row["perf/net/scatter_bytes"] > 0
        if "perf/net/weight_sync_push_bytes" in row:
            assert row["perf/net/weight_sync_push_bytes"] == 4 * p
            assert row["perf/net/weight_sync_pull_bytes"] % (4 * p) == 0


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


EVERY_PROMPT_ONCE = {s + 1: sorted(np.repeat(np.arange(8 * s, 8 * s + 8), 4).tolist())
                     for s in range(STEPS)}
"""`trained_groups` of a run that trained each step's 8 prompts x G 4 once, in its step."""


def trained_groups(run_dir):
    """{step: sorted group ids of every row trained at that step} from the rollout dumps."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, "rollouts", "*.npz")):
        step = int(os.path.basename(path)[4:9])
        out.setdefault(step, []).extend(np.load(path)["group_ids"].tolist())
    return {s: sorted(v) for s, v in out.items()}


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """An uninterrupted disaggregated run (k = 1): the run every fault run must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_dir, *DA)
    return str(run_dir)


@pytest.mark.timeout(900)  # 5 runs, and the shared FSDP reference when first to use it
def test_lock_step_modes_equal_colocated(cluster, fsdp_colocated, tmp_path):
    """The controller mode, async with k = 0 and disaggregated with k = 0 (no overlap) give
    colocated's params, bitwise: 2 hosts x 1 device, each generating and training half the
    batch (admitting and scoring it too, but under the controller). The chunked controller
    run and the async run train with `--train.mesh data=1,fsdp=2` and reproduce colocated's
    FSDP run (tests/fsdp_run.py), bitwise: the same sharded train step on the same devices,
    and rollouts generated with the same bits (the params gathered whole: each controller
    host's engine, and each version the async learner publishes)."""
    colo = tmp_path / "colocated"
    out = subprocess.run(
        # unpinned, as the Ray actors run (tests/fsdp_run.py says why)
        [sys.executable, "-m", "locojax.cli", "launch", "--hosts", "2", "--heartbeat-s", "10",
         "--no-pin-cpus", "--", "train", "demo", "--mode", "colocated", "--run-dir", str(colo),
         *COMMON],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    # controller: the same 2 hosts and train step; admission, scoring and advantages
    # central. Only where the work runs differs, so every metric is colocated's too.
    train(tmp_path / "controller", "--mode", "controller", "--hosts", "2")
    assert_bitwise_equal(colo, tmp_path / "controller")
    assert jsonl(tmp_path / "controller" / "metrics.jsonl") == jsonl(colo / "metrics.jsonl")
    perf = jsonl(tmp_path / "controller" / "perf.jsonl")
    assert all(p["perf/controller/round_trips"] == 2 for p in perf)  # a call per host, step
    # --controller.decode-chunk 2, FSDP: the same rows, 2 decode iterations per round trip
    chunked = tmp_path / "chunked"
    train(chunked, "--mode", "controller", "--hosts", "2", "--controller.decode-chunk", "2",
          preset=("demo", *FSDP_ARGS))
    assert_bitwise_equal(fsdp_colocated, chunked)
    assert jsonl(chunked / "metrics.jsonl") == jsonl(fsdp_colocated / "metrics.jsonl")
    assert_same_tokens(fsdp_colocated, chunked)
    iterations = [m["rollout/decode_iterations"]
                  for m in jsonl(fsdp_colocated / "metrics.jsonl")]
    for p, i in zip(jsonl(tmp_path / "chunked" / "perf.jsonl"), iterations, strict=True):
        # each host's ceil(its iterations / 2) calls: ceil(I / 2) to ceil(I / 2) + 2 in all
        assert -(-i // 2) <= p["perf/controller/round_trips"] <= -(-i // 2) + 2, (p, i)
    check_net_bytes(tmp_path / "controller")
    # disaggregated, no overlap: 2 learner hosts joined by jax.distributed, 2 workers.
    train(tmp_path / "da", "--mode", "disaggregated", "--hosts", "4", "--rollout-fraction",
          "0.5", "--max-staleness", "0")
    assert_bitwise_equal(colo, tmp_path / "da")
    check_net_bytes(tmp_path / "da")
    # async, k = 0, FSDP over the 2 learner hosts, through the CLI joining this cluster: 1
    # worker makes both leases.
    out = subprocess.run(
        [sys.executable, "-m", "locojax.cli", "train", "demo", "--mode", "async",
         "--max-staleness", "0", "--workers", "1", "--learner-hosts", "2", "--hosts", "3",
         "--prompts-per-lease", "4", "--ray-address", cluster,
         "--run-dir", str(tmp_path / "async"), *FSDP_ARGS],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_bitwise_equal(fsdp_colocated, tmp_path / "async")
    assert_same_tokens(fsdp_colocated, tmp_path / "async")
    text = out.stdout + out.stderr
    assert "async: 2 learner host(s) + 1 rollout worker(s)" in text
    for prefix in ("(learner 0 pid=", "(learner 1 pid=", "(worker 0 pid=", "(dispatcher pid="):
        assert prefix in text  # logs are prefixed by role and index
    rows = jsonl(tmp_path / "async" / "metrics.jsonl")
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]
    assert all(r["rollout/staleness/max"] == 0 for r in rows)
    check_net_bytes(colo)
    check_net_bytes(tmp_path / "async")  # the pushed versions are the whole params
    assert all(p["perf/phase/reshard"] > 0 for p in jsonl(tmp_path / "async" / "perf.jsonl"))
    # Every metric colocated logs (rewards, losses, ...) is the same number, but the
    # sampler-learner gap: here the workers measure the mismatch with their own forward,
    # and the trainer's gap histogram and bound are the in-process modes' (`worker_gap`).
    mismatch = "rollout/logprob_mismatch"
    for c, a in zip(jsonl(fsdp_colocated / "metrics.jsonl"), rows, strict=True):
        assert {k: a[k] for k in c if not worker_gap(k)} == \
            {k: c[k] for k in c if not worker_gap(k)}
        # A full forward vs the engine's cached decode: f32 rounding of logits of magnitude
        # ~10 through d=128 dot products gives gaps ~1e-5 per token at most; the mean is far
        # below that. A sampler/trainer disagreement (wrong temperature, version) is >= 1e-2.
        assert 0 <= a[mismatch] < 1e-4


@pytest.mark.timeout(900)  # and the shared references, when first to use them
def test_disaggregated_fsdp_trains_its_first_step_as_colocated_fsdp(reference, fsdp_colocated,
                                                                     tmp_path):
    """disaggregated, k = 1, the learner on `--train.mesh data=1,fsdp=2` over its 2 hosts of
    1 device (the fsdp group spans them, so each published version crosses hosts: the
    `meshes.host_copy` path), 2 workers. Steps 1 and 2 both train rows of version 0 (one
    step stale), published from the sharded initial params: their tokens are bitwise the
    data-parallel DA reference's (version 0 is the same bits whatever the learner's layout).
    Step 1 (fresh rows) is colocated FSDP's step 1 (tests/fsdp_run.py), every metric bitwise
    but the workers' logprob check: the same sharded train step on the same devices and
    rows. Each kept version is the params whole: the last one is the export, bitwise."""
    from locojax.checkpoint import Checkpointer

    run = tmp_path / "da_fsdp"
    train(run, "--mode", "disaggregated", "--hosts", "4", "--rollout-fraction", "0.5",
          "--lease-timeout-s", "60", preset=("demo", *FSDP_ARGS))
    rows = jsonl(run / "metrics.jsonl")
    assert [r["rollout/staleness/mean"] for r in rows] == [0.0, 1.0]
    mine, ref = tokens_by_step(str(run)), tokens_by_step(reference)
    assert sorted(mine) == ["step00001", "step00002"]
    for step in mine:
        np.testing.assert_array_equal(mine[step], ref[step])
    mismatch = "rollout/logprob_mismatch"
    colo = jsonl(fsdp_colocated / "metrics.jsonl")[0]
    assert {k: rows[0][k] for k in colo if not worker_gap(k)} == \
        {k: colo[k] for k in colo if not worker_gap(k)}
    assert 0 <= rows[0][mismatch] < 1e-4  # as in test_lock_step_modes_equal_colocated
    versions = Checkpointer(str(run / "checkpoints")).restore_rollout(2)["versions"]
    final = params(run)
    assert len(jax.tree.leaves(versions["v2"])) == len(final)
    for a, b in zip(jax.tree.leaves(versions["v2"]), final):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    p = sum(np.asarray(x).size for x in final)
    for perf in jsonl(run / "perf.jsonl"):
        assert perf["perf/net/weight_sync_push_bytes"] == 4 * p  # the whole f32 params
        assert perf["perf/phase/reshard"] > 0


def test_controller_tp_samples_what_it_samples_without_tp(cluster, tmp_path):
    """The controller mode with `--rollout.tp 2` on 2 hosts x 2 devices (each host's engine
    splits heads, MLP and vocabulary over its 2 devices) samples the rows tp 1 samples, one
    step against the same run without tp, as far as test_rollout_tp.py's contract allows.

    The two forwards are the same sums in another order: each logit within `tol` = 2 x
    probabilistic(DEPTH) x Σ_d |h_d e_vd| (`hf_reference.measured_logit_tol`'s form, with
    DEPTH = 8192 >= the embedded model's ~4.8k reduction terms in sequence: 4 layers x
    (norm 128, projections 128, q/k norm 32, scores 32, softmax and p.v <= 20 each, o-proj
    128, norm 128, gate/up 128, down 384), final norm 128, logits 128), and by
    Cauchy-Schwarz Σ_d |h_d e_vd| <= |h| |e_v| <= sqrt(D) max|final norm scale| max|e_v| for
    every prompt (RMSNorm leaves |x / rms(x)| = sqrt(D)). The uniforms are bitwise alike, so
    a draw changes only if its uniform lies within the CDF's shift (each log-prob moves by
    at most 2 tol / τ) of one of its token's two boundaries: probability <= 4 tol / τ per
    draw, q <= 4 tol / τ x max_new_tokens per row. The rows whose tokens differ are then at
    most the count a Binomial(rows, q) exceeds with probability < 1e-9 (for the embedded
    model, 16 of 32), while a wrong split changes nearly every row from its first draw.
    Rows alike have log-probs within the bound, not all bitwise (the tensor-parallel
    program really ran), and agree with the trainer's, as in the async tp test."""
    import math

    from locojax.model.loader import load
    from tests.tolerance import probabilistic

    args = ("--mode", "controller", "--hosts", "2", "--devices-per-host", "2")
    one = [a if a != str(STEPS) else "1" for a in COMMON]  # one step
    train(tmp_path / "tp1", *args, preset=("demo", *one))
    train(tmp_path / "tp2", *args, "--rollout.tp", "2", preset=("demo", *one))
    fields = ("tokens", "mask", "logprobs")
    a, b = _rollouts(str(tmp_path / "tp1"), fields), _rollouts(str(tmp_path / "tp2"), fields)
    assert sorted(a) == sorted(b) == ["step00001"]
    (ta, mask, la), (tb, _, lb) = a["step00001"], b["step00001"]
    rows, same = len(ta), (ta == tb).all(axis=1)
    differ = int(rows - same.sum())

    cfg = config(tmp_path / "tp1")
    w = load("embedded", param_dtype="float32").weights
    terms = math.sqrt(w["embed"].shape[1]) * float(np.abs(w["final_norm"]).max()) * float(
        np.linalg.norm(np.asarray(w["embed"]), axis=1).max())
    tol = 2 * probabilistic(8192) * terms  # DEPTH
    q = 4 * tol / cfg.rollout.temperature * cfg.rollout.max_new_tokens
    bound = next(k for k in range(rows + 1) if sum(
        math.comb(rows, j) * q ** j * (1 - q) ** (rows - j) for j in range(k + 1, rows + 1))
        < 1e-9)
    assert bound <= rows // 2, (q, bound)  # the check can tell a broken split
    assert differ <= bound, f"{differ} of {rows} rows differ (bound {bound}, q {q:.3g})"
    # Rows alike: each sampled token's log-prob moves by at most 2 tol / τ, plus the
    # rounding of each run's V-term log-sum-exp (`hf_reference.logprob_tol`'s form).
    gap = np.abs(la - lb)[same][mask[same]]
    assert gap.max() <= 2 * tol / cfg.rollout.temperature + 2 * probabilistic(8192), gap.max()
    assert (la != lb).any()  # tp 2 ran another program (its partial sums round otherwise)
    for r in jsonl(tmp_path / "tp2" / "metrics.jsonl"):
        assert 0 <= r["rollout/logprob_mismatch"] < 1e-4  # as in the async tp test


@pytest.mark.parametrize("mode", [
    # 2 learner hosts, 2 workers running the calculator tool on their own hosts (same lease
    # shapes as each colocated host's)
    ("--mode", "disaggregated", "--hosts", "4", "--rollout-fraction", "0.5",
     "--max-staleness", "0"),
    # 2 hosts, each continuing its own rows in its KV cache turn by turn as the controller
    # asks; every tool call runs on the controller
    ("--mode", "controller", "--hosts", "2"),
], ids=["disaggregated", "controller"])
def test_multi_turn_lock_step_equals_colocated(cluster, calc_demo_colocated, tmp_path, mode):
    """calc-demo, disaggregated with k = 0 and the controller mode: the same trajectories,
    tool calls included, and bitwise the same params as the colocated reference."""
    train(tmp_path, *mode, preset=("calc-demo", *CALC_DEMO_ARGS))
    assert_bitwise_equal(calc_demo_colocated, tmp_path)
    fields = ("group_ids", "tokens", "mask", "env_mask")
    a, b = _rollouts(str(calc_demo_colocated), fields), _rollouts(str(tmp_path), fields)
    assert sorted(a) == sorted(b) and len(a) == 2
    for step in a:
        for x, y in zip(a[step], b[step], strict=True):
            np.testing.assert_array_equal(x, y)
    assert sum(rows[3].any(1).sum() for rows in b.values()) >= 2  # tools were called
    assert all(r["env/errors"] == 0 for r in jsonl(tmp_path / "metrics.jsonl"))


def test_disaggregated_schedule_is_deterministic(reference, tmp_path):
    """k = 1: step s trains rows generated by version s - 1 while step s + 1 is being
    generated; the version schedule, hence the whole run, does not depend on timing."""
    train(tmp_path, *DA)
    assert_bitwise_equal(reference, tmp_path)
    a, b = jsonl(os.path.join(reference, "metrics.jsonl")), jsonl(tmp_path / "metrics.jsonl")
    assert a == b
    assert [r["rollout/staleness/mean"] for r in a] == [0.0, 1.0, 1.0]
    assert all("actor/is_weight/p50" in r for r in a[1:])  # stale rows: IS weights at work
    perf = jsonl(tmp_path / "perf.jsonl")
    assert all(p["perf/sync/seconds"] > 0 for p in perf)


# `timing`: a hung worker and verifier are found by their deadlines (the Makefile runs it
# with no other test beside it)
@pytest.mark.parametrize("faults", [pytest.param("workers_ps_verifier", marks=pytest.mark.timing),
                                    "kill_learner"])
def test_faults_change_nothing(reference, tmp_path, faults, capfd):
    """kill -9 a worker mid-generation, hang one, kill -9 the parameter server, get a
    verifier stuck holding the GIL (one run: Ray restarts each, and each loses a lease, a
    pull or a call), and kill -9 the learner after it published a version (the other run: it
    resumes from the checkpoint before): every prompt is trained once, and the final params
    are bitwise the reference's."""
    from locojax.fleet.faults import Faults

    faults, extra, fired = {
        # Step 1: the first worker to decode dies. Step 2: the first to pull version 1 finds
        # the server dead (it is restored from the learner's kept versions); the first to
        # decode hangs, alive but not progressing, found out only by its lease's deadline.
        # Verifier 0's third call (after the two workers' warm-up calls) backtracks a regex
        # forever, holding the GIL: the pool kills it at its deadline (3 s plus its rows'
        # reward deadlines) and calls verifier 1; the scores, hence the run, are the same.
        "workers_ps_verifier": (
            Faults(kill_worker_at_step=1, hang_worker_at_step=2, kill_ps_at_version=1,
                   hang_verifier_after_calls=2),
            ("--lease-timeout-s", "8", "--verifiers", "2", "--verifier-timeout-s", "3",
             *SHORT_SCORING),
            ("kill_worker", "hang_worker", "kill_ps", "hang_verifier")),
        # After the update of step 1 and after publishing version 2 (workers may be
        # generating step 3 with it), before checkpoint 2: resumes from checkpoint 1 and
        # publishes version 2 again, the same bytes.
        "kill_learner": (Faults(kill_learner_after_publish=1), (),
                         ("kill_learner_after_publish",)),
    }[faults]
    train(tmp_path, *DA, *extra, faults=faults)
    for fault in fired:
        assert os.path.exists(tmp_path / "faults" / fault), fault  # it did fire
    assert_bitwise_equal(reference, tmp_path)
    assert jsonl(tmp_path / "metrics.jsonl") == jsonl(os.path.join(reference, "metrics.jsonl"))
    groups = trained_groups(str(tmp_path))
    assert groups == EVERY_PROMPT_ONCE  # every prompt once: none lost, none twice
    if faults == "workers_ps_verifier":  # the killed and the hung worker's leases, at least
        perf = jsonl(tmp_path / "perf.jsonl")
        assert max(p.get("perf/rollout/redispatched_leases", 0) for p in perf) >= 2
        # The killed server was found restarted and restored, and logged with what from.
        assert perf[-1]["perf/sync/ps_restores"] >= 1
        time.sleep(2)  # actor logs reach the driver's stderr a moment later
        err = capfd.readouterr().err
        assert re.search(r"parameter server restarted \(incarnation \w+ -> \w+\): restored "
                         r"version\(s\) \d+ \(\w+\)(, \d+ \(\w+\))* from learner host 0's "
                         r"kept copies", err), err[-3000:]


def test_a_killed_controller_host_stops_the_run_naming_it(cluster, tmp_path):
    """Host 1 dies after the update of step 0: the controller's next call to it fails, and
    the run stops with the host's name (a single controller cannot go on without it)."""
    from locojax.fleet.faults import Faults

    with pytest.raises(RuntimeError, match="controller host 1 died"):
        train(tmp_path, "--mode", "controller", "--hosts", "2", faults=Faults(kill_host_after=0))
    assert os.path.exists(tmp_path / "faults" / "kill_host")  # it did fire
    assert not (tmp_path / "final_model").exists()


def test_a_corrupted_version_stops_the_run(cluster, tmp_path):
    """A worker that receives a version whose bytes do not match its checksum refuses it,
    and the run stops with that error rather than train on it."""
    from locojax.fleet.faults import Faults

    with pytest.raises(Exception, match="checksum .* expected .*corrupted or mixed"):
        train(tmp_path, *DA, faults=Faults(corrupt_version=0))
    assert not (tmp_path / "final_model").exists()


def test_async_keeps_every_sample_within_k_versions(cluster, tmp_path):
    """k = 2, workers pulling the newest version: a row may be up to 2 versions old (which
    rows are depends on timing), never more, and still every prompt trains exactly once.
    Hosts of 2 devices, and `--rollout.tp 2`: each worker's engine splits heads, MLP and
    vocabulary over its 2 devices, and its rows' logprobs still agree with the trainer's."""
    train(tmp_path, "--mode", "async", "--max-staleness", "2", "--workers", "2", "--hosts", "3",
          "--lease-timeout-s", "60", "--devices-per-host", "2", "--rollout.tp", "2")
    # Each worker says so in its own log file (forwarding those lines to the driver's stderr
    # can lag the end of a short run by longer than the test waits). Only this module's test
    # runs rollout workers at tp 2, and the module has one Ray session: this cluster's, not
    # session_latest (another pytest process's cluster may have started after it).
    ready = "ready (engine mesh {'data': 1, 'tensor': 2}"
    session = ray._private.worker._global_node.get_session_dir_path()
    logs = glob.glob(os.path.join(session, "logs", "worker-*"))
    assert sum(ready in Path(f).read_text(errors="replace") for f in logs) == 2
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == STEPS
    for r in rows:
        assert r["rollout/staleness/max"] <= 2
        # As in test_lock_step_modes_equal_colocated: f32 rounding of a forward against the
        # cached decode, in another order of the same sums (tensor-parallel partial sums),
        # is ~1e-5 per token at most; a sampler/trainer disagreement is >= 1e-2.
        assert 0 <= r["rollout/logprob_mismatch"] < 1e-4
        # Ratios of row counts out of 32: only f64 rounding (1e-16) separates the sum from 1.
        assert sum(r[f"rollout/staleness/frac_{s}"] for s in range(3)) == pytest.approx(1.0)
    assert rows[0]["rollout/staleness/max"] == 0  # step 0 can only be made by version 0
    groups = trained_groups(str(tmp_path))
    assert groups == EVERY_PROMPT_ONCE


@pytest.mark.parametrize("poison", [pytest.param("hang", marks=pytest.mark.timing), "kill"])
def test_a_unit_that_fails_every_worker_stops_the_run_naming_it(cluster, tmp_path, capfd, poison):
    """Bounded retries: unit 0 of step 1 hangs (or kills) every worker that decodes it. After
    its second failed attempt (--max-attempts 2) the run stops with an error naming the
    step, the unit, the worker and the last error, rather than leasing it forever; while it
    waits, the learner warns, naming the unit and its holder."""
    from locojax.fleet.driver import RunFailed
    from locojax.fleet.faults import Faults

    with pytest.raises(RunFailed, match=r"step 1 unit 0 \(prompts 0-3\) failed 2 time\(s\), "
                                        r"the last on worker \d") as e:
        train(tmp_path, *DA, "--lease-timeout-s", "6", "--max-attempts", "2",
              "--stall-warning-s", "2", *NO_SCORES_READ,
              faults=Faults(poison_unit=(1, 0), poison=poison))
    assert ("held past its deadline" if poison == "hang" else "died") in str(e.value)
    assert not (tmp_path / "final_model").exists()
    if poison == "hang":  # the learner waited at least one lease: it said for what
        time.sleep(2)  # actor logs reach the driver's stderr a moment later
        err = capfd.readouterr().err
        assert re.search(r"waited \d+ s for the rollouts of step 1: step 1: \d of 2 unit\(s\) "
                         r"in; unit 0 (held by worker \d|queued)", err), err[-3000:]


def test_a_worker_that_never_warms_up_stops_the_run(cluster, tmp_path):
    """A warm-up that hangs is held by no lease: the start deadline kills it, Ray restarts
    the worker, and the second miss in a row (--max-attempts 2) stops the run, naming the
    worker, rather than waiting for it forever."""
    from locojax.fleet.driver import RunFailed
    from locojax.fleet.faults import Faults

    with pytest.raises(RunFailed, match=r"worker \d did not warm up .* within --start-timeout-s "
                                        r"4, 2 time\(s\) in a row"):
        train(tmp_path, *DA, "--start-timeout-s", "4", "--max-attempts", "2",
              faults=Faults(hang_warmup=True))
    assert not (tmp_path / "final_model").exists()


def test_an_async_learner_restart_republishes_and_workers_pull_again(cluster, tmp_path):
    """async (k = 2), the learner killed after publishing version 2 and before its
    checkpoint: the restarted group resumes from checkpoint 1 and publishes versions under
    the same numbers, whose bytes may differ (the rows it retrains with depend on timing).
    Workers reuse a cached version only if its checksum is the one a lease names, and the
    dispatcher refuses any result made with other bytes, so the run completes with every
    prompt trained once and every row within k versions."""
    from locojax.fleet.faults import Faults

    train(tmp_path, "--mode", "async", "--max-staleness", "2", "--workers", "2", "--hosts", "3",
          "--lease-timeout-s", "60", faults=Faults(kill_learner_after_publish=1))
    assert os.path.exists(tmp_path / "faults" / "kill_learner_after_publish")
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["rollout/staleness/max"] <= 2 for r in rows)
    groups = trained_groups(str(tmp_path))
    assert groups == EVERY_PROMPT_ONCE


@pytest.mark.timing  # versions published while units decode
def test_async_inflight_updates_take_newer_versions_mid_unit(cluster, tmp_path):
    """`--inflight-chunk 2` (issue 59 item 1): workers check for a newer version every 2
    decode iterations, each check slowed to 0.5 s so that the learner publishes versions
    while units decode. Some tokens are then sampled by a newer version than their unit
    started with (token staleness below row staleness), every token stays within k = 2, the
    versions taken were verified (the dispatcher checks their checksums), the logprob check
    still holds on the tokens of each unit's own version, and every prompt trains once."""
    from locojax.fleet.faults import Faults

    train(tmp_path, "--mode", "async", "--max-staleness", "2", "--workers", "2", "--hosts", "3",
          "--lease-timeout-s", "60", "--inflight-chunk", "2",
          faults=Faults(slow_version_check_s=0.5))
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == STEPS
    for r in rows:
        assert r["rollout/staleness/max"] <= 2
        # Ratios of token counts: only f64 rounding (1e-16) separates the sum from 1.
        assert sum(r[f"rollout/token_staleness/frac_{s}"] for s in range(3)) \
            == pytest.approx(1.0)
        assert r["rollout/token_staleness/mean"] <= r["rollout/staleness/mean"]
        assert 0 <= r["rollout/logprob_mismatch"] < 1e-4  # as in the test above
    assert any(r["rollout/token_staleness/mean"] < r["rollout/staleness/mean"] for r in rows)
    groups = trained_groups(str(tmp_path))
    assert groups == EVERY_PROMPT_ONCE


@pytest.mark.timing  # a step cut before its slow unit is in
def test_async_partial_rollouts_train_every_unit_once_despite_a_kill(cluster, tmp_path):
    """`--partial-rollouts` (issue 59 item 2), with in-flight updates: unit 1 of step 0 is
    slow (8 s) and the first worker to decode a unit of step 1 is killed mid-generation.
    Steps are cut without waiting for the slow unit, which trains in a later step; the
    killed unit is generated again and its lost attempt never trains. The final
    checkpoint's ledger (which step trained which unit) names every unit of the run
    exactly once, and the rollout dumps hold every prompt once."""
    from locojax.checkpoint import Checkpointer
    from locojax.fleet.faults import Faults

    train(tmp_path, "--mode", "async", "--max-staleness", "2", "--workers", "2", "--hosts", "3",
          "--lease-timeout-s", "60", "--partial-rollouts", "--inflight-chunk", "4",
          faults=Faults(slow_unit=(0, 1), slow_unit_s=8.0, kill_worker_at_step=1))
    assert os.path.exists(tmp_path / "faults" / "kill_worker")
    ckpt = Checkpointer(str(tmp_path / "checkpoints"))
    leases = ckpt.read_meta(ckpt.latest_step())["rollouts"]["leases"]
    trained = {(s, u): t for s, u, t in leases["trained"]}
    assert sorted(trained) == [(s, u) for s in range(STEPS) for u in range(2)]
    assert sorted(trained.values()) == sorted(list(range(STEPS)) * 2)  # 2 units a step
    assert trained[(0, 1)] > 0  # the slow unit did not hold step 0 up
    assert leases["redispatched"] >= 1  # the killed worker's unit went back
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["rollout/staleness/max"] <= 2 for r in rows)
    groups = trained_groups(str(tmp_path))
    assert groups == EVERY_PROMPT_ONCE


@pytest.mark.parametrize("mode", ["disaggregated", "async", "controller"])
def test_a_sampler_on_stale_weights_stops_the_run_naming_both_versions(cluster, tmp_path, mode):
    """Issue 59 item 4 in the Ray modes: from step 2 on every sampler keeps version 0's
    weights while it holds and names a newer version (`Faults.stale_sampler_at_step`). In
    disaggregated and async each rollout worker scores its unit with its own forward on the
    weights it names, logs the gap's histogram (`rollout/logprob_gap/*`, every step) and
    reports a unit past the bound, and the learner stops naming the unit's version and its
    own; the controller's hosts sample inline, so the learner's check names both. Why the
    gap is past the bound: --optim.lr 1e-2 moves each weight ~1e-2 per AdamW step, logits by
    O(0.1), against an f32 bound of ~1e-2 (tests/test_logprob_gap_runs.py)."""
    from locojax.fleet.faults import Faults

    args = {"disaggregated": DA, "controller": ("--mode", "controller", "--hosts", "2"),
            "async": ("--mode", "async", "--workers", "2", "--hosts", "3",
                      "--lease-timeout-s", "60")}[mode]
    with pytest.raises(Exception) as e:
        train(tmp_path, *args, "--optim.lr", "1e-2", faults=Faults(stale_sampler_at_step=2))
    if mode == "controller":
        named = re.search(r"generated by weights version (\d+) and the learner scored it with "
                          r"version (\d+)", str(e.value))
    else:
        named = re.search(r"sampler holding and naming weights version (\d+) while the "
                          r"learner is at version (\d+)", str(e.value))
    assert named, str(e.value)[-3000:]
    sampler, learner = int(named[1]), int(named[2])
    assert learner == 2 and 1 <= sampler <= learner  # version 0's weights, named otherwise
    assert not (tmp_path / "final_model").exists()
    rows = jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # the steps before the planted one ...
    for r in rows:  # ... logged the gap's histogram, every token's gap within the bound
        assert 0 <= r["rollout/logprob_gap/zero"] <= 1 and "rollout/logprob_gap/p99" in r
        assert r.get("rollout/logprob_gap/units_past_bound", 0.0) == 0.0
