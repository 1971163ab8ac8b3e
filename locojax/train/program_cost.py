"""One compiled program's cost: its FLOPs, the bytes it moves and its memory, as XLA counts
them, the one account of a step's cost that the memory plan and `locojax predict` share.

`ProgramCost.of(name, phase, compiled, ...)` reads a compiled program (a `jax.stages.Compiled`):
- `cost_analysis()`: FLOPs (XLA counts 2 per multiply-accumulate of a dot and one per element
  of every elementwise op and reduction) and `bytes accessed` (every operand read and result
  written, fusions counted once); XLA counts the body of a loop once, whatever its trip count
  (tests/test_predict_flops.py says how the cost model is compared with that);
- `memory_analysis()`: per device, its arguments, outputs, the part aliased through donation
  and its temporaries.
The memory plan (`memory_plan.py`) compiles the run's programs at its shapes and keeps one
`ProgramCost` each; `locojax predict` reads the same fields of the same programs where they
can be compiled here, and its analytic model (`locojax/predict/flops.py`) only where they
cannot (pod-scale meshes), checked against these counts in tests/test_predict_flops.py and
tests/test_program_cost.py.

Anchor: the JAX scaling book's rooflines start from `cost_analysis()` of a lowered program.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np


GB = 1e9


def size(b: float) -> str:
    """Bytes as MB below 1 GB, else GB (10^6, 10^9)."""
    return f"{b / GB:.2f} GB" if b >= GB else f"{b / 1e6:.1f} MB"


def device_bytes(tree) -> int:
    """Bytes one device holds of a tree of arrays or ShapeDtypeStructs (its shard of each)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def argument_bytes(compiled, index: int) -> int:
    """Per-device bytes of a compiled program's positional argument `index`."""
    infos, shardings = compiled.args_info[0][index], compiled.input_shardings[0][index]
    return device_bytes(jax.tree.map(
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), infos, shardings,
        is_leaf=lambda x: isinstance(x, jax.stages.ArgInfo)))


def xla_costs(compiled) -> tuple[float, float]:
    """(FLOPs, bytes accessed) of a compiled program, per XLA's cost analysis (0 where the
    backend gives none). Older JAX returned one dict per computation: they are summed."""
    analysis = compiled.cost_analysis() or {}
    if isinstance(analysis, (list, tuple)):
        merged: dict = {}
        for d in analysis:
            for k, v in (d or {}).items():
                merged[k] = merged.get(k, 0.0) + v
        analysis = merged
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """One compiled program on one device: XLA's memory and cost analyses (see above)."""

    name: str
    phase: str  # which engine cache is live while it runs: "rollout", "eval" or "train" (none)
    arguments: int
    outputs: int
    aliased: int  # outputs written over donated arguments
    temporaries: int
    held_arguments: int  # of `arguments`, bytes that are part of the run's held set
    compile_s: float
    flops: float = 0.0  # per call, a loop's body once (`xla_costs`)
    bytes_accessed: float = 0.0
    # The compiled program itself: benchmarks/price_child.py reads its kernels from it.
    compiled: object = dataclasses.field(default=None, repr=False, compare=False)
    # Non-empty: the compiler refused the program for want of device memory, and said this
    # (`out_of_memory.refused`); its temporaries are then the compiler's figure, not XLA's
    # memory analysis, and `compiled` is None.
    refused: str = ""

    @classmethod
    def of(cls, name: str, phase: str, compiled, held_arguments: int, compile_s: float):
        m = compiled.memory_analysis()
        flops, moved = xla_costs(compiled)
        return cls(name, phase, int(m.argument_size_in_bytes), int(m.output_size_in_bytes),
                   int(m.alias_size_in_bytes), int(m.temp_size_in_bytes), held_arguments,
                   compile_s, flops, moved, compiled)

    @property
    def extra(self) -> int:
        """What it needs on top of the held set: temporaries, new outputs, other inputs."""
        return (self.temporaries + self.outputs - self.aliased
                + self.arguments - self.held_arguments)
