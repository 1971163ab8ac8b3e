"""Hardware profiles: one JSON file per accelerator (locojax/predict/hardware/), every number
with its origin, and the cluster a prediction runs on.

A profile gives the chip (peak FLOP/s per precision, HBM size and bandwidth), the host
(chips and cores), the interconnect inside an ICI/NVLink domain and the network (DCN) between
hosts, each with bandwidth and latency, and the efficiencies that turn peaks into times.
`here` is this machine as `locojax predict calibrate` measured it (`CALIBRATED`, kind
`calibrated`); `cpu-here`, an example of one (a 2-core machine), announced so when used. On
both, hosts are local processes sharing the machine's cores (`shared_cores`). `Cluster` is a
profile plus a chip count: `--cluster v5e-64` is 64 TPU v5e chips.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path

from locojax.predict.origin import Const, from_json

HARDWARE_DIR = Path(__file__).parent / "hardware"
CALIBRATED = Path(os.environ.get("LOCOJAX_PROFILE",
                                 Path.home() / ".cache" / "locojax" / "here.json"))
"""Where `locojax predict calibrate` writes this machine's profile, and `here` reads it."""
EXAMPLE = "cpu-here"  # a machine measured once, shipped as an example, not this machine
_noted: set[str] = set()


class UnknownHardware(ValueError):
    """No such profile; the message lists the known ones."""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator profile (see the module docstring); every field a `Const`."""

    name: str
    kind: str  # tpu | gpu | cpu (a roofline) | calibrated (`calibrated.py`)
    peak_flops: dict[str, Const]  # by compute dtype
    hbm_bytes: Const
    hbm_bandwidth: Const
    chips_per_host: Const
    host_cores: Const
    ici_bandwidth: Const  # per chip, both directions
    ici_latency: Const
    ici_domain: Const  # chips one ICI/NVLink domain spans
    ici_topology: str  # torus2d | torus3d | switch | loopback
    dcn_bandwidth: Const  # per host
    dcn_latency: Const
    matmul_efficiency: Const
    hbm_efficiency: Const
    loop_iteration_s: Const
    host_core_speed: Const
    path: str = ""
    extra: dict = dataclasses.field(default_factory=dict)  # profile-specific (a calibration's)

    @property
    def platform(self) -> str:
        """`cpu`, `tpu` or `gpu`: a calibrated profile's is where it was measured."""
        if self.kind == "calibrated":
            return self.extra.get("platform", "cpu")
        return self.kind

    @property
    def is_cpu(self) -> bool:
        """A CPU machine: a `locojax predict calibrate` profile of one (it measures the
        machine it runs on, its hosts joined by gloo between processes), or of kind cpu."""
        return self.platform == "cpu"

    def peak(self, dtype: str) -> Const:
        if dtype not in self.peak_flops:
            raise UnknownHardware(f"profile {self.name} gives no peak for {dtype}; it has "
                                  f"{', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]


_SCALARS = tuple(f.name for f in dataclasses.fields(Hardware) if f.type == "Const")


def known() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))


def default() -> str:
    """The profile a prediction without `--cluster` uses: this machine's calibration once
    `locojax predict calibrate` wrote it (`here`), else the shipped example (`cpu-here`)."""
    return "here" if CALIBRATED.is_file() else EXAMPLE


def _aliases(name: str) -> list[str]:
    """`v5e` and `tpu-v5e`, `7x` and `v7x` name the same profile."""
    n = name.lower()
    return [n, f"tpu-{n}", f"tpu-v{n.removeprefix('v')}"]


def load(name_or_file: str) -> Hardware:
    """A profile by name (`tpu-v7x`, `v7x`, `h100`, `cpu-here`), `here` (this machine, as
    `locojax predict calibrate` measured it) or from a JSON file."""
    path = Path(name_or_file)
    if name_or_file == "here":
        if not CALIBRATED.is_file():
            raise UnknownHardware(f"no calibrated profile at {CALIBRATED}: run `locojax "
                                  "predict calibrate` first (a few minutes), or name another "
                                  f"profile ({', '.join(known())})")
        path = CALIBRATED
    elif _aliases(name_or_file)[0] == EXAMPLE and EXAMPLE not in _noted:
        _noted.add(EXAMPLE)
        print(f"note: {EXAMPLE} is an EXAMPLE profile, measured on the machine that wrote it, "
              f"not on this one; its times may be several times off here. `locojax predict "
              f"calibrate` measures this machine (a few minutes), then use --cluster here-N.",
              file=sys.stderr)
    if not (path.suffix == ".json" and path.is_file()):
        path = next((HARDWARE_DIR / f"{n}.json" for n in _aliases(name_or_file)
                     if (HARDWARE_DIR / f"{n}.json").is_file()), None)
        if path is None:
            raise UnknownHardware(f"unknown hardware {name_or_file!r}; known profiles: "
                                  f"{', '.join(known())} (or --hardware FILE.json)")
    with open(path) as f:
        d = json.load(f)
    where = str(path)
    try:
        fields = {k: from_json(d[k], f"{where}: {k}") for k in _SCALARS}
        peaks = {k: from_json(v, f"{where}: peak_flops.{k}") for k, v in d["peak_flops"].items()}
    except KeyError as e:
        raise UnknownHardware(f"{where}: profile lacks {e.args[0]!r}") from None
    extra = {k: (from_json(v, f"{where}: {k}") if isinstance(v, dict) and "value" in v else v)
             for k, v in d.items()
             if k not in _SCALARS and k not in ("name", "kind", "peak_flops", "ici_topology")}
    return Hardware(d["name"], d["kind"], peaks, ici_topology=d["ici_topology"], path=where,
                    extra=extra, **fields)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """`chips` chips of one profile, in hosts of `chips_per_host`."""

    hw: Hardware
    chips: int

    @property
    def chips_per_host(self) -> int:
        return int(self.hw.chips_per_host.value)

    @property
    def hosts(self) -> int:
        return max(1, math.ceil(self.chips / self.chips_per_host))

    @property
    def shared_cores(self) -> float:
        """Cores all simulated hosts share (cpu-here), or 0: each host has its own."""
        c = self.hw.extra.get("shared_cores")
        return float(c) if c else 0.0

    def describe(self) -> str:
        return (f"{self.chips} x {self.hw.name} ({self.hosts} host{'s' * (self.hosts > 1)} of "
                f"{min(self.chips, self.chips_per_host)})")


def parse_cluster(spec: str, hardware_file: str = "") -> Cluster:
    """`v5e-64`, `tpu-v7x-256`, `h100-16`, `cpu-here-4` (4 simulated hosts here); with
    `hardware_file` the spec may be just the chip count."""
    if hardware_file:
        count = spec.rsplit("-", 1)[-1]
        hw = load(hardware_file)
    else:
        m = re.fullmatch(r"(.+)-(\d+)", spec)
        if not m:
            raise UnknownHardware(f"--cluster {spec!r} must be PROFILE-CHIPS (e.g. v5e-64); "
                                  f"known profiles: {', '.join(known())}")
        hw, count = load(m.group(1)), m.group(2)
    if not count.isdigit() or int(count) < 1:
        raise UnknownHardware(f"--cluster {spec!r}: the chip count must be a positive integer")
    return Cluster(hw, int(count))
