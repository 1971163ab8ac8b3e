"""`locojax predict` at pod scale: a run that fits in no layout exits non-zero naming the
smallest that does; the layout is chosen for speed among those that fit (so a larger model
is never predicted faster); throughput, chip-hours and their range are printed; the
controller's dispatch measured here is not used for a pod without saying so."""

import dataclasses

import pytest

from locojax.commands import predict, predict_report
from locojax.predict import hardware, layout, modes, presets, spec
from locojax.predict.phases import Ctx


def run(capsys, *argv):
    code = predict.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_run_that_does_not_fit_exits_naming_the_smallest_layout_that_fits(capsys):
    code, out, err = run(capsys, "workload", "gsm8k", "--model", "qwen3-4b", "--cluster",
                         "v5e-8")
    assert code == predict.DOES_NOT_FIT
    assert "DOES NOT FIT" in out and "step time" not in out  # no step times for it
    assert "The smallest layout that fits: 64 chips" in err and "tpu-v5e-64" in err


def test_a_run_that_fits_in_no_layout_says_why(capsys):
    # FSDP's train step gathers the whole weights in the compute dtype (the memory plan's
    # `expected_train_temporaries`): 8B's 16.4 GB of bf16 exceed a v5e chip's 16 GB at any
    # chip count.
    code, _, err = run(capsys, "workload", "gsm8k", "--model", "qwen3-8b", "--cluster",
                       "v5e-8")
    assert code == predict.DOES_NOT_FIT and "no layout of up to" in err
    # Another profile's chip holds them: H200's 141 GB.
    assert "Smallest that fit on the other shipped profiles:" in err and "h200-" in err


def _ctx(model: str, cluster: str) -> Ctx:
    wl, workers = presets.load("gsm8k")
    return Ctx(spec.load(model)[0], model, wl, hardware.parse_cluster(cluster),
               env_workers=workers)


def test_the_layout_is_the_fastest_that_fits():
    ctx = _ctx("qwen3-4b", "v5e-64")
    best = layout.choose(ctx)
    assert best.fits and best.tried > 1
    for tp in (1, 2, 4, 8):  # every other tp that fits is no faster
        c = layout.choose(dataclasses.replace(ctx, tp=tp), layout.Given(tp=tp))
        if c.fits:
            assert modes.colocated(c.ctx).step >= best.step


def test_given_layout_is_kept():
    c = layout.choose(_ctx("qwen3-0.6b", "v5e-16"), layout.Given(tp=2, fsdp=4, remat=True))
    assert (c.plan.settings["mp"], c.plan.settings["fsdp"], c.plan.settings["remat"]) == \
        (2, 4, True)


def test_a_larger_model_is_never_faster_on_the_same_chips():
    ctx = _ctx("qwen3-0.6b", "v7x-64")
    steps = []
    for m in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"):
        c = layout.choose(dataclasses.replace(ctx, cfg=spec.load(m)[0], model_name=m))
        assert c.fits
        steps.append(modes.colocated(c.ctx).step)
    assert steps == sorted(steps), steps


def test_throughput_chip_hours_and_their_range(capsys):
    code, out, _ = run(capsys, "workload", "gsm8k", "--model", "qwen3-0.6b", "--cluster",
                       "v5e-64")
    assert code == 0
    assert "| mode | samples/s | per chip | tokens/s | per chip | chip-hours / 1,000 steps |" \
        in out
    assert "verdicts that flip in that range:" in out
    row = next(line for line in out.splitlines() if line.startswith("| colocated | ")
               and "(" in line)
    assert row.count("(") == 5  # every figure with its range
    # The Ray round trip measured here is named as such where a pod's controller uses it.
    assert "Ray call round trip measured on this machine" in out


def test_waves_where_only_the_cache_does_not_fit():
    ctx = _ctx("qwen3-0.6b", "v5e-8")
    ctx = dataclasses.replace(ctx, wl=dataclasses.replace(ctx.wl, prompts=1024))
    c = layout.choose(ctx)
    assert c.fits and c.plan.settings["waves"] > 1 and c.ctx.waves == c.plan.settings["waves"]
    assert "waves" in c.describe() and "fewer" in predict_report.wave_note(c)


def test_matmul_efficiency_falls_below_a_tile_of_rows():
    from locojax.predict.devices import Roofline, mxu_rows
    from locojax.predict.flops import Costs
    from locojax.predict.origin import Ledger

    hw = hardware.load("v7x")
    roof, tile = Roofline(hw, "bfloat16", Ledger()), float(mxu_rows(hw))
    compute_bound = Costs(flops=1e15, bytes=1.0)
    t_iter = float(hw.loop_iteration_s)
    full = roof.seconds("train", compute_bound, rows=tile) - t_iter
    half = roof.seconds("train", compute_bound, rows=tile / 2) - t_iter
    # Exact up to float rounding of one division (rel 1e-12 is a thousand ulps).
    assert half == pytest.approx(2 * full, rel=1e-12)
    # Above a tile the full η: the same float operations but one, within approx's 1e-6.
    assert roof.seconds("train", compute_bound, rows=4 * tile) == pytest.approx(full + t_iter)


def test_collectives_hide_under_the_train_compute_on_accelerators_only():
    pod, here = _ctx("qwen3-0.6b", "v5e-16"), _ctx("qwen3-0.6b", "cpu-here-2")
    layers = pod.cfg.num_hidden_layers
    # approx's default 1e-6: a few float operations on numbers of order 1.
    assert pod.exposed_collectives(1.0, 100.0) == pytest.approx(1.0 / layers)  # one layer's
    hidden = 0.8 * 1.0 * (layers - 1) / layers  # η_ovl 0.8 of the other layers' compute
    assert pod.exposed_collectives(10.0, 1.0) == pytest.approx(10.0 - hidden)
    assert here.exposed_collectives(1.0, 100.0) == 1.0  # gloo between processes: none
