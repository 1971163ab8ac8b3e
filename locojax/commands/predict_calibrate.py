"""`locojax predict calibrate`: measure this machine for `locojax predict` (a few minutes).

    locojax predict calibrate [--out FILE]

Measures the f32 matmul rate (all cores and one), the copy bandwidth, the launch and
per-layer overhead and the effective FLOP rate of locojax's prefill, decode iteration and
train step, host work per prompt, row and step, and the latency and bandwidth between two
local hosts (gloo), and writes a profile (default: $LOCOJAX_PROFILE, else
~/.cache/locojax/here.json). On a TPU or GPU machine it measures the chip instead, in f32
and bf16 (locojax/predict/calibrate_device.py). Once written, it is the profile a
prediction without --cluster uses. Then:

    locojax predict train demo ... --cluster here-2      # or --hardware FILE --cluster 2

The profile's fields and the validation of its predictions: docs/predict.md.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    from locojax.predict.hardware import CALIBRATED

    out = CALIBRATED
    rest = list(argv)
    if rest[:1] == ["--out"] and len(rest) >= 2:
        out, rest = rest[1], rest[2:]
    elif rest and rest[0].startswith("--out="):
        out, rest = rest[0].split("=", 1)[1], rest[1:]
    if rest:
        print(f"locojax predict calibrate: unknown argument {rest[0]!r} (only --out FILE)",
              file=sys.stderr)
        return 2
    run(out)
    return 0


def run(out: Path, say=print) -> Path:
    """Measure (`calibrate.measure`), write the profile to `out`, and return its path."""
    from locojax.predict import calibrate
    from locojax.predict.hardware import CALIBRATED

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = "{:.2f}".format(os.getloadavg()[0])
    say(f"calibrating this machine ({len(os.sched_getaffinity(0))} cores, load {load}); "
        "a few minutes, keep it otherwise idle:")
    m = calibrate.measure(lambda name, v, s: say(f"  {name}: {_short(v)}  ({s:.0f} s)"))
    load = f"{load}-{os.getloadavg()[0]:.2f} (1-min average, start-end)"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(calibrate.profile(m, when, load), indent=1) + "\n")
    say(f"wrote {out}: predict with `locojax predict train ... --hardware {out} --cluster N` "
        f"(or `--cluster here-N`, which reads {CALIBRATED})")
    return out


QUIET = ("samples",)  # too long to say


def _short(v) -> str:
    """A measurement in a line: numbers to 4 digits, a table's entries one after another."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {_short(x)}" for k, x in v.items() if k not in QUIET)
    return v if isinstance(v, str) else f"{v:.4g}"
