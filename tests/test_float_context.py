"""The float context (`locojax/float_context.py`): the intra-op thread count XLA:CPU gives a
process, as XLA's rule computes it, and the refusal of a bitwise comparison between runs
whose processes ran under different contexts."""

import json
import os
import subprocess
import sys

import pytest

from locojax import float_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("env,cores,devices,threads", [
    ({}, 2, 1, 2),  # an unpinned host on 2 cores
    ({}, 1, 1, 1),  # a host launch pinned to one core
    ({}, 1, 2, 2),  # one process x 2 simulated devices, pinned or not: at least one a device
    ({"PJRT_NPROC": "3"}, 1, 1, 3),  # the variables win over the affinity...
    ({"NPROC": "4"}, 2, 1, 4),
    ({"PJRT_NPROC": "1", "NPROC": "4"}, 2, 2, 2),  # ...PJRT_NPROC first, never below devices
    ({"NPROC": "x"}, 2, 1, 2),  # not a number: ignored, as SimpleAtoi fails
])
def test_intra_op_threads_follow_xlas_rule(monkeypatch, env, cores, devices, threads):
    for name in ("PJRT_NPROC", "NPROC"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(float_context, "usable_cores", lambda: cores)
    assert float_context.intra_op_threads(devices) == threads


PROBE = ("import os, sys; from locojax import distributed, float_context; "
         "distributed.initialize(int(sys.argv[1])); print(float_context.intra_op_threads("
         "__import__('jax').local_device_count()), float_context.usable_cores())")


@pytest.mark.slow
def test_launchs_pin_gives_a_one_device_host_one_thread():
    """What the comparisons in tests/test_train_loop.py etc. guard against: a host pinned the
    way `locojax launch` pins it (its `LOCOJAX_CPUS` share, applied before the backend
    starts) has one intra-op thread with one device, while a 2-device process has two."""
    def probe(devices, cpus):
        env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
        env["LOCOJAX_CPUS"] = cpus
        out = subprocess.run([sys.executable, "-c", PROBE, str(devices)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120, check=True)
        return tuple(map(int, out.stdout.split()[-2:]))

    first = str(min(os.sched_getaffinity(0)))
    assert probe(1, first) == (1, 1)
    assert probe(2, first) == (2, 1)


def _write(run_dir, name, **changes):
    ctx = {"platform": "cpu", "cpu": "X (family 25 model 1)", "isa": "avx2",
           "usable_cores": 2, "local_devices": 1, "intra_op_threads": 2, "xla_flags": "",
           "jax": "0.10.2", "jaxlib": "0.10.2", "matmul_precision": "None", **changes}
    os.makedirs(run_dir / float_context.DIR, exist_ok=True)
    (run_dir / float_context.DIR / f"{name}.json").write_text(json.dumps(ctx))


def test_same_context_passes_and_any_difference_is_named(tmp_path):
    a, b = tmp_path / "single", tmp_path / "colocated"
    _write(a, "host0", local_devices=2)
    _write(b, "host0")
    _write(b, "host1")
    # usable cores and devices differ, the thread count they give does not: comparable
    assert float_context.same_or_raise(str(a), str(b))["intra_op_threads"] == 2
    _write(b, "host1", usable_cores=1, intra_op_threads=1)  # pinned to one core
    with pytest.raises(float_context.ContextMismatch, match="intra_op_threads: 2 .* 1 in "
                                                            "colocated/host1"):
        float_context.same_or_raise(str(a), str(b))
    _write(b, "host1", xla_flags="--xla_cpu_use_fusion_emitters=false")
    with pytest.raises(float_context.ContextMismatch, match="xla_flags"):
        float_context.same_or_raise(str(a), str(b))


def test_a_run_without_a_context_is_not_comparable(tmp_path):
    _write(tmp_path / "a", "host0")
    (tmp_path / "b").mkdir()
    with pytest.raises(float_context.ContextMismatch, match="recorded no float context"):
        float_context.same_or_raise(str(tmp_path / "a"), str(tmp_path / "b"))


def test_record_writes_this_process(tmp_path):
    float_context.record(str(tmp_path), "host0")
    (ctx,) = float_context.read(str(tmp_path)).values()
    assert ctx["platform"] == "cpu" and ctx["local_devices"] >= 1
    assert ctx["intra_op_threads"] == float_context.intra_op_threads(ctx["local_devices"])
    assert ctx["xla_flags"] == os.environ.get("XLA_FLAGS", "")
