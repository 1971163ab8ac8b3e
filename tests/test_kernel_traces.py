"""How a profiler trace's events become kernel times (`benchmarks/kernel_traces.py`)."""

from types import SimpleNamespace as NS

from benchmarks.kernel_traces import _union, kernel_spans


def _line(name, *events):
    return NS(name=name, events=[NS(name=n, start_ns=b, end_ns=e) for n, b, e in events])


def test_kernels_the_starting_thread_ran_count_beside_the_pools():
    """XLA:CPU's client thread that starts a program runs kernels itself while no other is
    ready; a small program under load ran whole there, and its dots then showed no time. The
    executor's own spans and the Python thread's events are not kernels."""
    planes = [NS(name="/host:CPU", lines=[
        _line("tf_XLAPjRtCpuClient/123", ("ThunkExecutor::Execute", 0, 100),
              ("dot.1", 10, 30), ("ThreadpoolListener::Record", 30, 31)),
        _line("tf_XLAEigen/456", ("dot.1", 40, 45), ("while.2", 50, 90), ("fusion.3", 60, 70)),
        _line("python", ("dot.1", 0, 1000)),
    ])]
    assert dict(kernel_spans(planes)) == {"dot.1": [(10, 30), (40, 45)],
                                         "fusion.3": [(60, 70)]}


def test_a_kernels_active_time_is_the_union_of_its_events():
    assert _union([(0, 10), (5, 15), (20, 25)]) == 20
    assert _union([(0, 30), (5, 15)]) == 30
