"""How long locojax's programs take on one host's chips: a roofline for accelerators, and for
a machine `locojax predict calibrate` measured, its measured rates (`calibrated.py`).

Program kinds: `prefill`, `decode_step` (one iteration of the decode loop), `train` (one
update), `forward` (a no-grad forward, e.g. a reference model's).

Roofline (accelerators; Williams, Waterman & Patterson 2009): a program moving `bytes` and
doing `flops` on c chips takes
    max(flops / (c · peak · η_mxu · min(1, m / t)), bytes / (c · bw_hbm · η_hbm)) + t_iter
with η_mxu, η_hbm and t_iter the profile's stated efficiency factors and per-call overhead,
m the rows (tokens) of the program's matmuls per chip and t the matrix unit's rows: below
a tile's rows part of the unit idles, so efficiency falls with the batch per chip.
"""

from __future__ import annotations

import dataclasses

from locojax.predict.flops import Costs
from locojax.predict.hardware import Hardware
from locojax.predict.origin import Const, Ledger

@dataclasses.dataclass
class Roofline:
    """An accelerator's program times from its profile (see the module docstring)."""

    hw: Hardware
    dtype: str
    ledger: Ledger

    def seconds(self, kind: str, c: Costs, chips: float = 1.0, cores: float = 0.0,
                rows: float = 0.0, blocks: float = 0.0) -> float:
        """`rows`: the rows of the program's matmuls on each chip (tokens; 0: unknown, the
        full η_mxu). Fewer rows than the matrix unit's tile leave part of it idle. `blocks`
        (a decode step's attention loop, `phases.cache_read`) is a calibrated chip's term."""
        g = self.ledger.get
        h = self.hw
        peak = g(f"{h.name}.peak_flops.{self.dtype}", h.peak(self.dtype))
        eta = g(f"{h.name}.matmul_efficiency", h.matmul_efficiency)
        if rows:
            eta *= min(1.0, rows / g(f"{h.name}.mxu_rows", mxu_rows(h)))
        bw = g(f"{h.name}.hbm_bandwidth", h.hbm_bandwidth)
        eta_m = g(f"{h.name}.hbm_efficiency", h.hbm_efficiency)
        t_iter = g(f"{h.name}.loop_iteration_s", h.loop_iteration_s)
        return max(c.flops / (chips * peak * eta), c.bytes / (chips * bw * eta_m)) + t_iter


_MXU_ROWS = {"tpu-v5e": 128, "tpu-v5p": 128, "tpu-v6e": 256, "tpu-v7x": 256}
"""Rows of the matrix unit's tile, by profile (a GPU's tensor-core tile: 64)."""


def mxu_rows(hw: Hardware) -> Const:
    """The profile's `mxu_rows`, else the stated default of its chip (an assumption)."""
    if isinstance(hw.extra.get("mxu_rows"), Const):
        return hw.extra["mxu_rows"]
    rows = _MXU_ROWS.get(hw.name, 128 if hw.kind == "tpu" else 64)
    return Const(rows, "rows", "assumed",
                 "a matmul of m < t rows uses m/t of a t-row matrix unit: TPU v5e and v5p "
                 "MXUs are 128 x 128, v6e and v7x 256 x 256 (cloud.google.com/tpu/docs, "
                 "system architecture); a GPU tensor-core instruction's tile is 64 rows "
                 "(Hopper wgmma m64)")


def device_model(hw: Hardware, dtype: str, layers: int, ledger: Ledger):
    """The program times of a decoder of `layers` layers computing in `dtype` on `hw`."""
    if hw.kind == "calibrated":  # `locojax predict calibrate`'s profile (calibrated.py)
        from locojax.predict.calibrated import Calibrated

        return Calibrated(hw, layers, ledger, dtype)
    return Roofline(hw, dtype, ledger)
