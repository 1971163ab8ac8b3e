"""Program times on a machine measured by `locojax predict calibrate` (a profile of kind
`calibrated`): from the program's FLOPs and bytes (`flops.py`, checked against XLA's
`cost_analysis()`) and the machine's measured rates, no term fitted to a training run.

A program of kind k (`prefill`, `decode_step`: one iteration of the decode loop, `train`:
one update; `forward` is costed as a prefill) of a decoder of L layers on c cores takes
    t = fixed_k + L · per_layer_k + max(flops / F_k(c), bytes / bandwidth)
- fixed_k, per_layer_k: its launch and a layer's dozens of small kernels, beyond the
  roofline term, at 1 and 2 layers of a narrow decoder (`calibrate.program_overhead`);
- F_k(c): the kind's effective FLOP rate on locojax's own programs (`program_rates`, two
  batch sizes), scaled to c cores as the f32 matmul rate scales (`flop_rate`); below one
  core a time-sliced share, t / c.
A chip's decode step whose profile has `per_block` (`calibrate_device.decode_latency`) is
latency-bound: its kernels run one after another, none hiding another's bytes, so
    t = fixed + L · (per_layer + n · per_block) + flops / F + bytes / bandwidth
with n the blocks a layer's attention loop takes (`phases.cache_read`; 0 read whole).
"""

from __future__ import annotations

import dataclasses

from locojax.predict.flops import Costs
from locojax.predict.hardware import Hardware
from locojax.predict.origin import Ledger, from_json

KIND_OF = {"prefill": "prefill", "decode_step": "decode_step", "train": "train",
           "forward": "prefill"}


@dataclasses.dataclass
class Calibrated:
    """This machine's program times from its calibrated profile (see the module docstring)."""

    hw: Hardware
    layers: int  # L: the model's decoder layers
    ledger: Ledger
    dtype: str = "float32"  # the run's compute dtype

    @property
    def on_chip(self) -> bool:
        """Calibrated on an accelerator (`calibrate_device.py`): rates by compute dtype, the
        chip's own, not scaled by the host's cores."""
        return not self.hw.is_cpu

    def _table(self, name: str) -> tuple[dict, str]:
        """(the profile's `name` table for this run's dtype, its ledger prefix): an
        accelerator's are by compute dtype; a CPU's were measured in f32 and serve any."""
        table = self.hw.extra.get(name) or {}
        if self.on_chip:
            if self.dtype not in table:
                raise ValueError(f"{self.hw.path}: no {name}.{self.dtype} (calibrated in "
                                 f"{', '.join(sorted(table))})")
            return table[self.dtype], f"{name}.{self.dtype}"
        return table, name

    def _get(self, name: str, entry) -> float:
        const = entry if not isinstance(entry, dict) else from_json(entry, f"{self.hw.path}: "
                                                                           f"{name}")
        return self.ledger.get(f"{self.hw.name}.{name}", const)

    def overhead(self, kind: str, blocks: float = 0.0) -> float:
        """fixed + L · (per_layer + blocks · per_block) of one call of `kind` (`per_block`:
        a chip's decode step's, else none)."""
        table, prefix = self._table("program_overhead")
        k = KIND_OF.get(kind, "prefill")
        if k not in table:
            raise ValueError(f"{self.hw.path}: no {prefix}.{k} (run `locojax predict "
                             "calibrate` again)")
        fixed = self._get(f"{prefix}.{k}.fixed", table[k]["fixed"])
        per_layer = self._get(f"{prefix}.{k}.per_layer", table[k]["per_layer"])
        if "per_block" in table[k]:
            per_layer += blocks * self._get(f"{prefix}.{k}.per_block", table[k]["per_block"])
        return fixed + self.layers * per_layer

    def flop_rate(self, cores: float, kind: str = "") -> float:
        """F_k(c), FLOP/s on c cores (at least one: below it the caller time-slices): the
        kind's effective rate (`program_rates`, all cores) scaled as the matmul rate scales
        from all cores to c; the matmul rate itself where the profile has no such rate. On
        an accelerator, the kind's rate in the run's dtype: the chip's, whatever the cores."""
        rates, prefix = self._table("program_rates")
        k = KIND_OF.get(kind, "prefill")
        if self.on_chip:
            if k not in rates:
                raise ValueError(f"{self.hw.path}: no {prefix}.{k}")
            return self._get(f"{prefix}.{k}", rates[k])
        total = float(self.hw.host_cores.value)
        every = self.ledger.get(f"{self.hw.name}.peak_flops.float32", self.hw.peak("float32"))
        one = self._get("flops_per_core", self.hw.extra["flops_per_core"])
        c = min(max(cores, 1.0), total)
        matmul = one if total <= 1 else one + (every - one) * (c - 1) / (total - 1)
        if k not in rates:
            return matmul
        return self._get(f"program_rates.{k}", rates[k]) * matmul / every

    def seconds(self, kind: str, c: Costs, chips: float = 1.0, cores: float = 0.0,
                rows: float = 0.0, blocks: float = 0.0) -> float:
        """`rows` (the matmuls' rows per chip, the roofline's) is not used: the measured
        matmul rate and the per-layer overhead already hold a CPU's small-shape costs.
        `blocks`: a decode step's attention loop (`phases.cache_read`)."""
        cores = cores or float(self.hw.host_cores.value)
        bw = self.ledger.get(f"{self.hw.name}.hbm_bandwidth", self.hw.hbm_bandwidth)
        chips = max(chips, 1.0)
        over = self.overhead(kind, blocks)
        serial = self.on_chip and "per_block" in self._table("program_overhead")[0][
            KIND_OF.get(kind, "prefill")]  # the latency-bound form (module docstring)
        terms = (c.flops / chips / self.flop_rate(cores, kind), c.bytes / chips / bw)
        t = over + (sum(terms) if serial else max(terms))
        # A CPU machine below one core time-slices its programs; a chip's are its own.
        return t / cores if cores < 1.0 and not self.on_chip else t


def with_host_rates(rates: dict, hw: Hardware) -> dict:
    """`rates` (`phases.host_rates()`) with the host work a calibrated profile measured on this
    machine (`host_rates`: `admission_per_prompt`, `batch_per_row`, `reward_per_row.TASK`)
    in place of the shipped ones; unchanged for any other profile."""
    measured = hw.extra.get("host_rates") if hw.kind == "calibrated" else None
    if not measured:
        return rates
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in rates.items()}
    for key, entry in measured.items():
        const = from_json(entry, f"{hw.path}: host_rates.{key}")
        name, _, task = key.partition(".")
        if task:
            out.setdefault(name, {})[task] = const
        else:
            out[name] = const
    return out
