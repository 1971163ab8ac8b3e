"""The program model of `benchmarks.predict_programs compiled` (`benchmarks/kernel_model.py`,
`priced.py`): features of a kernel list, the fit, the cores and the phases, on made-up
numbers; and one tiny run's programs compiled and read by the child."""

import math

import pytest

from benchmarks import kernel_model, kernel_tables, priced
from benchmarks.hlo_kernels import Dot, Kernel
from benchmarks.kernel_model import FEATURES, KernelModel
from tests.test_kernel_tables import RATE
from tests.test_kernel_tables import _table as _tables

PRICES = kernel_tables.KernelPrices.of(_tables())  # every matmul at RATE FLOP/s
KERNELS = [Kernel("dot", 1e6, (Dot(1, 64, 256, 1024),), 3.0),
           Kernel("fusion", 4e5, (), 2.0, ops=("add", "multiply")),
           Kernel("fusion", 1e3, (), 1.0, ops=("exponential", "add")),
           Kernel("fusion", 8e6, (), 1.0, ops=("broadcast", "constant")),
           Kernel("copy", 5e4, (), 4.0, ops=("copy",))]


def test_features_count_launches_price_matmuls_and_split_fills_from_other_bytes():
    f = kernel_model.features(KERNELS, PRICES, calls=2.0)
    assert f["call"] == 2.0 and f["launch"] == 2 * (3 + 2 + 1 + 1 + 4)
    # the matmul at the tables' constant rate: exactly its FLOPs over it, per run
    assert f["matmul"] == pytest.approx(2 * 3 * 2 * 64 * 256 * 1024 / RATE, rel=1e-9)
    assert f["fill"] == 2 * 8e6
    assert f["elementwise"] == 2 * (2 * 4e5 + 1e3 + 4 * 5e4)  # the dot's bytes are not here
    assert kernel_model.ALL_MATMUL not in f


def test_the_all_core_weights_price_matmuls_by_the_all_core_tables():
    """Tables at twice the rate price the same matmuls at half the time (exactly: both are
    FLOPs over a constant rate); the all-core fit reads that feature, the one-core fit the
    one-core one."""
    f = kernel_model.features(KERNELS, PRICES, every=kernel_tables.KernelPrices.of(
        _tables(rate=2 * RATE)))
    assert f[kernel_model.ALL_MATMUL] == pytest.approx(f["matmul"] / 2, rel=1e-9)
    m = _model(one=1.0, every=1.0)
    assert m.seconds("train", f, 1.0) == pytest.approx(f["matmul"], rel=1e-9)
    assert m.seconds("train", f, 2.0) == pytest.approx(f["matmul"] / 2, rel=1e-9)
    both = kernel_model.added(f, f)
    assert both[kernel_model.ALL_MATMUL] == pytest.approx(f["matmul"], rel=1e-9)


def test_the_fit_recovers_the_weights_that_made_the_times():
    """Rows made by known non-negative weights from features of full rank: the relative
    least squares has them as its exact solution (residual 0), so NNLS returns them up to
    rounding, far inside 1e-6."""
    truth = {"call": 1e-4, "launch": 1.5e-6, "matmul": 1.3, "elementwise": 7e-11,
             "fill": 3e-10}
    rows = []
    for i in range(8):
        x = {"call": 1.0, "launch": 100.0 * (1 + i) ** 1.3,
             "matmul": 1e-3 * (i % 3 + 1) * (i + 1), "elementwise": 1e6 * (1 + (i * 7) % 5),
             "fill": 1e5 * (1 + (i * 3) % 4) ** 2}
        rows.append((x, kernel_model.priced(truth, x)))
    got = kernel_model.fit(rows)
    for f in FEATURES:
        assert got[f] == pytest.approx(truth[f], rel=1e-6)


def _model(one=2.0, every=1.0):
    weights = {"update": {"call": 0.0, "launch": 0.0, "matmul": 1.0, "elementwise": 0.0,
                          "fill": 0.0}}
    weights.update(prefill=dict(weights["update"]), decode=dict(weights["update"]))
    scale = lambda w, s: {k: {f: v * s for f, v in d.items()} for k, d in w.items()}  # noqa: E731
    return KernelModel(PRICES, {"one": scale(weights, one), "all": scale(weights, every)}, 2.0)


def test_time_goes_from_the_one_core_fit_to_the_all_core_fit_and_slices_below_one():
    m, f = _model(), {"call": 0, "launch": 0, "matmul": 1.0, "elementwise": 0, "fill": 0}
    assert m.seconds("train", f, 1.0) == 2.0 and m.seconds("train", f, 2.0) == 1.0
    assert m.seconds("train", f, 1.5) == pytest.approx(1.5)
    assert m.seconds("prefill", f, 0.5) == 4.0  # half a core: twice one core's time
    assert m.seconds("train", f, 8.0) == 1.0  # no faster than all the calibrated cores


def test_priced_phases_run_the_loop_iterations_and_the_penalty():
    one = {"call": 0, "launch": 0, "matmul": 1e-3, "elementwise": 0, "fill": 0}
    feats = {"train_step": one, "prefill rollout": one, "decode rollout once": one,
             "decode rollout iteration": one, "prefill eval": dict(one, matmul=5.0)}
    got = priced.phases(feats, _model(), iterations=10, cores=2.0, penalty=1.5)
    assert got["train"] == pytest.approx(1.5e-3) and got["prefill"] == pytest.approx(1.5e-3)
    assert got["decode"] == pytest.approx(1.5 * 11e-3)  # once + 10 iterations, no eval
    assert got["reshard"] == 0.0


def test_a_colocated_host_compiles_its_share_of_the_prompts():
    argv = ["demo", "--rollout.prompts-per-step", "8"]
    assert priced.host_argv(argv, "colocated", 4, 8)[-1] == "--rollout.prompts-per-step=2"
    assert priced.host_argv(argv, "single", 4, 8) == argv


def test_compiled_is_refused_without_a_program_model(tmp_path, capsys):
    from benchmarks import predict_programs

    code = predict_programs.main(["compiled", "demo", "--model", "tiny",
                                  "--cluster", "cpu-here-1"])
    assert code == 2 and "predict_programs calibrate" in capsys.readouterr().err


def test_the_child_reads_a_tiny_runs_compiled_programs(tmp_path):
    """The real path on TINY: the run's programs compiled by its memory plan, nothing run,
    and each read into features; the train step does matmuls, the decode loop iterates,
    the cache buffer fills, the gradients are the params' bytes."""
    import jax

    from locojax.model import config, params

    argv = ["demo", "--model", "tiny", "--rollout.prompts-per-step", "2",
            "--algo.group-size", "2", "--rollout.max-new-tokens", "8", "--rollout.ignore-eos",
            "--eval.every", "0", "--steps", "2", "--run-dir", str(tmp_path / "run")]
    feats = priced.features("single", argv, 1, 2, _tables(), _tables())
    assert {"train_step", "prefill rollout", "decode rollout once",
            "decode rollout iteration", "cache rollout"} <= set(feats)
    # the cache buffer, priced by the tables alone: more than one kernel launch of them
    assert feats["cache rollout"]["seconds"] > kernel_tables.KernelPrices.of(_tables()).launch
    assert feats["train_step"]["matmul"] > 0 and feats["train_step"]["call"] == 1.0
    assert feats["decode rollout iteration"]["call"] == 0.0
    assert feats["decode rollout iteration"]["launch"] > 0
    assert feats[priced.GRADIENTS]["bytes"] == 4 * sum(  # f32 params on one device
        x.size for x in jax.tree.leaves(params.init(config.tiny(), jax.random.key(0))))
    assert all(math.isfinite(v) for f in feats.values() for v in f.values())


def test_the_calibration_times_and_reads_its_programs():
    """`calibrate_kernels.rows` on one narrow decoder and one shape: each kind's program is
    compiled, read and timed (a positive time; features that price a matmul), the prefill
    and the decode of one generate apart, each one program call."""
    from benchmarks import calibrate_kernels

    dims = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, vocab_size=64)
    got = calibrate_kernels.rows(PRICES, {"d16": dims}, ((2, 2, 8, 4),), reps=1)
    for kind in kernel_model.KINDS:
        ((feats, seconds),) = got[kind]
        assert seconds > 0 and feats["call"] == 1.0 and feats["matmul"] > 0


def test_compiled_prints_each_phase_priced_beside_the_cost_model(tmp_path, capsys):
    """The command end to end on a calibrated profile with a made-up program model (every
    weight on matmuls only, 1000 s per table second): the priced train step costs exactly
    1000 x the compiled step's matmul feature, and is printed as priced (in ms to 0.1, so
    within 0.05 ms of it)."""
    import json

    from benchmarks import predict_programs
    from locojax.predict import calibrate
    from tests.test_predict_calibrated import MEASURED

    only_matmuls = {"call": 0.0, "launch": 0.0, "matmul": 1e3, "elementwise": 0.0, "fill": 0.0}
    weights = {c: {k: dict(only_matmuls) for k in kernel_model.KINDS} for c in ("one", "all")}
    program_model = {"tables": _tables(), "tables_all": _tables(rate=2 * RATE),
                     "weights": weights, "cores": 2}
    profile = tmp_path / "here.json"
    profile.write_text(json.dumps({**calibrate.profile(MEASURED, "now", "0.0"),
                                   "program_model": program_model}))
    argv = ["demo", "--model", "tiny", "--mode", "single", "--rollout.prompts-per-step", "2",
            "--algo.group-size", "2", "--rollout.max-new-tokens", "8", "--rollout.ignore-eos",
            "--eval.every", "0", "--steps", "2"]
    code = predict_programs.main(["compiled", *argv, "--hardware", str(profile),
                                  "--cluster", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    train = next(ln for ln in out.splitlines() if ln.strip().startswith("train "))
    feats = priced.features("single", argv, 1, 2, _tables(), _tables(rate=2 * RATE))
    assert "(priced;" in train
    # one device on the profile's 2 cores: the all-core weights, the all-core tables
    matmul = feats["train_step"][kernel_model.ALL_MATMUL]
    assert matmul == pytest.approx(feats["train_step"]["matmul"] / 2, rel=1e-9)
    assert float(train.split()[1]) == pytest.approx(1e6 * matmul, abs=0.05 + 1e-9)


def test_a_malformed_program_model_is_refused_by_name():
    good = _model()
    entry = {"tables": _tables(), "tables_all": _tables(), "weights": good.weights,
             "cores": 2}
    assert KernelModel.of(entry).cores == 2.0
    broken = {**entry, "weights": {"one": good.weights["one"]}}  # no all-core fit
    with pytest.raises(ValueError, match=r"weights\.all\.update\.call.*predict_programs calibrate"):
        KernelModel.of(broken)
    with pytest.raises(ValueError, match="lacks tables"):
        KernelModel.of({k: v for k, v in entry.items() if k != "tables"})
    with pytest.raises(ValueError, match="lacks tables_all.*predict_programs calibrate"):
        KernelModel.of({k: v for k, v in entry.items() if k != "tables_all"})  # an old one
