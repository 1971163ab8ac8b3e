"""A chip's calibrated profile carried to another chip by published spec ratios (issue 58
item 3): what a v5e measured, stated for a v5p, v6e or v7x nobody here has run on.

    python -m benchmarks.carried_profile --profile HERE.json --to tpu-v7x [--out FILE.json]

`locojax predict calibrate` on one chip writes its rates (`program_rates`, `peak_flops`
by compute dtype), its HBM bandwidth and the overheads of its programs (`calibrated.py`).
The carried profile is the calibration with, each constant's source naming what was done:
- scaled by the ratio of the two chips' published peaks, per compute dtype (the target's
  profile over the measured chip's, both from `locojax/predict/hardware/`): `peak_flops`,
  every `program_rates` entry: a program keeps the share of the peak it reached;
- scaled by the ratio of their published HBM bandwidths: `hbm_bandwidth`;
- the target's own (spec, from its shipped profile): HBM size, chips and cores per host, the
  interconnect (ICI and DCN bandwidths, latencies, domain, topology);
- kept as measured: `program_overhead` (a program's launch and per-layer latency: no spec
  sheet gives its ratio; assumed equal on the target) and `host_rates` (the host's work
  measured on the calibrating machine's CPU).
The result loads as any profile (`--hardware FILE`, `--cluster FILE.json-64`). Its error is
the calibration's on the measured chip (docs/results/predict_tpu_validation.md) plus the
assumption that rates scale as the spec does, which no chip here can check.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from pathlib import Path

from locojax.predict import hardware
from locojax.predict.calibrate_device import preset_of

FROM_TARGET = ("hbm_bytes", "chips_per_host", "host_cores", "ici_bandwidth", "ici_latency",
               "ici_domain", "dcn_bandwidth", "dcn_latency")


def _scaled(entry: dict, ratio: float, why: str) -> dict:
    return {**entry, "value": entry["value"] * ratio, "origin": "assumed",
            "source": f"{entry['value']:.4g} {entry['unit']} {entry['origin']} x {ratio:.4g}, "
                      f"{why}; that one: {entry['source']}"}


def carry(profile: dict, target: str) -> dict:
    """`profile` (a calibrated chip's JSON) as the chip of the shipped profile `target`."""
    if profile.get("kind") != "calibrated" or profile.get("platform", "cpu") == "cpu":
        raise ValueError("carry takes a chip's calibration (`locojax predict calibrate` on a "
                         f"TPU or GPU), not a {profile.get('platform', 'cpu')} one")
    measured_on = preset_of(profile.get("device_kind", ""))
    if not measured_on:
        raise ValueError(f"no shipped profile for {profile.get('device_kind')!r}: its spec "
                         "ratios are unknown")
    src, dst = hardware.load(measured_on), hardware.load(target)
    out = copy.deepcopy(profile)
    out["name"] = f"{dst.name}-from-{measured_on}"
    out["device_kind"] = f"{dst.name} (carried from {profile['device_kind']})"
    for dtype in out["peak_flops"]:
        r = dst.peak(dtype).value / src.peak(dtype).value
        why = f"the published {dtype} peak of {dst.name} over {src.name}'s"
        out["peak_flops"][dtype] = _scaled(out["peak_flops"][dtype], r, why)
        for kind, entry in out.get("program_rates", {}).get(dtype, {}).items():
            out["program_rates"][dtype][kind] = _scaled(entry, r, why)
    r = dst.hbm_bandwidth.value / src.hbm_bandwidth.value
    out["hbm_bandwidth"] = _scaled(out["hbm_bandwidth"], r,
                                   f"the published HBM bandwidth of {dst.name} over {src.name}'s")
    for key in FROM_TARGET:
        out[key] = dataclasses.asdict(getattr(dst, key))
    out["ici_topology"] = dst.ici_topology
    out["carried"] = {"from": measured_on, "to": dst.name, "kept_as_measured":
                      ["program_overhead", "host_rates", "loop_iteration_s"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="a chip's `predict calibrate` output")
    ap.add_argument("--to", required=True, help=f"a shipped profile: {', '.join(hardware.known())}")
    ap.add_argument("--out", help="where to write it (default: print)")
    args = ap.parse_args()
    text = json.dumps(carry(json.loads(Path(args.profile).read_text()), args.to), indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}: predict with --hardware {args.out} --cluster N")
    else:
        print(text)


if __name__ == "__main__":
    main()
