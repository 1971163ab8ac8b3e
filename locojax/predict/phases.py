"""Per-phase equations of one RL step, shared by every mode.

`Ctx` holds the inputs (model, workload, cluster) and the constants; its methods time each
phase for a group of hosts doing a share of the step's work:
- rollout, per host: admission, prefill, decode (iterations x one decode step, to the
  longest row), env turns (over the host's env workers) with the extend prefill of their
  observations, detokenize + reward, batch assembly;
- the train step: compute, the gradient all-reduce (ICI inside a domain, DCN across:
  `collectives.py`), and with sharded weights FSDP's all-gathers and reduce-scatter;
- rollout tensor parallelism: two activation all-reduces per layer per decode step (ICI);
- weight transfer to rollout hosts (DA, async): a pipelined broadcast over DCN.
Host work runs at this machine's measured per-core rates (`host_rates.json`) times the
profile's `host_core_speed`; where hosts are processes sharing one machine (`shared_cores`)
their env processes share its cores too (`env_seconds`). Static shapes, as the engine:
prompts padded to P columns, every row of a decode loop computed until the longest stops.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from locojax.model import lora
from locojax.model.attention import WHOLE_BLOCKS, KVCache
from locojax.model.config import ModelConfig
from locojax.predict import calibrated
from locojax.predict import collectives as coll
from locojax.predict import compaction
from locojax.predict.devices import device_model
from locojax.predict.flops import ITEMSIZE, Costs, ModelCosts
from locojax.predict.hardware import Cluster
from locojax.predict.origin import Const, Ledger, from_json
from locojax.predict.workload import Workload

HOST_RATES = Path(__file__).parent / "host_rates.json"
OVERLAP = Const(0.8, "fraction of the other layers' compute", "assumed",
                "async collectives overlap compute but share HBM bandwidth and DMA engines "
                "with it, so not all of the compute hides them (the JAX scaling book, "
                "'How to Scale Your Model', ch. Training: FSDP's gathers and reductions "
                "overlap the layers' matmuls when compute-bound)")


def host_rates(path: Path = HOST_RATES) -> dict:
    """The shipped host rates: {name: Const}, or {name: {task: Const}} for a per-task rate."""
    with open(path) as f:
        d = json.load(f)
    return {k: from_json(v, f"{path}: {k}") if "value" in v
            else {t: from_json(e, f"{path}: {k}.{t}") for t, e in v.items()} for k, v in d.items()}


@dataclasses.dataclass
class Ctx:
    """Everything a prediction reads; `ledger` records every constant it used."""

    cfg: ModelConfig
    model_name: str
    wl: Workload
    cluster: Cluster
    dtype: str = "bfloat16"
    kv_read: str = "static"
    remat: bool = False
    fsdp_chips: int = 0  # chips the train state is sharded over (0: the fewest that fit)
    env_workers: int = 0  # env threads per host (0: host_rates' env_workers)
    tp: int = 0  # rollout tensor parallelism (--rollout.tp; 0: the fewest chips that fit)
    cache_dtype: str = ""  # KV cache dtype (--rollout.cache-dtype; "": the compute dtype)
    epochs: int = 1  # passes over the batch per step (--algo.ppo-epochs)
    minibatches: int = 1  # optimizer updates per epoch (--algo.num-minibatches)
    lease_prompts: int = 0  # prompts per lease in the buffered modes (0: placement's default)
    decode_chunk: int = 0  # controller: decode iterations per round trip (0: the whole loop)
    waves: int = 1  # rollout batches per host, where the KV cache of all rows does not fit
    tensorboard: bool = False  # the run writes TensorBoard too (`--tensorboard`)
    offload: bool = False  # --offload auto: held buffers to host memory where needed
    rates: dict = dataclasses.field(default_factory=host_rates)
    ledger: Ledger = dataclasses.field(default_factory=Ledger)

    def __post_init__(self):
        self.mc = ModelCosts(self.cfg, self.dtype, self.cache_dtype)
        self.dev = device_model(self.cluster.hw, self.dtype, self.cfg.num_hidden_layers,
                                self.ledger)
        # A calibrated profile measured this machine's host work: it replaces the shipped.
        self.rates = calibrated.with_host_rates(self.rates, self.cluster.hw)

    # --- constants ----------------------------------------------------------------------

    def c(self, name: str, const: Const) -> float:
        return self.ledger.get(name, const)

    def hw(self, field: str) -> float:
        h = self.cluster.hw
        return self.c(f"{h.name}.{field}", getattr(h, field))

    def rate(self, key: str, task: str | None = None) -> float:
        table = self.rates[key]
        if task is None:
            return self.c(f"host.{key}", table)
        const = table.get(task) or table.get("arith")
        return self.c(f"host.{key}.{task if task in table else 'arith'}", const)

    # --- host work ----------------------------------------------------------------------

    def host_seconds(self, seconds_here: float, cores: float = 1.0) -> float:
        """Host Python work measured on this machine's core, on one core of this host
        (time-sliced below one core)."""
        speed = self.hw("host_core_speed")
        return seconds_here / speed / min(1.0, max(cores, 1e-9))

    def admission(self, prompts: float, cores: float = 1.0) -> float:
        return self.host_seconds(self.rate("admission_per_prompt") * prompts, cores)

    def fixed(self, key: str) -> float:
        """A host phase's cost per call besides its rows (`reward_fixed`, `batch_fixed`):
        measured by `predict calibrate` (`calibrate_host.py`); 0 in the shipped rates,
        which are through-origin fits."""
        return self.rate(key) if key in self.rates else 0.0

    def reward(self, rows: float, cores: float = 1.0) -> float:
        return self.host_seconds(self.fixed("reward_fixed")
                                 + self.rate("reward_per_row", self.wl.task) * rows, cores)

    def batch(self, rows: float, cores: float = 1.0) -> float:
        return self.host_seconds(self.fixed("batch_fixed") + self.rate("batch_per_row") * rows,
                                 cores)

    def step_fixed(self, cores: float = 1.0) -> float:
        """The step's own bookkeeping: its metrics line, and TensorBoard's where the run
        writes it and the rates measured it (`tensorboard_s`, `calibrate_host.py`)."""
        tb = self.fixed("tensorboard_s") if self.tensorboard else 0.0
        return self.host_seconds(self.rate("step_fixed") + tb, cores)

    def env(self, rows: float, cores: float = 1.0) -> float:
        """Tool time of the env turns of `rows` rows over the host's env workers. Where the
        hosts share one machine, `cores` is what this host's env processes get of it (the
        machine's cores over the hosts in env at once), and the rate measured with the whole
        machine is core-seconds over those (`env_seconds`)."""
        turns = self.wl.turns - 1
        if turns <= 0:
            return 0.0
        per = self.wl.tool_s or self.rate("env_per_row_turn", self.wl.task)
        workers = self.env_workers or self.c("host.env_workers", self.rates["env_workers"])
        shared = self.cluster.shared_cores
        if shared:
            t = env_seconds(per, rows, turns, workers, cores, shared)
            return t / self.hw("host_core_speed")
        workers = min(workers, float(self.cluster.hw.host_cores.value))
        return self.host_seconds(per * rows * turns / max(1.0, workers), min(cores, 1.0))

    def env_processes(self, rows: float) -> float:
        """The env processes one host runs at once: its env workers, at most one a row."""
        workers = self.env_workers or self.c("host.env_workers", self.rates["env_workers"])
        return max(1.0, min(workers, rows))

    # --- device work --------------------------------------------------------------------

    def model_parallel(self) -> int:
        """Chips that share one copy of the weights in rollout (tensor parallel): `tp` where
        given, else the fewest, a power of two, whose weights take at most half a chip's
        HBM."""
        return self.tp or self.fewest_chips(self.mc.weight_bytes(), self.cluster.chips)

    def fewest_chips(self, nbytes: float, chips: float) -> int:
        """The smallest power of two n (stopping at the first n >= `chips`) over which
        `nbytes` take at most half a chip's HBM each."""
        hbm, n = float(self.cluster.hw.hbm_bytes.value), 1
        while nbytes / n > 0.5 * hbm and n < chips:
            n *= 2
        return n

    def prefill(self, prompts: float, chips: float, cores: float = 0.0) -> float:
        mp, w = self.model_parallel(), self.waves
        groups = max(1.0, chips / mp)
        per = self.mc.prefill(max(prompts / groups / w, 1e-9), self.wl.prompt_columns)
        tokens = prompts / groups / w * self.wl.prompt_columns  # rows of the matmuls
        t = self.dev.seconds("prefill", per, mp, cores, tokens)
        return w * (t + self.tp_comm(prompts / groups / w * self.wl.prompt_columns, mp))

    def decode_keys(self, steps: float) -> tuple[float, float]:
        """(keys a decode step reads, blocks a layer's attention loop takes), on average over
        `steps` steps (`cache_read`)."""
        return cache_read(self.wl.prompt_columns + self.wl.response_columns - 1,
                          self.wl.prompt_columns + steps / 2, self.kv_read)

    def decode(self, rows: float, chips: float, steps: float, cores: float = 0.0) -> float:
        """`steps` iterations of a decode loop over `rows` rows spread over `chips` chips, in
        each model turn (a multi-turn row decodes once per turn, the cache then holding the
        whole trajectory: `decode_keys`). The loop compacts its finished rows as the engine
        does (`compaction.waves`: halving a device's batch down to MIN_ROWS), each wave's
        iterations costed at its rows.
        In `waves` waves (the KV cache of all rows does not fit), each wave's loop runs as
        long as the whole batch's would (an upper bound: a wave's longest row is shorter)."""
        if steps <= 0:
            return 0.0
        mp, w = self.model_parallel(), self.waves
        groups = max(1.0, chips / mp)
        r = rows / groups / w  # a device's (a model-parallel group's) rows in one loop
        whole = max(1, round(r))
        total, (keys, loop) = 0.0, self.decode_keys(steps)
        for wave in compaction.waves(self.wl.completion, whole, steps):
            at = r * wave.rows / whole
            per = self.mc.decode_step(max(at, 1e-9), keys)
            one = self.dev.seconds("decode_step", per, mp, cores, at, loop)
            total += wave.iterations * (one + self.tp_comm(at, mp))
        return w * self.wl.turns * total

    def extend(self, rows: float, chips: float, cores: float = 0.0) -> float:
        """Prefill of the observation tokens written after each env turn (multi-turn)."""
        turns = self.wl.turns - 1
        if turns <= 0 or not self.wl.obs_tokens:
            return 0.0
        mp = self.model_parallel()
        groups = max(1.0, chips / mp)
        tokens = rows / groups * self.wl.obs_tokens  # a prefill's, its TP traffic included
        per = self.mc.prefill(max(rows / groups, 1e-9), self.wl.obs_tokens)
        return turns * (self.dev.seconds("prefill", per, mp, cores, tokens)
                        + self.tp_comm(tokens, mp))

    def tp_comm(self, tokens: float, mp: int) -> float:
        """Two activation all-reduces per layer for `tokens` tokens over mp chips (ICI)."""
        if mp <= 1:
            return 0.0
        m = tokens * self.cfg.hidden_size * ITEMSIZE[self.dtype]
        one = coll.ici_allreduce(mp, m, self.hw("ici_bandwidth"), self.hw("ici_latency"),
                                 self.cluster.hw.ici_topology)
        return 2 * self.cfg.num_hidden_layers * one

    def train_compute(self, rows: float, chips: float, cores: float = 0.0) -> float:
        wl = self.wl
        per = self.mc.train_step(rows / chips, wl.group, wl.prompt_columns, wl.response_columns,
                                 reference=wl.beta > 0, remat=self.remat)
        return self.dev.seconds("train", per, 1, cores,
                           rows / chips * (wl.prompt_columns + wl.response_columns))

    def logprob_check(self, rows: float, chips: float, cores: float = 0.0) -> float:
        """A rollout worker's trainer forward over its lease's rows (`rollout_worker.py`:
        `rollout/logprob_mismatch` for every row): no-grad, no shared prefix, every row's
        P + N - 1 columns."""
        wl = self.wl
        flops = self.mc.train_forward(rows / chips, 1, wl.prompt_columns,
                                       wl.response_columns)
        return self.dev.seconds("forward", Costs(flops, self.mc.weight_bytes()), 1, cores,
                           rows / chips * (wl.prompt_columns + wl.response_columns))

    def exposed_collectives(self, comm: float, compute: float) -> float:
        """The part of a train step's collectives (gradient reduction, FSDP gathers) that
        its compute does not hide. On accelerators XLA runs them asynchronously, each
        layer's while the other layers compute (its latency-hiding scheduler): up to η_ovl
        of the other L - 1 layers' compute hides them, and at least one layer's share is
        exposed. On a CPU machine (gloo between processes, measured) nothing is hidden:
        XLA:CPU runs a collective in the step's own thread, between the computations."""
        h = self.cluster.hw
        if h.is_cpu or comm <= 0:
            return comm
        layers = self.cfg.num_hidden_layers
        eta = self.c(f"{h.name}.overlap_efficiency", h.extra.get("overlap_efficiency",
                                                                  OVERLAP))
        return max(comm / layers, comm - eta * compute * (layers - 1) / layers)

    def fsdp(self, chips: float) -> int:
        """Chips the train state is sharded over: the fewest (power of two) whose share of
        params, gradients, AdamW moments and the bf16 copy (18 bytes a parameter) fits in
        half a chip's HBM (under LoRA: the adapters' 18 bytes, and the frozen base's own)."""
        if self.fsdp_chips:
            return self.fsdp_chips
        state = 18.0 * lora.num_trainable(self.cfg)
        if lora.enabled(self.cfg):
            state += ITEMSIZE[self.cfg.lora.base_dtype] * self.cfg.num_params()
        return self.fewest_chips(state, chips)

    def train_network(self, chips: int, hosts: int) -> tuple[float, float]:
        """(ICI seconds, DCN seconds) of one update's collectives over `chips` learner chips
        on `hosts` hosts: the f32 gradient all-reduce (data parallel), plus with FSDP two
        all-gathers of the compute-dtype weights and the gradients' reduce-scatter."""
        if chips <= 1 and hosts <= 1:
            return 0.0, 0.0
        h = self.cluster.hw
        grads = 4.0 * lora.num_trainable(self.cfg)  # what trains: LoRA's adapters alone
        domain = int(min(self.hw("ici_domain"), chips))
        per_host = max(1, min(self.cluster.chips_per_host, chips))
        ici, dcn = coll.data_parallel_allreduce(
            int(chips), domain, grads, self.hw("ici_bandwidth"), self.hw("ici_latency"),
            h.ici_topology, self.hw("dcn_bandwidth"), self.hw("dcn_latency"),
            per_host, h.extra.get("collective_algorithm", "best"))
        n = self.fsdp(chips)
        if n > 1:
            w = self.mc.weight_bytes()
            bw, a = self.hw("ici_bandwidth"), self.hw("ici_latency")
            ici += 2 * coll.ring_allgather(min(n, domain), w, bw, a)
        return ici, dcn

    def small_collectives(self, hosts: int, count: int) -> float:
        """`count` small cross-host collectives (metric sums, flags) per step: a ring's
        p - 1 steps (gloo), or a tree's 2 log2 p where the profile picks the best."""
        if hosts <= 1:
            return 0.0
        ring = self.cluster.hw.extra.get("collective_algorithm") == "ring"
        steps = (hosts - 1) if ring else 2 * math.ceil(math.log2(hosts))
        return count * steps * self.hw("dcn_latency")

    def weight_push(self, receivers: int) -> float:
        """Learner → rollout hosts: the compute-dtype weights, one pipelined broadcast over
        the DCN (the parameter server's pull is the same bytes)."""
        if receivers <= 0:
            return 0.0
        m = self.mc.weight_bytes()
        return coll.broadcast(receivers + 1, m, self.hw("dcn_bandwidth"),
                              self.hw("dcn_latency")) + self.sync_fixed()

    def sync_fixed(self) -> float:
        over = self.cluster.hw.extra.get("weight_sync_fixed_s")
        return self.c(f"{self.cluster.hw.name}.weight_sync_fixed_s", over) if over else 0.0


def cache_read(slots: int, filled: float, kv_read: str = "static") -> tuple[float, float]:
    """(keys a decode step reads, blocks one layer's attention loop iterates) for a cache of
    `slots` slots with `filled` written: `actual`, the filled part (a paged engine);
    `static`, what locojax's engine reads (`attention._read_cache`): a cache of at most
    WHOLE_BLOCKS blocks whole, in no loop, else its blocks up to the last written, one an
    iteration of a loop whose kernels a chip pays per block (`calibrated.py`)."""
    n, block = KVCache.blocks(slots)
    if n <= max(1, WHOLE_BLOCKS):
        return (filled if kv_read == "actual" else n * block), 0.0
    keys = min(filled + block / 2, n * block)
    return (filled if kv_read == "actual" else keys), keys / block


def env_seconds(per_row_turn: float, rows: float, turns: int, workers: float,
                cores: float, calibration_cores: float) -> float:
    """Env time of `rows` rows' `turns` tool turns when this host's env processes get
    `cores` cores of the shared machine. `per_row_turn` was measured with the whole machine
    (`calibration_cores`) and `workers` env processes: its work is per_row_turn ·
    min(calibration_cores, workers) core-seconds, and no more than `workers` cores (one
    each) can run it."""
    work = per_row_turn * min(calibration_cores, workers) * rows * turns
    return work / max(min(cores, workers), 1e-9)
