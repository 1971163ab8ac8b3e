"""The accelerator half of `locojax predict calibrate`: what differs when this process's
devices are TPUs or GPUs rather than the host's cores. The matmul rate is the chip's, per
compute dtype (`matmul_rates`), and the bandwidth its HBM's (`hbm_bandwidth`); the programs
are measured on a decoder as wide as the models run there (`ACCEL_PROBE`): the narrow CPU
probe cannot fill a systolic array, so its slope says nothing of a real shape's. No link is
timed: a machine with one host has no DCN to time, and a one-process calibration cannot
open a second process on the chips it holds; the interconnect constants come from the
shipped profile of the same chip (`preset_of`), named as such in the profile (`_links`).
"""

from __future__ import annotations

import dataclasses

from locojax.predict.calibrate_host import matmul_flops, median_time
from locojax.predict.calibration_step import MICRO

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
    narrow: dict | None = None
    """The decoder whose programs at 1 and 2 layers, net of their roofline, give the call
    overheads (`calibrate.program_overhead`); None: `decoder` itself."""


CPU_PROBE = RateProbe(dict(num_hidden_layers=3, hidden_size=128, intermediate_size=384,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           vocab_size=1024), (2, 8), 16, 32, narrow=MICRO)
"""A shape no benchmark or validation point runs (TINY is d 64, SMALL d 256): 8 and 32 rows.
Its overheads are the `MICRO` decoder's, whose FLOPs are negligible on a CPU."""
ACCEL_PROBE = RateProbe(dict(num_hidden_layers=4, hidden_size=768, intermediate_size=2048,
                             num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                             vocab_size=16384), (8, 32), 128, 128, prompt=128)
"""As wide as the models an accelerator runs (SmolLM2-135M is d 576, Qwen3-0.6B d 1024) and
none of them: 32 and 128 rows, prefills of 1k and 4k tokens (an 8-token prompt's rate
over-predicted set 10's 128-256-token prefills 2.6-8x), updates of 8k and 32k tokens. Its
overheads are its own decoder's (a d 16 layer hides a real width's kernel latency), but for
the decode step (`decode_latency`): at 1 and 2 layers of 8 rows it cost 0-20 µs a layer on
a v5e where SmolLM2 and Qwen3-0.6B took ~150 beyond their bytes (sets 10-12)."""
DECODE_GRID = ((2, 8, 8), (8, 8, 8), (2, 8, 128), (8, 8, 128), (8, 32, 128))
"""(layers, prompts, prompt tokens), 4 samples a prompt, that `decode_latency` times: 2 and 8
layers, 32 and 128 rows, caches read whole (143 slots) and in a loop of 9 blocks (263)."""


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


def device() -> dict:
    """{"kind": the first device's `device_kind`, "chips": this process's devices, "memory":
    the bytes one device lets a program hold (its allocator's limit; 0 where it says none)}."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return {"kind": jax.devices()[0].device_kind, "chips": jax.local_device_count(),
            "memory": float(stats.get("bytes_limit", 0))}


def decode_latency(timer, bandwidth: float, dtype: str, peak: float, reps: int = 5,
                   probe: RateProbe = ACCEL_PROBE) -> dict[str, float]:
    """{"fixed", "per_layer", "per_block", "rate"} of a chip's decode step (`calibrated.py`),
    fitted to the iterations `timer` (`calibrate._generate_times`) takes on `DECODE_GRID`.
    Not 1 against 2 layers of a cache read whole: on a chip that difference is in the noise,
    and it runs none of the attention loop's kernels, which a real prompt's cache runs."""
    from locojax.model import config
    from locojax.predict.flops import ModelCosts
    from locojax.predict.phases import cache_read

    terms, beyond = [], []
    for layers, prompts, prompt in DECODE_GRID:
        cfg = config.tiny(**{**probe.decoder, "num_hidden_layers": layers}, compute_dtype=dtype)
        keys, loop = cache_read(prompt + 135, prompt + 72)  # the mean of iterations 8..135
        c = ModelCosts(cfg, dtype).decode_step(prompts * 4, keys)
        terms.append((1.0, layers, layers * loop, c.flops))
        beyond.append(timer(cfg, reps, prompts, 4, prompt)[1] - c.bytes / bandwidth)
    fixed, per_layer, per_block, per_flop = nonnegative_fit(terms, beyond)
    return {"fixed": fixed, "per_layer": per_layer, "per_block": per_block,
            "rate": 1 / per_flop if per_flop > 1 / peak else peak}  # at most one matmul's


def nonnegative_fit(x, y) -> list[float]:
    """Least squares of y on x's columns, none below 0: noise's negative term (no kernel
    gives time back) is dropped and the rest fitted again."""
    import numpy as np

    x, y = np.asarray(x, float), np.asarray(y, float)
    scale, keep = np.abs(x).max(axis=0), list(range(x.shape[1]))  # 1 and 1e10 FLOPs alike
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep] / scale[keep], y, rcond=None)[0] / scale[keep]
        if coef.min() >= 0:
            return coef.tolist()
        keep.remove(int(coef.argmin()))


def const(value: float, unit: str, origin: str, source: str) -> dict:
    """One profile constant in `hardware.load`'s format."""
    return {"value": float(value), "unit": unit, "origin": origin, "source": source}


LINKS = ("ici_bandwidth", "ici_latency", "ici_domain", "dcn_bandwidth", "dcn_latency")


def _links(kind: str, chips: int) -> dict:
    """The interconnect of a chip this calibration cannot time: its shipped profile's, each
    constant's origin saying so; assumed values for a chip no profile ships."""
    from locojax.predict import hardware

    name = preset_of(kind)
    if not name:
        why = f"assumed: no shipped profile for {kind!r}, and one process cannot time a link"
        return {"ici_topology": "switch", "ici_bandwidth": const(1e11, "bytes/s", "assumed", why),
                "ici_latency": const(1e-5, "s", "assumed", why),
                "ici_domain": const(chips, "chips", "assumed", why),
                "dcn_bandwidth": const(1.25e10, "bytes/s", "assumed", why),
                "dcn_latency": const(3e-5, "s", "assumed", why)}
    preset = hardware.load(name)
    out = {"ici_topology": preset.ici_topology}
    for key in LINKS:
        c = getattr(preset, key)
        out[key] = const(c.value, c.unit, c.origin, f"copied from the shipped {name} profile "
                         f"(not timed: one process on its chips has no link to time): {c.source}")
    return out


def _preset_hbm(kind: str) -> dict:
    """A device that does not say its memory: its shipped profile's HBM, else none known."""
    from locojax.predict import hardware

    name = preset_of(kind)
    if not name:
        raise ValueError(f"{kind!r} does not say its memory and no shipped profile has it")
    return dataclasses.asdict(hardware.load(name).hbm_bytes)


def fields(m: dict, mk) -> dict:
    """The profile fields of an accelerator machine (`calibrate.measure`'s output `m`; `mk`
    makes a measured constant) that a CPU machine's do not share: the chip, its rates by
    compute dtype (`calibrated.py` reads the run's), its memory and its links."""
    dev = m["device"]
    return {
        "platform": m["platform"], "device_kind": dev["kind"],
        "peak_flops": {d: mk(v, "FLOP/s", f"{d} 8192^3 matmul on one {dev['kind']}")
                       for d, v in m["matmul_rates"].items()},
        "hbm_bytes": (mk(dev["memory"], "bytes", "the device allocator's bytes_limit")
                      if dev["memory"] else _preset_hbm(dev["kind"])),
        "hbm_bandwidth": mk(m["hbm_bandwidth"], "bytes/s", "x + 1 over 1 GiB, read + write"),
        "chips_per_host": mk(dev["chips"], "chips", "jax.local_device_count()"),
        **_links(dev["kind"], dev["chips"]),
    }
