"""The accelerator half of `locojax predict calibrate`: what differs when this process's
devices are TPUs or GPUs rather than the host's cores.

- the matmul rate is the chip's, per compute dtype (`matmul_rates`: bf16 and f32 products
  large enough that the call's dispatch is under 2% of them), not the cores';
- the bandwidth is the chip's HBM (`hbm_bandwidth`: x + 1 over 1 GiB, read and written);
- the program rates are measured on a decoder as wide as the models run there
  (`ACCEL_PROBE`: d 768, vocab 16k, 32 and 128 rows), in each compute dtype: the narrow CPU
  probe cannot fill a systolic array, so its slope says nothing of a real shape's; and so
  are the overheads, net of the roofline (`calibrate.program_overhead`);
- no link is timed: a machine with one host has no DCN to time, and a one-process calibration
  cannot open a second process on the chips it holds. The interconnect constants come from
  the shipped profile of the same chip (`preset_of`), named as such in the profile.
"""

from __future__ import annotations

import dataclasses

from locojax.predict.calibrate_host import matmul_flops, median_time

DTYPES = ("float32", "bfloat16")
PRESETS = {"TPU v5 lite": "tpu-v5e", "TPU v5e": "tpu-v5e", "TPU v5": "tpu-v5p",
           "TPU v5p": "tpu-v5p", "TPU v6 lite": "tpu-v6e", "TPU v6e": "tpu-v6e",
           "TPU7x": "tpu-v7x", "TPU v7x": "tpu-v7x", "NVIDIA H100": "h100", "NVIDIA H200": "h200"}
"""`device_kind` -> the shipped profile whose interconnect (ICI, DCN) a calibration of that
chip copies; matched by prefix, longest first (`TPU v5 lite` before `TPU v5`)."""


@dataclasses.dataclass(frozen=True)
class RateProbe:
    """The decoder and batches whose programs give the effective rates (`program_rates`):
    generates of `prompts` x 4 samples (`prompt`-token prompts, 8 and 136 new tokens) and
    updates of the same rows on `train_p` + `train_n` tokens."""

    decoder: dict
    prompts: tuple[int, int]
    train_p: int
    train_n: int
    prompt: int = 8


CPU_PROBE = RateProbe(dict(num_hidden_layers=3, hidden_size=128, intermediate_size=384,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           vocab_size=1024), (2, 8), 16, 32)
"""A shape no benchmark or validation point runs (TINY is d 64, SMALL d 256): 8 and 32 rows."""
ACCEL_PROBE = RateProbe(dict(num_hidden_layers=4, hidden_size=768, intermediate_size=2048,
                             num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                             vocab_size=16384), (8, 32), 128, 128, prompt=128)
"""As wide as the models an accelerator runs (SmolLM2-135M is d 576, Qwen3-0.6B d 1024) and
none of them: 32 and 128 rows, prefills of 1k and 4k tokens (an 8-token prompt's rate
over-predicted set 10's 128-256-token prefills 2.6-8x), updates of 8k and 32k tokens."""


def platform() -> str:
    """`cpu`, `tpu` or `gpu`: the backend this process's programs run on."""
    import jax

    return jax.default_backend()


def device_kind() -> str:
    import jax

    return jax.devices()[0].device_kind


def preset_of(kind: str) -> str:
    """The shipped profile of a `device_kind`, or "" where none is shipped."""
    for prefix in sorted(PRESETS, key=len, reverse=True):
        if kind.startswith(prefix):
            return PRESETS[prefix]
    return ""


def matmul_rates(n: int = 8192, reps: int = 10) -> dict[str, float]:
    """FLOP/s of an [n, n] @ [n, n] product on the first device in each of `DTYPES`
    (2 n^3 per product; n 8192: ~6 ms at a v5e's bf16 peak, 50x a call's dispatch)."""
    return {dtype: matmul_flops(n, reps, dtype) for dtype in DTYPES}


def hbm_bandwidth(mib: int = 1024, reps: int = 10) -> float:
    """Bytes/s of x + 1 over `mib` MiB of f32 on the first device: every byte read once and
    written once, as a decode step streams its weights (~2.6 ms at a v5e's 819 GB/s)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((mib * 2 ** 20 // 4,), jnp.float32)
    f = jax.jit(lambda v: v + 1)
    return 2 * x.nbytes / median_time(lambda: f(x).block_until_ready(), reps)


def memory_bytes() -> float:
    """Bytes one device lets a program hold (its allocator's limit), 0 where it says none."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return float(stats.get("bytes_limit", 0))


def chips() -> int:
    import jax

    return jax.local_device_count()


def const(value: float, unit: str, origin: str, source: str) -> dict:
    """One profile constant in `hardware.load`'s format."""
    return {"value": float(value), "unit": unit, "origin": origin, "source": source}


LINKS = ("ici_bandwidth", "ici_latency", "ici_domain", "dcn_bandwidth", "dcn_latency")


def _preset(kind: str) -> tuple[str, dict]:
    """(name, JSON) of a `device_kind`'s shipped profile; ("", {}) where none is shipped."""
    import json

    from locojax.predict.hardware import HARDWARE_DIR

    name = preset_of(kind)
    return name, (json.loads((HARDWARE_DIR / f"{name}.json").read_text()) if name else {})


def _links(kind: str, chips: int) -> dict:
    """The interconnect of a chip this calibration cannot time: its shipped profile's, each
    constant's origin saying so; assumed values for a chip no profile ships."""
    name, preset = _preset(kind)
    if not name:
        why = f"assumed: no shipped profile for {kind!r}, and one process cannot time a link"
        return {"ici_topology": "switch", "ici_bandwidth": const(1e11, "bytes/s", "assumed", why),
                "ici_latency": const(1e-5, "s", "assumed", why),
                "ici_domain": const(chips, "chips", "assumed", why),
                "dcn_bandwidth": const(1.25e10, "bytes/s", "assumed", why),
                "dcn_latency": const(3e-5, "s", "assumed", why)}
    out = {"ici_topology": preset["ici_topology"]}
    for key in LINKS:
        c = preset[key]
        out[key] = {**c, "source": f"copied from the shipped {name} profile (not timed: one "
                                   f"process on its chips has no link to time): {c['source']}"}
    return out


def _preset_hbm(kind: str) -> dict:
    """A device that does not say its memory: its shipped profile's HBM, else none known."""
    name, preset = _preset(kind)
    if not name:
        raise ValueError(f"{kind!r} does not say its memory and no shipped profile has it")
    return preset["hbm_bytes"]


def profile(m: dict, src: str, host_rates: dict) -> dict:
    """The calibrated profile of an accelerator machine (`measure`'s output `m`, `src` where
    and when it was measured): kind `calibrated` on `platform` tpu or gpu, its rates by
    compute dtype (`calibrated.py` reads the run's)."""
    dev = m["device"]
    mk = lambda v, unit, what: const(v, unit, "measured", f"{what}: {src}")  # noqa: E731
    probe = f"calibration decoder {ACCEL_PROBE.decoder}, {ACCEL_PROBE.prompts[0] * 4} and " \
            f"{ACCEL_PROBE.prompts[1] * 4} rows"
    return {
        "name": "here", "kind": "calibrated", "platform": m["platform"],
        "device_kind": dev["kind"],
        "peak_flops": {d: mk(v, "FLOP/s", f"{d} 8192^3 matmul on one {dev['kind']}")
                       for d, v in m["matmul_rates"].items()},
        "hbm_bytes": (mk(dev["memory"], "bytes", "the device allocator's bytes_limit")
                      if dev["memory"] else _preset_hbm(dev["kind"])),
        "hbm_bandwidth": mk(m["hbm_bandwidth"], "bytes/s", "x + 1 over 1 GiB, read + write"),
        "chips_per_host": mk(dev["chips"], "chips", "jax.local_device_count()"),
        "host_cores": mk(m["cores"], "cores", "os.sched_getaffinity"),
        **_links(dev["kind"], dev["chips"]),
        "matmul_efficiency": const(1, "fraction", "spec", "the rates are measured"),
        "hbm_efficiency": const(1, "fraction", "spec", "the bandwidth is measured"),
        "loop_iteration_s": mk(m["program_overhead"]["float32"]["decode_step"]["fixed"], "s",
                               "decode iteration, fixed part, f32"),
        "host_core_speed": const(1, "x the host rates' core", "spec",
                                 "host_rates below are this host's own"),
        "program_overhead": {
            d: {k: {part: mk(v, "s", f"{k} {part.replace('_', ' ')} in {d} beyond its "
                                     f"roofline, {ACCEL_PROBE.decoder} at 1 and 2 layers")
                    for part, v in parts.items()}
                for k, parts in table.items()}
            for d, table in m["program_overhead"].items()},
        "program_rates": {d: {k: mk(v, "FLOP/s", f"{k}'s effective rate in {d}, {probe}")
                              for k, v in table.items()}
                          for d, table in m["program_rates"].items()},
        "host_rates": host_rates,
    }
