"""`locojax predict calibrate`: measure this machine in a few minutes and write a profile
that `locojax predict --hardware FILE` (or `--cluster here-N`) reads.

What is measured, each a median of repeats, nothing fitted to a training run:
- `peak_flops`: an f32 [n, n] @ [n, n] matmul in this process (all its cores), and in a
  child pinned to one core (`flops_per_core`): what one of N local hosts gets;
- `hbm_bandwidth`: bytes/s of a 256 MB copy (read + write);
- `program_overhead`: what one call of locojax's own programs costs beyond its roofline
  term, from a decoder so narrow (d 16, vocab 64) that its FLOPs are negligible, at 1 and 2
  layers: per program kind (`prefill` with the generate call around it, `decode_step` one
  iteration of the decode loop, `train` one update) a fixed part and a part per layer,
  t = fixed + L · per_layer. These are the launches: the dispatch of the program and the
  dozens of small kernels a layer runs, which on a CPU cost more than their FLOPs at small
  shapes;
- `program_rates`: the effective FLOP/s of each kind on locojax's own programs, the slope
  of time against FLOPs between two batch sizes of a calibration decoder no benchmark runs
  (d 128, 3 layers): small matmuls, softmax and the backward's elementwise work included;
- `host_rates`: a step's host Python work through the run's own functions (admission,
  detokenize and reward, the batch's assembly and device put, each a fixed part and a part
  per row; the step's logging): `calibrate_host.py`;
- `dcn_latency`, `dcn_bandwidth`: two processes joined by `jax.distributed` on 127.0.0.1
  (gloo, as `locojax launch` joins its hosts) time a psum at several sizes; a ring
  all-reduce over p = 2 takes 2 (p - 1) α + 2 (p - 1) / p · m / β, fitted for α and β.
On a TPU or GPU (`calibrate_device.py`) the matmul rate and bandwidth are the chip's, the
overheads and program rates are measured in each compute dtype (f32, bf16) on a decoder as
wide as the models it runs, and no link is timed (the chip's shipped profile gives them).
Not measured: ρ(k), how much slower k local hosts run together than each alone on its
share of the cores: no pre-registered set was predicted with it, so it is a probe of the
laboratory (`benchmarks/predict_probes.py oversub`), and the cost model reads no such term.

The device model that reads it (`calibrated.py`): a program's time is
    fixed + L · per_layer + max(flops / F_k(c), bytes / bandwidth)
with the program's FLOPs and bytes (`flops.py`, checked against XLA's `cost_analysis()` of
the compiled programs), F_k(c) the kind's effective rate scaled to c cores as the matmul
rate scales, so a new shape needs no new fit.
Profile fields are described in docs/predict_validation.md.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

from locojax import distributed
from locojax.predict import calibrate_device, calibration_step
from locojax.predict.calibrate_device import ACCEL_PROBE, CPU_PROBE, DTYPES, RateProbe
from locojax.predict.calibrate_device import const as _c
from locojax.predict.calibrate_host import host_rates, matmul_flops, median_time
from locojax.predict.hardware import CALIBRATED

DEFAULT_PATH = CALIBRATED  # where `calibrate` writes and `--cluster here-N` reads
KINDS = ("prefill", "decode_step", "train")
PSUM_BYTES = (4_096, 65_536, 1_048_576, 4_194_304)


def one_core_flops() -> float:
    """`matmul_flops` in a child pinned to one core, as one of N hosts on N cores runs."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "  # before jax
            "from locojax.predict.calibrate import matmul_flops; print(matmul_flops())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def copy_bandwidth(mb: int = 256, reps: int = 5) -> float:
    import numpy as np

    a = np.ones(mb * 2 ** 20 // 8)
    b = np.empty_like(a)
    return 2 * a.nbytes / median_time(lambda: np.copyto(b, a), reps)


def _generate_times(cfg, reps: int, prompts_n: int = 4, samples: int = 2,
                    prompt: int = 8) -> tuple[float, float]:
    """(prefill + call, one decode iteration) seconds of the engine's generate of decoder
    `cfg`: from generates of 8 and 136 new tokens (`prompts_n` prompts x `samples` samples of
    `prompt` tokens)."""
    import jax
    import numpy as np

    from locojax.engine.engine import Engine
    from locojax.engine.sampling import SamplingConfig
    from locojax.model import params

    weights = params.init(cfg, jax.random.key(0))
    prompts = np.asarray(jax.random.randint(jax.random.key(1), (prompts_n, prompt), 0,
                                            cfg.vocab_size), np.int32)
    engine = Engine(cfg)

    def timed(new: int) -> float:
        sampling = SamplingConfig(max_new_tokens=new, temperature=1.0, ignore_eos=True)
        return median_time(lambda: jax.block_until_ready(engine.generate(
            weights, prompts, jax.random.key(0), sampling, num_samples=samples).tokens), reps)

    short, long = timed(8), timed(136)
    iteration = max(0.0, (long - short) / 128)
    return max(0.0, short - 7 * iteration), iteration


def _train_time(cfg, reps: int, prompts_n: int = 2, group: int = 2, p: int = 8,
                n: int = 8) -> float:
    """Seconds of one GRPO update of decoder `cfg` on prompts_n x group rows of p + n tokens
    (default 4 rows of 8 + 8)."""
    step = calibration_step.update(cfg, prompts_n, group, p, n)
    return median_time(step, reps)


def _fixed_and_per_layer(t1: float, t2: float) -> dict[str, float]:
    """{"fixed", "per_layer"} through a cost at 1 and 2 layers, neither below 0."""
    per_layer = max(0.0, t2 - t1)
    return {"fixed": max(0.0, t1 - per_layer), "per_layer": per_layer}


def program_overhead(rates: dict[str, float], bandwidth: float, dtype: str = "float32",
                     decoder: dict = calibration_step.MICRO,
                     reps: int = 5) -> dict[str, dict[str, float]]:
    """Per kind, {"fixed": s, "per_layer": s}: what a call costs beyond the model's own
    roofline term, max(flops / rate, bytes / bandwidth), on `decoder` at 1 and 2 layers. On a
    CPU the narrow decoder, whose roofline term is negligible; on an accelerator one as wide
    as the models the chip runs (`ACCEL_PROBE`): a d 16 decoder's layer hides the latency of
    a real width's kernels: on a v5e its decode token step cost 15 µs a layer where SmolLM2
    and Qwen3-0.6B took ~150-200 µs beyond their bytes (set 10,
    docs/results/predict_tpu_validation.md)."""
    from locojax.model import config
    from locojax.predict.flops import ModelCosts

    beyond = {k: [] for k in KINDS}
    for layers in (1, 2):
        cfg = config.tiny(**{**decoder, "num_hidden_layers": layers}, compute_dtype=dtype)
        mc = ModelCosts(cfg, dtype)
        # The shapes timed, passed to the timers and costed alike, so they cannot drift.
        b, samples, q = 4, 2, 8
        prompts_n, group, p, n = 2, 2, 8, 8
        prefill, step = _generate_times(cfg, reps, b, samples, q)
        timed = {"prefill": (prefill, mc.prefill(b, q)),
                 "decode_step": (step, mc.decode_step(b * samples, q + 136 - 1)),
                 "train": (_train_time(cfg, reps, prompts_n, group, p, n),
                           mc.train_step(prompts_n * group, group, p, n))}
        for kind, (t, c) in timed.items():
            beyond[kind].append(t - max(c.flops / rates[kind], c.bytes / bandwidth))
    return {kind: _fixed_and_per_layer(*ts) for kind, ts in beyond.items()}


def program_rates(peak: float, reps: int = 5, probe: RateProbe = CPU_PROBE,
                  dtype: str = "float32") -> dict[str, float]:
    """Effective FLOP/s of each program kind in compute `dtype` on this process's devices:
    the slope of time against FLOPs between `probe`'s two batch sizes of its decoder's
    prefill (`probe.prompt` tokens), decode iteration (all of its slots) and train step, so
    that the call's overhead cancels; at most `peak`, one large matmul's rate. What the
    machine reaches on locojax's own programs (small matmuls, softmax, the backward's
    elementwise work). The CPU's probe is narrow (`CPU_PROBE`), an accelerator's as wide as
    the models it runs (`ACCEL_PROBE`)."""
    from locojax.model import config
    from locojax.predict.flops import ModelCosts

    cfg = config.tiny(**probe.decoder, compute_dtype=dtype)
    mc = ModelCosts(cfg, dtype)
    p, n, q = probe.train_p, probe.train_n, probe.prompt
    gen = [_generate_times(cfg, reps, b, 4, q) for b in probe.prompts]
    train = [_train_time(cfg, reps, b, 4, p, n) for b in probe.prompts]
    flops = {"prefill": [mc.prefill(b, q).flops for b in probe.prompts],
             "decode_step": [mc.decode_step(4 * b, q + 136 - 1).flops for b in probe.prompts],
             "train": [mc.train_step(4 * b, 4, p, n).flops for b in probe.prompts]}
    times = {"prefill": [g[0] for g in gen], "decode_step": [g[1] for g in gen],
             "train": train}
    out = {}
    for kind in KINDS:
        (f1, f2), (t1, t2) = flops[kind], times[kind]
        # Noise can make the slope meaningless (t2 <= t1): then the larger batch's mean rate;
        # and no program beats one large matmul (`peak`): a faster slope is noise too.
        rate = (f2 - f1) / (t2 - t1) if t2 > t1 else f2 / max(t2, 1e-9)
        out[kind] = min(rate, peak)
    return out


def _psum_worker(pid: int, port: int) -> None:
    distributed.initialize(devices_per_host=1, coordinator=f"127.0.0.1:{port}",
                           num_processes=2, process_id=pid)
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("data",))
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "data"), mesh=mesh,
                              in_specs=P("data"), out_specs=P("data")))
    out = {}
    for size in PSUM_BYTES:
        local = np.ones((1, size // 4), np.float32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
        out[size] = median_time(lambda: f(x).block_until_ready(), 15, warm=3)
    if pid == 0:
        print(json.dumps(out), flush=True)


def collectives(timeout: float = 300) -> dict[str, float]:
    """Latency α and bandwidth β of the link between two local hosts (see the docstring)."""
    import numpy as np

    port = distributed.free_port()
    code = ("import sys; from locojax.predict.calibrate import _psum_worker as w; "
            "w(int(sys.argv[1]), int(sys.argv[2]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("collective probe failed:\n" + outs[0][1][-2000:] + outs[1][1][-2000:])
    times = {int(k): v for k, v in json.loads(outs[0][0].strip().splitlines()[-1]).items()}
    m = np.array(sorted(times), float)
    slope, intercept = np.polyfit(m, [times[int(k)] for k in m], 1)
    # p = 2: t = 2 α + m / β.
    return {"dcn_latency": max(intercept, 1e-7) / 2, "dcn_bandwidth": 1.0 / max(slope, 1e-15),
            "samples": {str(int(k)): times[int(k)] for k in m}}


def measure(say=print) -> dict:
    """Every measurement of the module docstring, saying each as it is taken; on an
    accelerator, its own (`calibrate_device.py`): the chip's rates in each compute dtype."""
    cores = len(os.sched_getaffinity(0))
    out = {"cores": cores, "platform": calibrate_device.platform()}
    if out["platform"] == "cpu":
        steps = (("peak_flops", matmul_flops), ("flops_per_core", one_core_flops),
                 ("hbm_bandwidth", copy_bandwidth),
                 ("program_rates", lambda: program_rates(out["peak_flops"])),
                 ("program_overhead", lambda: program_overhead(out["program_rates"],
                                                               out["hbm_bandwidth"])),
                 ("host_rates", host_rates), ("collectives", collectives))
    else:
        dev = calibrate_device
        steps = (("device", lambda: {"kind": dev.device_kind(), "chips": dev.chips(),
                                     "memory": dev.memory_bytes()}),
                 ("matmul_rates", dev.matmul_rates), ("hbm_bandwidth", dev.hbm_bandwidth),
                 ("program_rates", lambda: {d: program_rates(out["matmul_rates"][d],
                                                             probe=ACCEL_PROBE, dtype=d)
                                            for d in DTYPES}),
                 ("program_overhead", lambda: {d: program_overhead(
                     out["program_rates"][d], out["hbm_bandwidth"], d, ACCEL_PROBE.decoder)
                                               for d in DTYPES}),
                 ("host_rates", host_rates))
    for name, fn in steps:
        t0 = time.perf_counter()
        out[name] = fn()
        say(f"  {name}: {_short(out[name])}  ({time.perf_counter() - t0:.0f} s)")
    return out


QUIET = ("samples",)  # too long to say


def _short(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_short(x)}" for k, x in v.items() if k not in QUIET)
    return v if isinstance(v, str) else f"{v:.4g}"


def profile(m: dict, when: str, load: str) -> dict:
    """The hardware profile (`hardware.load`'s format, kind `calibrated`) of measurements."""
    src = f"`locojax predict calibrate` on {platform.node()} at {when}, load {load}"
    if m.get("platform", "cpu") != "cpu":
        return calibrate_device.profile(m, src, host_rates_of(m, src))
    mk = lambda v, unit, what: _c(v, unit, "measured", f"{what}: {src}")  # noqa: E731
    coll = m["collectives"]
    return {
        "name": "here", "kind": "calibrated",
        "peak_flops": {"float32": mk(m["peak_flops"], "FLOP/s", f"f32 1024^3 matmul on "
                                                               f"{m['cores']} cores")},
        "flops_per_core": mk(m["flops_per_core"], "FLOP/s", "the matmul pinned to one core"),
        "hbm_bytes": _c(_ram(), "bytes", "measured", "host RAM (sysconf), shared"),
        "hbm_bandwidth": mk(m["hbm_bandwidth"], "bytes/s", "256 MB copy, read + write"),
        "chips_per_host": _c(1, "devices", "spec", "a local host is one process, one device"),
        "host_cores": _c(m["cores"], "cores", "measured", "os.sched_getaffinity"),
        "shared_cores": m["cores"],
        "ici_bandwidth": mk(m["hbm_bandwidth"], "bytes/s", "in-process copy"),
        "ici_latency": _c(1e-5, "s", "assumed", "in-process hand-off between device threads"),
        "ici_domain": _c(1, "devices", "spec", "each local host is its own process"),
        "ici_topology": "loopback",
        "dcn_bandwidth": _c(coll["dcn_bandwidth"], "bytes/s", "fitted",
                            f"2-process gloo psum at {len(PSUM_BYTES)} sizes: {src}"),
        "dcn_latency": _c(coll["dcn_latency"], "s", "fitted", f"same fit: {src}"),
        "collective_algorithm": "ring",
        "matmul_efficiency": _c(1, "fraction", "spec", "F is measured, not a peak"),
        "hbm_efficiency": _c(1, "fraction", "spec", "the bandwidth is measured"),
        "loop_iteration_s": mk(m["program_overhead"]["decode_step"]["fixed"], "s",
                               "decode iteration, fixed part"),
        "host_core_speed": _c(1, "x the host rates' core", "spec",
                              "host_rates below are this machine's own"),
        "program_overhead": {k: {part: mk(v, "s", f"{k} {part.replace('_', ' ')}, narrow "
                                                  "decoder at 1 and 2 layers")
                                 for part, v in parts.items()}
                             for k, parts in m["program_overhead"].items()},
        "program_rates": {k: mk(v, "FLOP/s", f"{k}'s effective rate, all cores, calibration "
                                             f"decoder {CPU_PROBE.decoder}")
                          for k, v in m["program_rates"].items()},
        "host_rates": host_rates_of(m, src),
        "collective_samples_s": coll["samples"],
    }


def host_rates_of(m: dict, src: str) -> dict:
    """The profile's `host_rates`: each measured on this host through the run's functions."""
    return {k: _c(v, "s", "measured", f"{k.replace('_', ' ')}: {src}")
            for k, v in m["host_rates"].items()}


def _ram() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

