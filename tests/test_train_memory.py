"""The train step's activation account traced at two batch sizes and extended to any
(`locojax/train/train_memory.py`, `affine_in_rows`): equal to a trace at the very rows. The
bytes are integers computed from shapes alone, so the equality is exact on any backend."""

import dataclasses

import pytest

from locojax.model import config
from locojax.train import train_memory as tm

GQA = dataclasses.replace(config.tiny(), num_key_value_heads=2)  # grouped keys and values


@pytest.mark.parametrize("cfg", [config.tiny(), GQA], ids=["tiny", "gqa"])
@pytest.mark.parametrize("slots", [0, 5])
def test_a_layers_residuals_extended_from_two_batch_sizes_are_the_traced_ones(cfg, slots):
    for rows in (3, 8, 13):
        assert tm.layer_residual_bytes(cfg, rows, 7, "cpu", slots) == \
            tm.probed_layer_residual_bytes(cfg, rows, 7, "cpu", slots)


@pytest.mark.parametrize("group, p", [(1, 0), (2, 4), (4, 4)])
@pytest.mark.parametrize("remat", [False, True])
def test_the_forwards_residuals_extended_from_two_batch_sizes_are_the_traced_ones(
        group, p, remat):
    cfg = config.tiny()
    for rows in (3 * group, 8 * group):
        assert tm.forward_residual_bytes(cfg, rows, 12, group, p, remat, "cpu") == \
            tm.probed_forward_residual_bytes(cfg, rows, 12, group, p, remat, "cpu")


def test_the_extension_is_exact_only_for_affine_probes():
    """The check above can fail: a probe that is not affine in the rows is not reproduced."""
    assert tm.affine_in_rows(lambda r: 5 + 3 * r, 7) == 5 + 3 * 7
    assert tm.affine_in_rows(lambda r: r * r, 7) != 49
    assert tm.affine_in_rows(lambda r: 10 * r, 12, unit=4) == 120
