"""Collective times by the standard α-β formulas, over the links of a cluster.

A message of m bytes over a link of bandwidth β with latency α costs α + m/β. Over p
participants (Thakur, Rabenseifner & Gropp 2005; Chan et al. 2007):
- ring all-reduce: reduce-scatter then all-gather, 2(p-1) α + 2 (p-1)/p · m/β;
- ring reduce-scatter, all-gather: half of that, (p-1) α + (p-1)/p · m/β;
- binary-tree all-reduce (whole messages, no pipelining): 2 ⌈log2 p⌉ (α + m/β);
- pipelined broadcast (weight pushes): ⌈log2 p⌉ α + m/β, the bandwidth-optimal form.
On a torus the ring runs along each dimension in turn (sizes p_i): the bandwidth term stays
2 (p-1)/p · m / β_chip, β_chip the chip's total ICI bandwidth, the latency term Σ_i 2 (p_i -
1) α (jax-ml, "How to Scale Your Model", ch. "All about sharding"). Across hosts, data
parallelism is hierarchical: reduce-scatter inside each ICI domain, all-reduce the 1/q
shard over the DCN between domains, all-gather inside the domain.

`best_allreduce` takes the faster of ring and tree, as NCCL and XLA pick by message size.
"""

from __future__ import annotations

import math


def ring_allreduce(p: int, m: float, bw: float, alpha: float) -> float:
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * m / bw


def ring_reduce_scatter(p: int, m: float, bw: float, alpha: float) -> float:
    if p <= 1:
        return 0.0
    return (p - 1) * alpha + (p - 1) / p * m / bw


ring_allgather = ring_reduce_scatter  # the same steps, data flowing the other way


def tree_allreduce(p: int, m: float, bw: float, alpha: float) -> float:
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * (alpha + m / bw)


def broadcast(p: int, m: float, bw: float, alpha: float) -> float:
    """Pipelined broadcast of m bytes from one to p - 1 others (p counts the sender)."""
    if p <= 1:
        return 0.0
    return math.ceil(math.log2(p)) * alpha + m / bw


def best_allreduce(p: int, m: float, bw: float, alpha: float) -> float:
    return min(ring_allreduce(p, m, bw, alpha), tree_allreduce(p, m, bw, alpha))


def torus_dims(p: int, ndim: int) -> list[int]:
    """A near-cubic factorisation of p chips into `ndim` torus dimensions (powers of two
    split as evenly as they go; other counts put the remainder in one dimension)."""
    dims = [1] * ndim
    rest, i = p, 0
    while rest % 2 == 0 and rest > 1:
        dims[i % ndim] *= 2
        rest //= 2
        i += 1
    dims[0] *= rest
    return sorted(dims, reverse=True)


def ici_allreduce(p: int, m: float, bw_chip: float, alpha: float, topology: str) -> float:
    """All-reduce of m bytes over p chips of one ICI/NVLink domain."""
    if p <= 1:
        return 0.0
    if topology in ("torus2d", "torus3d"):
        dims = torus_dims(p, 2 if topology == "torus2d" else 3)
        return (sum(2 * (d - 1) * alpha for d in dims if d > 1)
                + 2 * (p - 1) / p * m / bw_chip)
    return best_allreduce(p, m, bw_chip, alpha)  # switch / loopback: any ring is one hop


def data_parallel_allreduce(chips: int, domain: int, m: float, ici_bw: float, ici_alpha: float,
                            topology: str, dcn_bw_host: float, dcn_alpha: float,
                            chips_per_host: int,
                            dcn_algorithm: str = "best") -> tuple[float, float]:
    """(ICI seconds, DCN seconds) of all-reducing m bytes of gradients over `chips` chips,
    domains of `domain` chips joined by the DCN (hierarchical; see the module docstring).
    dcn_algorithm: "best" (ring or tree, whichever is faster) or "ring" (what gloo runs)."""
    q = min(chips, domain)
    groups = math.ceil(chips / q)
    if groups <= 1:
        return ici_allreduce(q, m, ici_bw, ici_alpha, topology), 0.0
    inner = 2 * (ring_reduce_scatter(q, m, ici_bw, ici_alpha) if topology == "switch" else
                 ici_allreduce(q, m, ici_bw, ici_alpha, topology) / 2)
    # Each chip's 1/q shard crosses the DCN; a host's chips share its NIC.
    shard, per_host = m / q, max(1, min(q, chips_per_host))
    outer = (ring_allreduce if dcn_algorithm == "ring" else best_allreduce)(
        groups, shard * per_host, dcn_bw_host, dcn_alpha)
    return inner, outer
