"""Test-session setup: 8 simulated CPU devices, set before anything touches the backend, and
a report header saying where the run happened.

Layout tests build meshes over subsets of these (1, 2, 4 or 8 devices); everything else
runs on device 0. Also the fixtures two modules share: the multi-turn and FSDP reference runs.
"""

import os
import signal

import pytest

# `make test` starts one stream of its multi-process phase as a background job, and sh starts
# those with SIGINT ignored (POSIX; so does a shell's `nohup ... &`), which every child
# inherits: the hosts of `locojax launch` would then outlive the SIGINT it stops them with,
# until its SIGKILL after the grace period. Python's own handler again, as from a terminal
# (tests/test_launch.py restores it for its launcher the same way).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A cheaper XLA:CPU code generator unless the caller chose XLA flags: the suite's programs
# are tiny, so its time is XLA compiling them, not running them, and LLVM at -O0 compiles
# them faster (a TINY `locojax train` of 6 steps: 17.3 s against 25.7 s with the defaults,
# interleaved runs). It is another code path for the same HLO (issue 9's point: every bound
# holds on any CPU and code path; bitwise checks compare one program with itself).
# Inherited by every subprocess a test starts; the header prints it. `make test` adds the
# classic fusion emitters for the in-process phase (see the Makefile), and
# `XLA_FLAGS= make test` runs XLA's defaults.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# A prediction without --cluster uses this machine's calibration where one was written
# (`hardware.default`): the tests' expectations are the shipped example's, whatever this
# machine's ~/.cache holds. A path no run writes; tests of `here` monkeypatch their own.
os.environ["LOCOJAX_PROFILE"] = os.path.join(os.path.dirname(__file__), ".no-calibration.json")
import compile_cache  # noqa: E402

CACHE = compile_cache.configure()  # before jax: the cache every process of the run shares
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", False)
import map_limit  # noqa: E402
from locojax import gc_tuning  # noqa: E402

gc_tuning.tune()  # the suite's processes trace as locojax's do (gc_tuning's docstring)


def _where() -> list[str]:
    """Where this run happens: float results depend on the CPU (XLA:CPU picks kernels by
    model and ISA), XLA:CPU's intra-op thread count and the XLA flags
    (`locojax/float_context.py`)."""
    import jaxlib

    from locojax import float_context

    cpu, isa = float_context.cpu_model()
    usable = float_context.usable_cores()
    return [
        f"cpu: {cpu}, {isa}; {usable} usable of {os.cpu_count()} cores",
        f"jax {jax.__version__}, jaxlib {jaxlib.__version__}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS') or '(none)'}; "
        f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS') or '(unset)'}; "
        f"XLA compilation cache: {CACHE or 'off'}",
    ]


def pytest_report_header(config):
    return _where()


TALLY = compile_cache.Tally()
TALLY.listen()
WORKER_TALLIES: list[dict] = []


def pytest_sessionfinish(session):
    """An xdist worker hands its compile tally to the controller (`pytest_testnodedown`)."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["xla_cache"] = {**TALLY.as_dict(), **map_limit.STATE}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `make test-accelerator` runs without
def pytest_testnodedown(node, error):  # xdist (tests/test_accelerator_target.py)
    WORKER_TALLIES.append(getattr(node, "workeroutput", {}).get("xla_cache", {}))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(
        compile_cache.summary([TALLY.as_dict(), *WORKER_TALLIES], CACHE))
    terminalreporter.write_line(map_limit.summary([map_limit.STATE, *WORKER_TALLIES]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a module (its fixtures torn down), keep the process under the
    kernel's mapping limit (`map_limit`: past it, XLA:CPU's next C++ exception segfaults)."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        map_limit.relieve()


@pytest.fixture(scope="session", autouse=True)
def _f32_dots_on_accelerators():
    """The bounds in `tolerance.py` are derived for f32 arithmetic. XLA:GPU (TF32 on Hopper)
    and XLA:TPU (one bf16 pass) compute f32 dots at jax's default precision with fewer
    mantissa bits: on an H200 the engine's logprobs then differed from the learner's by
    2.0e-3 against a bound of 9e-4, and with "highest" those tests passed (docs/gpu.md).
    On an accelerator the suite asks for f32 dots; on the CPU, where f32 dots are f32
    already, nothing is touched. Runs after collection, so the backend is up by then."""
    if jax.default_backend() != "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")
        os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")  # subprocesses


def pytest_sessionstart(session):
    """`pytest -q` (what `make test` runs) hides the report header: print it anyway, so a
    failure report says where it ran."""
    # "children": the second pytest of `make test-accelerator`, on the CPU by design (its
    # tests' subprocesses hold the chip: tests/backend.py `child_env`).
    if os.environ.get("LOCOJAX_ACCELERATOR_RUN") == "1" and jax.default_backend() == "cpu":
        pytest.exit("`make test-accelerator` found no accelerator: jax.default_backend() is "
                    "cpu (JAX_PLATFORMS, the installed plugins?)", returncode=2)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.config.get_verbosity() < 0:
        for line in _where():
            reporter.write_line(line)


def shared_run(tmp_path_factory, name: str, make):
    """A reference run made once for the session, or once for every pytest process of a run
    that names one folder in LOCOJAX_TEST_SHARED_RUNS: `make test`'s two multi-process
    streams both compare against these runs, and the first to need one makes it while the
    other waits on its lock (the folder is emptied at the start of that phase, so a run is
    this tree's). Both processes run with the same float context, which the tests' bitwise
    comparisons check (`float_context.same_or_raise`)."""
    import fcntl
    import shutil
    from pathlib import Path

    where = os.environ.get("LOCOJAX_TEST_SHARED_RUNS")
    if not where:
        return make(tmp_path_factory.mktemp(name) / "run")
    run = Path(where).resolve() / name
    run.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{run}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = Path(f"{run}.done")
        if not done.exists():
            shutil.rmtree(run, ignore_errors=True)  # a run that failed midway
            make(run)
            done.touch()
    return run


@pytest.fixture(scope="session")
def calc_demo_colocated(tmp_path_factory):
    """The multi-turn reference run (calc_demo_run), made once: single (test_train_multi_turn)
    and lock-step disaggregated (test_ray_modes) must reproduce it."""
    from calc_demo_run import run_colocated

    return shared_run(tmp_path_factory, "calc_demo_colocated", run_colocated)


@pytest.fixture(scope="session")
def fsdp_colocated(tmp_path_factory):
    """The FSDP reference run (fsdp_run), made once: single (test_train_mesh), the controller
    mode and async (test_ray_modes) must reproduce it."""
    from fsdp_run import run_colocated

    return shared_run(tmp_path_factory, "fsdp_colocated", run_colocated)
