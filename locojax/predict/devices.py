"""How long locojax's programs take on one host's chips: a roofline for accelerators, a fit
measured at N = 1 for this machine's CPU.

Program kinds: `prefill`, `decode_step` (one iteration of the decode loop), `train` (one
update), `forward` (a no-grad forward, e.g. a reference model's).

Roofline (accelerators; Williams, Waterman & Patterson 2009): a program moving `bytes` and
doing `flops` on c chips takes
    max(flops / (c · peak · η_mxu · min(1, m / t)), bytes / (c · bw_hbm · η_hbm)) + t_iter
with η_mxu, η_hbm and t_iter the profile's stated efficiency factors and per-call overhead,
m the rows (tokens) of the program's matmuls per chip and t the matrix unit's rows: below
a tile's rows part of the unit idles, so efficiency falls with the batch per chip.

CPU fit (`cpu-here`): per kind, t(1 core) = a + flops / F1: a fixed cost per call (Python
dispatch, the small ops between matmuls) and a single-core FLOP rate, fitted by least
squares to runs of `locojax train` at N = 1 and several batch sizes, per model and prompt
and completion shape (P, N: what a call costs besides its matmuls, e.g. the prefill's
sampling draws for all N steps and its cache writes, is fixed per shape and scales with the
rows, as the FLOPs do); on c cores the FLOP part
splits as Amdahl's law, a serial share (1 - φ) and a parallel share φ / c, with φ fitted to
the same runs on 2 cores. Below one core (more busy processes than cores, each getting
c < 1 of one) a program is time-sliced: t(c) = t(1) / c. The shipped example's fits were made
by a script since replaced (the profile's sources name it); `locojax predict calibrate`
measures this machine instead (`calibrated.py`).
"""

from __future__ import annotations

import dataclasses

from locojax.predict.flops import Costs
from locojax.predict.hardware import Hardware
from locojax.predict.origin import Const, Ledger

KINDS = ("prefill", "decode_step", "train", "forward")


@dataclasses.dataclass
class Roofline:
    """An accelerator's program times from its profile (see the module docstring)."""

    hw: Hardware
    dtype: str
    ledger: Ledger

    def seconds(self, kind: str, c: Costs, chips: float = 1.0, cores: float = 0.0,
                rows: float = 0.0) -> float:
        """`rows`: the rows of the program's matmuls on each chip (tokens; 0: unknown, the
        full η_mxu). Fewer rows than the matrix unit's tile leave part of it idle."""
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


@dataclasses.dataclass(frozen=True)
class KindFit:
    """t(c) for one program kind on the CPU (see the module docstring)."""

    fixed_s: Const  # a
    flops_per_s: Const  # F1, single core
    parallel: Const  # φ

    def seconds(self, flops: float, cores: float) -> float:
        a, f1, phi = float(self.fixed_s), float(self.flops_per_s), float(self.parallel)
        one = a + flops / f1
        if cores < 1.0:
            return one / max(cores, 1e-9)
        return a + flops / f1 * ((1 - phi) + phi / cores)


@dataclasses.dataclass
class CpuFit:
    """This machine's program times from the fits in its profile, per model shape (the
    `fits` entry of cpu-here.json: {shape_key: {kind: KindFit}}, with a `default`)."""

    hw: Hardware
    model: str
    ledger: Ledger

    def _fit(self, kind: str) -> KindFit:
        """The fit of this model at these shapes (`shape_key/P..-N..`), else of this model at
        any shapes, else the default."""
        fits = self.hw.extra.get("fits", {})
        key = next((k for k in (self.model, self.model.split("/")[0], "default")
                    if fits.get(k) and kind in fits[k]), None)
        by_model = fits.get(key) if key else None
        if not by_model or kind not in by_model:
            raise ValueError(f"{self.hw.path}: no fit for {kind!r} (an example profile's "
                             "fits; `locojax predict calibrate` measures this machine)")
        e = by_model[kind]
        from locojax.predict.origin import from_json

        where = f"{self.hw.path}: fits.{key}.{kind}"
        fit = KindFit(from_json(e["fixed_s"], where), from_json(e["flops_per_s"], where),
                      from_json(e["parallel"], where))
        for name in ("fixed_s", "flops_per_s", "parallel"):
            self.ledger.get(f"cpu.{key}.{kind}.{name}", getattr(fit, name))
        return fit

    def seconds(self, kind: str, c: Costs, chips: float = 1.0, cores: float = 0.0,
                rows: float = 0.0) -> float:
        cores = cores or float(self.hw.host_cores.value)
        return self._fit(kind).seconds(c.flops / max(chips, 1.0), cores)


def shape_key(cfg) -> str:
    """The key of a model's fits in cpu-here.json: its shapes, so that a checkpoint of the
    TINY architecture uses TINY's fits whatever its name (`/P..-N..` is appended for the fit
    at one prompt and completion shape)."""
    return (f"L{cfg.num_hidden_layers}-d{cfg.hidden_size}-f{cfg.intermediate_size}-"
            f"n{cfg.num_attention_heads}-k{cfg.num_key_value_heads}-h{cfg.head_dim}-"
            f"v{cfg.vocab_size}")


def device_model(hw: Hardware, dtype: str, model: str, ledger: Ledger):
    if hw.kind == "calibrated":  # `locojax predict calibrate`'s profile (calibrated.py)
        from locojax.predict.calibrated import Calibrated

        return Calibrated(hw, model, ledger, dtype)
    return CpuFit(hw, model, ledger) if hw.kind == "cpu" else Roofline(hw, dtype, ledger)
