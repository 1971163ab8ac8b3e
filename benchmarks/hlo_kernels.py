"""The kernels a compiled XLA program runs, read from its optimized HLO text.

`cost_analysis()` gives one program's FLOPs and bytes in total, a loop's body once whatever its
trip count. A time model needs more: how many kernels a call launches (on a CPU each costs
about a microsecond whatever its size), which of them are matmuls and of what shape (a
16-row matmul runs at a fraction of a 1024-row one's rate), and how many bytes the rest move
(benchmarks/kernel_profile.py holds them against a profiler's trace).
`kernels(compiled.as_text())` lists them, each with how many times one call runs it:

- a kernel is each instruction of the entry computation and of the loops' bodies and
  conditions that does work: a fusion, a dot, a copy, a reduce, a dynamic-update-slice, ...
  (not a parameter, constant, tuple, get-tuple-element or bitcast, which move nothing);
- a `while` multiplies its body by its `known_trip_count` (its condition by one more); a
  loop whose count XLA does not know (an engine's decode loop, which stops when its rows
  are done) is counted once per iteration: its kernels carry the loop's name, and the
  caller says how many iterations a call runs (`Program.split`);
- a kernel's bytes are its operands read and its result written, as XLA's cost analysis
  counts them, except where a fused parameter is only sliced (a scanned layer's weights out
  of the stacked [L, ...] array): then only the slices are read; a dynamic-update-slice
  writes its update in place, not the whole buffer;
- its dots are every `dot` in it (a fusion's nested computations included), each as
  batch x (m x k) @ (k x n).
"""

from __future__ import annotations

import dataclasses
import math
import re

ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
            "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
            "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1, "token": 0}
FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
        "partition-id", "replica-id", "opt-barrier", "add-dependency"}
SLICES = {"dynamic-slice", "slice", "gather"}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+fn|e\d+m\d+)?)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Dot:
    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n


@dataclasses.dataclass(frozen=True)
class Kernel:
    opcode: str  # "fusion", "dot", "copy", ...
    bytes: float  # read and written by one run
    dots: tuple[Dot, ...]
    count: float  # runs per call of the program (per iteration, inside `loop`)
    loop: str = ""  # the loop of unknown trip count it runs in, "" where none
    name: str = ""  # the HLO instruction's name (a profiler's trace names kernels by it)
    ops: tuple[str, ...] = ()  # the opcodes it runs: a fusion's computations', sorted

    @property
    def flops(self) -> float:
        return sum(d.flops for d in self.dots)


@dataclasses.dataclass
class Program:
    kernels: list[Kernel]
    unknown_loops: list[str]

    @property
    def launches(self) -> float:
        return sum(k.count for k in self.kernels)

    @property
    def dot_flops(self) -> float:
        return sum(k.flops * k.count for k in self.kernels)

    def split(self) -> tuple[list[Kernel], list[Kernel]]:
        """(kernels run once per call, kernels run once per iteration of the loops whose
        trip count XLA does not know: an engine's decode loop)."""
        return ([k for k in self.kernels if not k.loop], [k for k in self.kernels if k.loop])


@dataclasses.dataclass(frozen=True)
class _Inst:
    name: str
    type: str
    opcode: str
    operands: tuple[str, ...]
    args: str  # the text between the parentheses: a parameter's index
    attrs: str
    root: bool


def type_bytes(t: str) -> int:
    """Bytes of an HLO type: an array `f32[2,3]{1,0}` or a tuple of them."""
    return sum(ITEMSIZE.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dt, dims in _ARRAY.findall(t))


def _dims(t: str) -> list[int]:
    m = _ARRAY.search(t)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _closing(s: str, i: int) -> int:
    """Index of the bracket closing the one at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced HLO line: {s[:120]!r}")


def _instruction(line: str) -> _Inst | None:
    s = line.strip()
    root = s.startswith("ROOT ")
    if root:
        s = s[5:]
    if not s.startswith("%") or " = " not in s:
        return None
    name, rest = s[1:].split(" = ", 1)
    end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.index(" ")
    typ, rest = rest[:end], rest[end:].lstrip()
    paren = rest.index("(")
    close = _closing(rest, paren)
    operands = tuple(_NAME.findall(rest[paren + 1:close]))
    return _Inst(name, typ, rest[:paren], operands, rest[paren + 1:close], rest[close + 1:],
                 root)


def computations(text: str) -> tuple[dict[str, list[_Inst]], str]:
    """{computation name: its instructions} and the entry's name."""
    comps: dict[str, list[_Inst]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith(" "):
                current = m.group(2)
                comps[current] = []
                entry = current if m.group(1) else entry
            continue
        if line.startswith("}"):
            current = None
            continue
        inst = _instruction(line)
        if inst is not None:
            comps[current].append(inst)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _attr(attrs: str, key: str) -> str:
    m = re.search(rf"\b{key}=%?([\w.\-]+)", attrs)
    return m.group(1) if m else ""


def _dim_set(attrs: str, key: str) -> list[int]:
    m = re.search(rf"\b{key}=\{{([\d,]*)\}}", attrs)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _dot(inst: _Inst, types: dict[str, str]) -> Dot:
    lhs, rhs = _dims(types[inst.operands[0]]), _dims(types[inst.operands[1]])
    lb, lc = _dim_set(inst.attrs, "lhs_batch_dims"), _dim_set(inst.attrs, "lhs_contracting_dims")
    rb, rc = _dim_set(inst.attrs, "rhs_batch_dims"), _dim_set(inst.attrs, "rhs_contracting_dims")
    batch = math.prod(lhs[i] for i in lb)
    k = math.prod(lhs[i] for i in lc)
    m = math.prod(d for i, d in enumerate(lhs) if i not in lb and i not in lc)
    n = math.prod(d for i, d in enumerate(rhs) if i not in rb and i not in rc)
    return Dot(batch, m, k, n)


class _Reader:
    """Walks one program's computations (see the module docstring)."""

    def __init__(self, text: str):
        self.comps, self.entry = computations(text)
        self.types = {name: {i.name: i.type for i in insts}
                      for name, insts in self.comps.items()}
        self.kernels: list[Kernel] = []
        self.unknown: list[str] = []

    def fused_dots(self, comp: str) -> tuple[Dot, ...]:
        out: list[Dot] = []
        for inst in self.comps.get(comp, []):
            if inst.opcode == "dot":
                out.append(_dot(inst, self.types[comp]))
            for key in ("calls", "to_apply"):
                if inst.opcode in ("fusion", "call") and _attr(inst.attrs, key):
                    out.extend(self.fused_dots(_attr(inst.attrs, key)))
        return tuple(out)

    def fused_reads(self, comp: str, operand_types: list[str]) -> float:
        """Bytes a fusion reads of its operands: a parameter used only through slices reads
        the slices' bytes, any other its whole."""
        insts = self.comps.get(comp, [])
        params = {i.name: int(i.args) for i in insts if i.opcode == "parameter"}
        total = 0.0
        for pname, index in params.items():
            users = [i for i in insts if pname in i.operands]
            if users and all(u.opcode in SLICES and u.operands[0] == pname for u in users):
                total += sum(type_bytes(u.type) for u in users)
            elif index < len(operand_types):
                total += type_bytes(operand_types[index])
        return total

    def fused_ops(self, comp: str) -> tuple[str, ...]:
        ops: set[str] = set()
        for inst in self.comps.get(comp, []):
            called = _attr(inst.attrs, "calls") if inst.opcode in ("fusion", "call") else ""
            ops.update(self.fused_ops(called) if called else (inst.opcode,))
        return tuple(sorted(ops - FREE))

    def fused_root(self, comp: str) -> _Inst | None:
        return next((i for i in self.comps.get(comp, []) if i.root), None)

    def kernel(self, inst: _Inst, comp: str, count: float, loop: str) -> Kernel:
        types = self.types[comp]
        operand_types = [types.get(o, "") for o in inst.operands]
        written = type_bytes(inst.type)
        if inst.opcode == "fusion":
            called = _attr(inst.attrs, "calls")
            root = self.fused_root(called)
            read = self.fused_reads(called, operand_types)
            if root is not None and root.opcode == "dynamic-update-slice":
                ctypes = self.types[called]
                update = type_bytes(ctypes.get(root.operands[1], ""))
                read -= type_bytes(ctypes.get(root.operands[0], ""))
                written = update
            return Kernel("fusion", max(read, 0.0) + written, self.fused_dots(called), count,
                          loop, inst.name, self.fused_ops(called))
        if inst.opcode == "dynamic-update-slice":
            update = type_bytes(operand_types[1])
            return Kernel(inst.opcode, 2.0 * update, (), count, loop, inst.name, (inst.opcode,))
        if inst.opcode in SLICES:
            return Kernel(inst.opcode, 2.0 * written, (), count, loop, inst.name, (inst.opcode,))
        dots = (_dot(inst, types),) if inst.opcode == "dot" else ()
        return Kernel(inst.opcode, sum(type_bytes(t) for t in operand_types) + written, dots,
                      count, loop, inst.name, (inst.opcode,))

    def walk(self, comp: str, count: float, loop: str = "") -> None:
        for inst in self.comps.get(comp, []):
            if inst.opcode in FREE:
                continue
            if inst.opcode == "while":
                trip = re.search(r'known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', inst.attrs)
                if trip is None:
                    self.unknown.append(inst.name)
                n = float(trip.group(1)) if trip else 1.0
                inner = loop if trip else inst.name
                self.walk(_attr(inst.attrs, "body"), count * n, inner)
                self.walk(_attr(inst.attrs, "condition"), count * (n + 1 if trip else 1), inner)
            elif inst.opcode in ("call", "async-start"):
                self.walk(_attr(inst.attrs, "to_apply") or _attr(inst.attrs, "calls"), count,
                          loop)
            elif inst.opcode == "conditional":
                branches = re.findall(r"%([\w.\-]+)", _branches(inst.attrs))
                for branch in branches:  # which runs is data: each at its share
                    self.walk(branch, count / max(1, len(branches)), loop)
            else:
                self.kernels.append(self.kernel(inst, comp, count, loop))


def _branches(attrs: str) -> str:
    m = re.search(r"branch_computations=\{([^}]*)\}", attrs)
    if m:
        return m.group(1)
    return ",".join(f"%{_attr(attrs, k)}" for k in ("true_computation", "false_computation")
                    if _attr(attrs, k))


def kernels(text: str) -> Program:
    """The kernels one call of the program in `text` (a compiled program's `as_text()`)
    runs, with how many times each runs (see the module docstring)."""
    r = _Reader(text)
    r.walk(r.entry, 1.0)
    return Program(r.kernels, r.unknown)
