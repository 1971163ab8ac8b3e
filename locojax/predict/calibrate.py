"""`locojax predict calibrate`: measure this machine in a few minutes and write a profile
that `locojax predict --hardware FILE` (or `--cluster here-N`) reads.

What is measured, each a median of repeats, nothing fitted to a training run:
- `peak_flops`: an f32 [n, n] @ [n, n] matmul in this process (all its cores), and in a
  child pinned to one core (`flops_per_core`): what one of N local hosts gets;
- `hbm_bandwidth`: bytes/s of a 256 MB copy (read + write);
- `program_overhead`: per program kind (`prefill` with the generate call around it,
  `decode_step` one iteration of the decode loop, `train` one update), what one call costs
  beyond its roofline term, fixed + L · per_layer: the program's dispatch and the dozens of
  small kernels a layer runs, which on a CPU cost more than their FLOPs at small shapes;
- `program_rates`: the effective FLOP/s of each kind on locojax's own programs;
- `host_rates`: a step's host Python work through the run's own functions
  (`calibrate_host.py`);
- `dcn_latency`, `dcn_bandwidth`: two processes joined by `jax.distributed` on 127.0.0.1
  (gloo, as `locojax launch` joins its hosts) time a psum at several sizes; a ring
  all-reduce over p = 2 takes 2 (p - 1) α + 2 (p - 1) / p · m / β, fitted for α and β.
On a TPU or GPU the same pipeline measures the chip instead (`calibrate_device.py`: its
matmul rates and bandwidth, its programs in each compute dtype on a wide decoder, the decode
step a fit of its own, `decode_latency`; no link). Not measured: ρ(k), k local hosts'
slowdown together (a laboratory probe: `benchmarks/predict_probes.py oversub`). The model
reading the profile is `calibrated.py`; its fields: docs/predict_validation.md.
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


def _train_time(cfg, reps: int, prompts_n: int, group: int, p: int, n: int) -> float:
    """Seconds of one GRPO update of decoder `cfg` on prompts_n x group rows of p + n tokens."""
    return median_time(calibration_step.update(cfg, prompts_n, group, p, n), reps)


def _timed(cfg, dtype: str, reps: int, prompts: int, samples: int, q: int,
           train: tuple[int, int, int, int]) -> dict:
    """{kind: (seconds, Costs)} of decoder `cfg`'s programs in `dtype`: the generate of
    `prompts` x `samples` rows of `q`-token prompts, and the update of `train` = (prompts,
    group, p, n). The shapes timed are the shapes costed, so the two cannot drift."""
    from locojax.predict.flops import ModelCosts

    mc = ModelCosts(cfg, dtype)
    prefill, step = _generate_times(cfg, reps, prompts, samples, q)
    prompts_n, group, p, n = train
    return {"prefill": (prefill, mc.prefill(prompts, q)),
            "decode_step": (step, mc.decode_step(prompts * samples, q + 136 - 1)),
            "train": (_train_time(cfg, reps, *train),
                      mc.train_step(prompts_n * group, group, p, n))}


def program_overhead(rates: dict[str, float], bandwidth: float, dtype: str = "float32",
                     probe: RateProbe = CPU_PROBE,
                     reps: int = 5) -> dict[str, dict[str, float]]:
    """Per kind, {"fixed": s, "per_layer": s}: what a call costs beyond its roofline term,
    max(flops / rate, bytes / bandwidth), on `probe`'s narrow decoder (`RateProbe.narrow`)
    at 1 and 2 layers (4 prompts x 2 samples of 8 tokens; updates of 2 x 2 rows of 8 + 8)."""
    from locojax.model import config

    beyond = {k: [] for k in KINDS}
    for layers in (1, 2):
        decoder = {**(probe.narrow or probe.decoder), "num_hidden_layers": layers}
        cfg = config.tiny(**decoder, compute_dtype=dtype)
        for kind, (t, c) in _timed(cfg, dtype, reps, 4, 2, 8, (2, 2, 8, 8)).items():
            beyond[kind].append(t - max(c.flops / rates[kind], c.bytes / bandwidth))
    # The line through 1 and 2 layers, neither part below 0.
    return {kind: {"fixed": max(0.0, t1 - max(0.0, t2 - t1)), "per_layer": max(0.0, t2 - t1)}
            for kind, (t1, t2) in beyond.items()}


def program_rates(peak: float, reps: int = 5, probe: RateProbe = CPU_PROBE,
                  dtype: str = "float32") -> dict[str, float]:
    """Effective FLOP/s of each program kind in compute `dtype` on this process's devices:
    the slope of time against FLOPs between `probe`'s two batch sizes of its decoder's
    prefill (`probe.prompt` tokens), decode iteration (all of its slots) and train step, so
    that the call's overhead cancels; at most `peak`, one large matmul's rate: what small
    matmuls, softmax and the backward's elementwise work reach (probes: `CPU_PROBE`, a
    chip's `ACCEL_PROBE`)."""
    from locojax.model import config

    cfg = config.tiny(**probe.decoder, compute_dtype=dtype)
    runs = [_timed(cfg, dtype, reps, b, 4, probe.prompt, (b, 4, probe.train_p, probe.train_n))
            for b in probe.prompts]
    out = {}
    for kind in KINDS:
        (t1, c1), (t2, c2) = (run[kind] for run in runs)
        f1, f2 = c1.flops, c2.flops
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


def measure(say=lambda name, value, seconds: None) -> dict:
    """Every measurement of the module docstring, each told to `say` as it is taken. On an
    accelerator the machine's rates are the chip's (`calibrate_device.py`) and the programs
    are measured in each compute dtype; on a CPU in f32, which serves any."""
    import jax

    out = {"cores": len(os.sched_getaffinity(0)), "platform": jax.default_backend()}
    chip, dev = out["platform"] != "cpu", calibrate_device
    probe = ACCEL_PROBE if chip else CPU_PROBE

    def each(fn):  # a chip's programs in each compute dtype; a CPU's in f32 alone
        tables = {d: fn(d) for d in (DTYPES if chip else ("float32",))}
        return tables if chip else tables["float32"]

    def of(name: str, d: str):  # one dtype's measurement (a CPU's only one)
        return out[name][d] if chip else out[name]
    if chip:
        machine = (("device", dev.device), ("matmul_rates", dev.matmul_rates),
                   ("hbm_bandwidth", dev.hbm_bandwidth))
    else:
        machine = (("peak_flops", matmul_flops), ("flops_per_core", one_core_flops),
                   ("hbm_bandwidth", copy_bandwidth))
    peak = "matmul_rates" if chip else "peak_flops"
    steps = (*machine,
             ("program_rates", lambda: each(lambda d: program_rates(
                 of(peak, d), probe=probe, dtype=d))),
             ("program_overhead", lambda: each(lambda d: program_overhead(
                 of("program_rates", d), out["hbm_bandwidth"], d, probe))),
             *((("decode_latency", lambda: each(lambda d: dev.decode_latency(
                 _generate_times, out["hbm_bandwidth"], d, of(peak, d)))),) if chip else ()),
             ("host_rates", host_rates), *(() if chip else (("collectives", collectives),)))
    for name, fn in steps:
        t0 = time.perf_counter()
        out[name] = fn()
        say(name, out[name], time.perf_counter() - t0)
    return out


def profile(m: dict, when: str, load: str) -> dict:
    """The hardware profile (`hardware.load`'s format, kind `calibrated`) of `measure`'s
    output `m`: on an accelerator the chip's fields (`calibrate_device.fields`) and program
    tables by compute dtype; on a CPU the cores', the link between two local hosts, and one
    f32 table of each."""
    src = f"`locojax predict calibrate` on {platform.node()} at {when}, load {load}"
    mk = lambda v, unit, what: _c(v, unit, "measured", f"{what}: {src}")  # noqa: E731
    chip = m.get("platform", "cpu") != "cpu"
    probe = ACCEL_PROBE if chip else CPU_PROBE
    rows = f"{probe.prompts[0] * 4} and {probe.prompts[1] * 4} rows"
    fit = m.get("decode_latency") if chip else None  # a chip's decode step: its own fit
    grid = f"fitted to {probe.decoder}'s decode at {calibrate_device.DECODE_GRID}"

    def overhead(table, d):
        return {k: {part: mk(v, "s", f"{k} {part.replace('_', ' ')}{d} " + (
            grid if "per_block" in parts else f"beyond its roofline, "
                                              f"{probe.narrow or probe.decoder} at 1 and 2 layers"))
                    for part, v in parts.items()} for k, parts in table.items()}

    def rates(table, d):
        return {k: mk(v, "FLOP/s", f"{k}'s effective rate{d}, " + (
            grid if fit and k == "decode_step" else f"calibration decoder {probe.decoder}, "
                                                    f"{rows}")) for k, v in table.items()}
    over, rate = m["program_overhead"], m["program_rates"]
    if fit:
        parts = ("fixed", "per_layer", "per_block")
        over = {d: {**t, "decode_step": {k: fit[d][k] for k in parts}} for d, t in over.items()}
        rate = {d: {**t, "decode_step": fit[d]["rate"]} for d, t in rate.items()}
    f32 = over["float32"] if chip else over
    return {
        "name": "here", "kind": "calibrated",
        **(calibrate_device.fields(m, mk) if chip else _cpu_fields(m, mk, src)),
        "host_cores": mk(m["cores"], "cores", "os.sched_getaffinity"),
        "matmul_efficiency": _c(1, "fraction", "spec", "the rates are measured, not peaks"),
        "hbm_efficiency": _c(1, "fraction", "spec", "the bandwidth is measured"),
        "loop_iteration_s": mk(f32["decode_step"]["fixed"], "s",
                               "decode iteration, fixed part, f32"),
        "host_core_speed": _c(1, "x the host rates' core", "spec",
                              "host_rates below are this machine's own"),
        "program_overhead": ({d: overhead(t, f" in {d}") for d, t in over.items()} if chip
                             else overhead(over, "")),
        "program_rates": ({d: rates(t, f" in {d}") for d, t in rate.items()} if chip
                          else rates(rate, ", all cores")),
        "host_rates": {k: mk(v, "s", k.replace("_", " ")) for k, v in m["host_rates"].items()},
    }


def _cpu_fields(m: dict, mk, src: str) -> dict:
    """The profile fields of a CPU machine that an accelerator's do not share: its cores'
    matmul rate, its RAM, and its local hosts as processes sharing its cores, joined by the
    link `collectives` timed."""
    coll = m["collectives"]
    return {
        "peak_flops": {"float32": mk(m["peak_flops"], "FLOP/s", f"f32 1024^3 matmul on "
                                                               f"{m['cores']} cores")},
        "flops_per_core": mk(m["flops_per_core"], "FLOP/s", "the matmul pinned to one core"),
        "hbm_bytes": _c(_ram(), "bytes", "measured", "host RAM (sysconf), shared"),
        "hbm_bandwidth": mk(m["hbm_bandwidth"], "bytes/s", "256 MB copy, read + write"),
        "chips_per_host": _c(1, "devices", "spec", "a local host is one process, one device"),
        "shared_cores": m["cores"],
        "ici_bandwidth": mk(m["hbm_bandwidth"], "bytes/s", "in-process copy"),
        "ici_latency": _c(1e-5, "s", "assumed", "in-process hand-off between device threads"),
        "ici_domain": _c(1, "devices", "spec", "each local host is its own process"),
        "ici_topology": "loopback",
        "dcn_bandwidth": _c(coll["dcn_bandwidth"], "bytes/s", "fitted",
                            f"2-process gloo psum at {len(PSUM_BYTES)} sizes: {src}"),
        "dcn_latency": _c(coll["dcn_latency"], "s", "fitted", f"same fit: {src}"),
        "collective_algorithm": "ring",
        "collective_samples_s": coll["samples"],
    }


def _ram() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
