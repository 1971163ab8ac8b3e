"""A compiled program's time on this machine from the kernels it runs.

A program's kernels (`hlo_kernels.kernels` of its optimized HLO) are summed into a few
features, each a cost XLA:CPU pays per kernel run (docs/results/predict_validation.md,
"Kernel by kernel", measured them in traces of locojax's programs):

- `call`: 1 per call of the program (its dispatch);
- `launch`: the kernels run (each costs about a microsecond whatever its size);
- `matmul`: the kernels' matmuls priced from matmuls timed alone on one core
  (`kernel_tables.KernelPrices.matmuls`, by (m, k, n): a 16-row matmul runs at a fraction
  of a 1024-row one's rate); on all the cores, from the same grid timed there
  (`ALL_MATMUL`): XLA:CPU splits a large matmul over the cores and a small one not at all
  (on 2 cores 4 x 1024 x 4096 ran 1.7x faster than on one, 16 x 256 x 1024 0.8x), which
  one weight per kind cannot hold;
- `elementwise`: the bytes the other kernels read and write, save fills (fused elementwise
  work, reductions, transposes, the transcendental functions);
- `fill`: the bytes of the kernels that only write (a broadcast into a fresh buffer: the
  first touch of its pages).

and the time is their weighted sum, t = Σ_f c_f · x_f, with weights per kind of program
(`update`: a train step or reference pass; `prefill`: a prefill, few wide kernels;
`decode`: a decode loop, many narrow ones, which run fewer at once) and per core count.
The weights are fitted by `calibrate_kernels.py` to locojax's own programs on decoders of
three widths that no model or validation point has; a program the calibration never saw
is priced from its own kernels, so a new shape needs no new fit. The weights carry what no
table holds: how many kernels run at once on the cores, how much slower a matmul or an
elementwise kernel runs among others than alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from benchmarks.hlo_kernels import Kernel
from benchmarks.kernel_tables import KernelPrices

FEATURES = ("call", "launch", "matmul", "elementwise", "fill")
ALL_MATMUL = "matmul_all"
"""The `matmul` feature priced by the tables timed on all the cores, which the all-core
weights price in its place (`on_all_cores`)."""
KINDS = ("update", "prefill", "decode")
CACHE = "cache rollout"  # a run's cache buffer (`price_child.py`): seconds, not features
GRADIENTS = "gradients"  # the bytes its hosts' gradient all-reduce sums
CORES = ("one", "all")
KIND_OF = {"train": "update", "prefill": "prefill", "decode_step": "decode",
           "forward": "prefill", "reshard": "prefill"}
"""The program kinds of `phases.py` (and a reshard) to the model's: a forward pass and a
reshard run few wide kernels, as a prefill does."""
TRANSCENDENTAL = {"exponential", "log", "tanh", "logistic", "rsqrt", "sqrt", "power", "erf",
                  "divide", "exponential-minus-one", "log-plus-one"}
LAYOUT = {"copy", "transpose"}
MOVES = {"bitcast", "broadcast", "slice", "reshape", "dynamic-slice"}


def kernel_class(k: Kernel) -> str:
    """dot (any matmul), transcendental, layout (a copy or transpose), fill (a broadcast
    that reads nothing) or other: the classes traces are read by."""
    ops = set(k.ops)
    if k.dots:
        return "dot"
    if ops & TRANSCENDENTAL:
        return "transcendental"
    if ops & LAYOUT and ops <= LAYOUT | MOVES:
        return "layout"
    if ops <= {"broadcast", "constant", "iota"}:
        return "fill"
    return "other"


def features(kernels: list[Kernel], prices: KernelPrices, calls: float = 1.0,
             every: KernelPrices | None = None) -> dict:
    """The features (module docstring) of `calls` calls of a program of `kernels`, each
    kernel as often as it runs; with `every` (the tables timed on all the cores), the
    matmuls priced by them too (`ALL_MATMUL`)."""
    out = dict.fromkeys(FEATURES, 0.0)
    out["call"] = calls
    if every is not None:
        out[ALL_MATMUL] = 0.0
    for k in kernels:
        runs = k.count * calls
        out["launch"] += runs
        cls = kernel_class(k)
        if cls == "dot":
            out["matmul"] += runs * prices.matmuls(k)
            if every is not None:
                out[ALL_MATMUL] += runs * every.matmuls(k)
        elif cls == "fill":
            out["fill"] += runs * k.bytes
        else:
            out["elementwise"] += runs * k.bytes
    return out


def added(*feats: dict) -> dict:
    keys = (*FEATURES, *((ALL_MATMUL,) if all(ALL_MATMUL in x for x in feats) else ()))
    return {f: sum(x[f] for x in feats) for f in keys}


def on_all_cores(feats: dict) -> dict:
    """The features as the all-core weights price them: the matmuls by the all-core tables
    where they were priced so (a calibration child's rows are priced by its own tables)."""
    return {**feats, "matmul": feats.get(ALL_MATMUL, feats["matmul"])}


def fit(rows: list[tuple[dict, float]]) -> dict[str, float]:
    """Non-negative weights of `FEATURES` for (features, seconds) rows, each row's error
    relative to its time (a 4 ms program counts as much as a 1 s one)."""
    from scipy.optimize import nnls

    a = np.array([[x[f] / t for f in FEATURES] for x, t in rows])
    weights, _ = nnls(a, np.ones(len(rows)))
    return dict(zip(FEATURES, (float(w) for w in weights)))


def priced(weights: dict[str, float], feats: dict) -> float:
    return sum(weights[f] * feats[f] for f in FEATURES)


@dataclasses.dataclass(frozen=True)
class KernelModel:
    """A calibrated profile's `program_model`: the tables and the weights on one core and
    on all the process's cores (`cores`)."""

    prices: KernelPrices
    weights: dict  # {"one" | "all": {kind: {feature: weight}}}
    cores: float  # the cores of "all"
    lockstep: dict = dataclasses.field(default_factory=dict)  # calibrate_lockstep.lockstep()

    @classmethod
    def of(cls, entry: dict) -> "KernelModel":
        """From a profile's `program_model`; a ValueError naming what it lacks."""
        missing = [k for k in ("tables", "tables_all", "weights", "cores") if k not in entry]
        weights = entry.get("weights") or {}
        missing += [f"weights.{c}.{k}.{f}" for c in CORES for k in KINDS for f in FEATURES
                    if not isinstance((weights.get(c) or {}).get(k), dict)
                    or not isinstance(weights[c][k].get(f), (int, float))]
        if missing:
            raise ValueError(f"the profile's program_model lacks {', '.join(missing[:4])}: run "
                             "`predict_programs calibrate` again")
        return cls(KernelPrices.of(entry["tables"]), weights, float(entry["cores"]),
                   entry.get("lockstep") or {})

    def meeting(self, kind: str, units: float, work: float) -> float:
        """Seconds one meeting of `units` units adds after `work` seconds of priced work each
        (`calibrate_lockstep.MEETINGS` names the kinds): a + b · work, a and b linear in the
        units between the measured counts (0 at one unit) and held beyond the largest; 0
        where the profile measured no such meeting."""
        table = sorted((float(n), ab) for n, ab in (self.lockstep.get(kind) or {}).items())
        if units <= 1.0 or not table:
            return 0.0
        ns = [1.0] + [n for n, _ in table]
        a = float(np.interp(units, ns, [0.0] + [ab["a"] for _, ab in table]))
        b = float(np.interp(units, ns, [0.0] + [ab["b"] for _, ab in table]))
        return max(0.0, a + b * work)  # a unit that waits is never done sooner

    def seconds(self, kind: str, feats: dict, cores: float) -> float:
        """One program's time on `cores` cores: linear between the one-core and all-core
        fits, and below one core its time-sliced share of one."""
        k = KIND_OF.get(kind, kind)
        one = priced(self.weights["one"][k], feats)
        every = priced(self.weights["all"][k], on_all_cores(feats))
        if cores < 1.0:
            return one / max(cores, 1e-9)
        if self.cores <= 1.0:
            return one
        c = min(cores, self.cores)
        return one + (every - one) * (c - 1.0) / (self.cores - 1.0)
