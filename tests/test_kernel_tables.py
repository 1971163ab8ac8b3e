"""Pricing a compiled program kernel by kernel from kernels timed alone
(`benchmarks/kernel_tables.py`): the arithmetic of the tables, on made-up numbers."""

import itertools

import pytest

from benchmarks import kernel_tables
from benchmarks.kernel_tables import KernelPrices
from benchmarks.hlo_kernels import Dot, Kernel

LAUNCH = 2e-6
RATE = 1e11  # FLOP/s of every synthetic matmul


def _table(rate=RATE, skip=()):
    """A kernel table whose every matmul runs at `rate` plus one launch."""
    dots = {}
    for m, k, n in itertools.product(kernel_tables.DOT_M, kernel_tables.DOT_KN,
                                     kernel_tables.DOT_KN):
        if k <= n and (m, k, n) not in skip:
            dots[f"{m},{k},{n}"] = LAUNCH + 2.0 * m * k * n / rate
    return {"launch_s": LAUNCH, "call_s": 1e-4, "dot_s": dots,
            "bandwidth": {"65536": 1e11, "67108864": 1e10}}


def test_a_timed_matmul_costs_its_table_entry_less_the_launch():
    prices = KernelPrices.of(_table())
    assert prices.dot(Dot(1, 64, 256, 1024)) == pytest.approx(2 * 64 * 256 * 1024 / RATE)


def test_between_and_past_the_grid_a_constant_rate_stays_constant():
    """At one rate everywhere, the time of every shape is its FLOPs over that rate: the log
    interpolation of t - launch is exact for t proportional to m k n, and past the edges
    the scaling by FLOPs is too (rounding only)."""
    prices = KernelPrices.of(_table())
    for d in (Dot(1, 100, 300, 700), Dot(3, 40, 16, 20), Dot(1, 9000, 576, 49152),
              Dot(1, 2, 8, 8)):
        assert prices.dot(d) == pytest.approx(d.flops / RATE, rel=1e-9)


def test_k_and_n_cost_alike_in_either_order():
    prices = KernelPrices.of(_table())
    assert prices.dot(Dot(1, 64, 1024, 256)) == prices.dot(Dot(1, 64, 256, 1024))


def test_untimed_large_points_scale_from_the_largest_timed_m():
    big = (4096, 4096, 4096)
    prices = KernelPrices.of(_table(skip={big}))
    assert prices.dots[big] == pytest.approx(_table()["dot_s"]["1024,4096,4096"] * 4)


def test_a_grid_with_a_hole_no_m_fills_is_refused():
    table = _table()
    for m in kernel_tables.DOT_M:
        del table["dot_s"][f"{m},64,256"]
    with pytest.raises(ValueError, match="no matmul near"):
        KernelPrices.of(table)


def test_a_kernel_is_its_launch_plus_the_larger_of_its_matmuls_and_its_bytes():
    prices = KernelPrices.of(_table())
    assert prices.rate(65536) == pytest.approx(1e11)
    assert prices.rate(2 ** 26) == pytest.approx(1e10)
    mid = prices.rate(2 ** 21)  # halfway in log bytes: the geometric mean of the rates
    assert mid == pytest.approx((1e11 * 1e10) ** 0.5)
    memory = Kernel("fusion", 2 ** 21, (), 3.0)
    assert prices.seconds([memory]) == pytest.approx(3 * (LAUNCH + 2 ** 21 / mid))
    matmul = Kernel("dot", 1.0, (Dot(1, 256, 256, 256),), 1.0)
    assert prices.kernel(matmul) == pytest.approx(LAUNCH + 2 * 256 ** 3 / RATE)

