"""`locojax predict calibrate`: measure this machine for `locojax predict` (a few minutes).

    locojax predict calibrate [--out FILE]

Measures the f32 matmul rate (all cores and one), the copy bandwidth, the launch and
per-layer overhead and the effective FLOP rate of locojax's prefill, decode iteration and
train step, host work per prompt, row and step, and the latency and bandwidth between two
local hosts (gloo), and writes a profile (default: $LOCOJAX_PROFILE, else
~/.cache/locojax/here.json). Then:

    locojax predict train demo ... --cluster here-2      # or --hardware FILE --cluster 2

The profile's fields and the validation of its predictions: docs/predict.md.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    from locojax.predict import calibrate

    out = calibrate.DEFAULT_PATH
    rest = list(argv)
    if rest[:1] == ["--out"] and len(rest) >= 2:
        out, rest = rest[1], rest[2:]
    elif rest and rest[0].startswith("--out="):
        out, rest = rest[0].split("=", 1)[1], rest[1:]
    if rest:
        print(f"locojax predict calibrate: unknown argument {rest[0]!r} (only --out FILE)", file=sys.stderr)
        return 2
    calibrate.run(out)
    return 0
