"""The run config of `locojax train`: one frozen dataclass per subsystem, composed.

Every field has a docstring, which tyro turns into `--help`. Derived values (the learner's
temperature and Dr.GRPO constant, which must equal the sampler's) are computed in one place,
`RunConfig.learner_config`. Validation has two places: each config checks its own values
when it is made (`__post_init__`, so the CLI refuses them while parsing), and `check_run`
checks a whole config against the world before any work starts: its files, the model, the
hosts and devices it will run on. Presets are plain functions at the bottom.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Literal

import tyro

from locojax.envs import registry
from locojax.envs.registry import TaskConfig
from locojax.envs.rewards import RewardConfig
from locojax.model.config import LoraConfig
from locojax.rl.algorithms import resolve
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from locojax.rollout.limits import MultiTurnConfig
from locojax.train import meshes
from locojax.train.curation import CurationConfig
from locojax.train.dynamic_sampling import DynamicSamplingConfig
from locojax.train.meshes import TrainConfig
from locojax.train.placement_config import ASYNC_MODES, PlacementConfig

COMPUTE_DTYPES = {"f32": "float32", "bf16": "bfloat16"}
"""`RunConfig.precision` -> `ModelConfig.compute_dtype` (master weights are always f32); also
`RolloutConfig.cache_dtype` -> `Engine(cache_dtype=...)`, `CheckpointConfig.export_dtype` ->
`loader.save(dtype=...)`."""


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How each step's completions are sampled."""

    prompts_per_step: int = 32
    """B: prompts per step, over all hosts (each is sampled G = algo.group_size times)."""
    max_new_tokens: int = 24
    """N: most tokens per completion."""
    max_prompt_tokens: int | Literal["auto"] = "auto"
    """P: prompts are left-padded to this. auto: the longest prompt of the data, rounded up
    to a bucket (`envs/data_lengths.py`; a generated task's from the longest its generator
    can draw); multi-turn tasks need a number. Every prompt is encoded before step 1: one
    longer than P, or one the tokenizer cannot encode, is refused naming its row
    (--task.skip-invalid: skipped and counted)."""
    temperature: float = 1.0
    """τ: sampling temperature (also the learner's, so logprobs are of one policy)."""
    top_k: int = 0
    """Top-k filtering (0 = off)."""
    top_p: float = 1.0
    """Nucleus filtering (1.0 = off)."""
    ignore_eos: bool = False
    """Never stop early: every completion is exactly max_new_tokens (benchmarks: equal work)."""
    tail_median: int = 0
    """Benchmarks: cap each row's new tokens at a long-tailed lognormal draw of this median (0:
    off; `rollout/lengths.py`; exact with --rollout.ignore-eos; not in controller mode)."""
    tail_sigma: float = 1.0  # σ of --rollout.tail-median's lognormal (engine_work's small-*: 1)
    cache_dtype: Literal["f32", "bf16"] | None = None
    """The KV cache's storage dtype (default: the compute dtype, --precision). bf16 halves the
    cache and its reads; attention still accumulates in f32. The sampler-trainer gap it adds
    is logged as rollout/logprob_mismatch."""
    weights_dtype: Literal["bf16"] | None = None
    """Decode with a bf16 copy of the weights' matrices (None: the learner's weights as they
    are): half the bytes a decode step reads, and bf16 x bf16 -> f32 matmuls. The policy is the
    learner's to bf16 rounding; the gap is logged as rollout/logprob_mismatch (measured on
    the real model in docs/engine_benchmark.md)."""
    tp: int = 1
    """Tensor parallelism of rollout within a host: heads, MLP and vocabulary split over this
    many of the host's devices, rows over the rest (`sharding.ROLLOUT_TP`). It must divide
    the host's devices and the model's heads and MLP width. Every mode: in disaggregated and
    async, the rollout workers' engines."""
    refill_slots: int = 0
    """R: decode at most this many rows at once, a finished row's slot taking the next
    prompt's rows (`engine/refill.py`; 0 = off: a step's rows all at once, finished ones
    compacted out). A multiple of G; single-turn, one device per engine."""
    refill_at: int = 0
    """Free slots at which the decode loop stops to refill (0: G): a multiple of G, at most
    refill_slots; each stop is one host sync and a prefill of refill_at / G prompts."""
    waves: int = 0
    """Generate a step's prompts as this many plain generates one after another, one wave's
    KV cache at a time (`engine/waves.py`): the rollout's memory about 1 / waves, for about
    waves times the decode steps. 0: 1, or the fewest that fit when the memory plan finds
    that the rollout alone does not (single and colocated, whose trainers generate)."""

    def __post_init__(self):
        if self.waves < 0:
            raise ValueError(f"rollout.waves must be >= 0 (0: automatic), got {self.waves}")
        if self.refill_slots < 0 or self.refill_at < 0:
            raise ValueError(f"rollout.refill_slots and refill_at must be >= 0, got "
                             f"{self.refill_slots} and {self.refill_at}")
        for name in ("prompts_per_step", "max_new_tokens", "max_prompt_tokens", "tp"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.cache_dtype not in (None, *COMPUTE_DTYPES):
            raise ValueError(f"rollout.cache_dtype must be one of {sorted(COMPUTE_DTYPES)}, got "
                             f"{self.cache_dtype!r}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: greedy pass@1 and mean reward."""

    every: int = 10
    """Evaluate every this many steps (and before the first and after the last). 0 = never."""
    num_examples: int = 200
    """Held-out examples per evaluation (the first ones of the test split)."""
    batch_size: int = 200
    """Examples per generate call (over all hosts)."""

    def __post_init__(self):
        if self.every < 0 or self.num_examples < 0 or self.batch_size < 1:
            raise ValueError(f"eval.every and eval.num_examples must be >= 0 and "
                             f"eval.batch_size >= 1: {self}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpoints for exact resume."""

    every: int = 0
    """Save every this many steps (and after the last). 0 = only after the last step."""
    keep: int = 2
    """Keep the newest this many checkpoints."""
    resume: bool = True
    """Continue from the newest checkpoint in run_dir, if there is one: only a checkpoint of
    this run (same config but the fields listed in train/resume.py's MAY_CHANGE, same model,
    data and tokenizer); anything else is refused, naming what differs."""
    resume_force: bool = False
    """Resume even where the config or the model, data or tokenizer fingerprints differ from
    the checkpoint's (each difference is logged)."""
    export_dtype: Literal["f32", "bf16"] = "f32"
    """Dtype of the run_dir/final_model export (an HF checkpoint transformers loads as it
    is); bf16 halves it. Training itself keeps f32 master weights."""

    def __post_init__(self):
        if self.every < 0 or self.keep < 1:
            raise ValueError("checkpoint.every must be >= 0 and checkpoint.keep >= 1")


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """--mode controller: how the central controller drives its hosts."""

    decode_chunk: int = 0
    """K: decode iterations per controller round trip; each host keeps its rows and KV cache
    between round trips (a single-controller serving loop's per-iteration dispatch).
    0: one round trip per generate call, each host running the whole jitted decode loop.
    Single-turn tasks; the tokens do not depend on it."""

    def __post_init__(self):
        if self.decode_chunk < 0:
            raise ValueError(f"controller.decode_chunk must be >= 0, got {self.decode_chunk}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A GRPO run: sample → score → advantages → update, for `steps` steps."""

    mode: Literal["single", "colocated", "controller", "disaggregated", "async"] = "colocated"
    """single: one process drives every local device (no process boundary, an in-memory
    all-reduce; not the single-controller baseline). colocated: one process per host, each
    admitting, generating and scoring its own prompts, then one synchronous train step.
    controller (Ray): one central controller admits, dispatches, gathers and scores every
    row for --hosts host processes that train as colocated's do (the single-controller
    baseline).
    disaggregated (Ray): a learner group and rollout workers on separate hosts, rollout of
    step s+1 overlapping training of step s. async (Ray): a parameter server and N rollout
    workers pulling the newest version, samples at most --max-staleness versions old."""
    model: str = "embedded"
    """embedded / embedded-strict / embedded-calc (shipped tiny checkpoints), tiny / small /
    char_demo (random), or an HF checkpoint dir: Qwen3, Qwen2/2.5, Llama 3.x or Gemma 3
    (text) (a GGUF file: `locojax convert` it first)."""
    task: TaskConfig = TaskConfig()
    """The workload."""
    steps: int = 40
    """RL steps."""
    seed: int = 0
    """Seed of every random choice (data order, sampling); a run is reproducible from it."""
    run_dir: str = "runs/demo"
    """Where metrics, plots and checkpoints go."""
    rollout: RolloutConfig = RolloutConfig()
    """Sampling."""
    algo: AlgoConfig = AlgoConfig(group_size=8)
    """The RL objective (algo.group_size is G)."""
    optim: OptimConfig = OptimConfig(lr=1e-4)
    """The optimizer."""
    grad_accum: int = 0
    """Micro-batches per optimizer update (the objective does not change); 0: automatic
    (on CPU, micro-batches whose logits stay in cache; elsewhere 1)."""
    skip_nonfinite: bool = False
    """On a NaN/inf loss or gradient: False stops the run; True skips the update and counts it."""
    reward: RewardConfig = RewardConfig()
    """Reward execution (timeouts, isolation)."""
    multi_turn: MultiTurnConfig = MultiTurnConfig()
    """Multi-turn rollouts: turn and token limits, env timeouts and workers."""
    curation: CurationConfig = CurationConfig()
    """Pass-rate curation of the training prompts (RLAX)."""
    dynamic: DynamicSamplingConfig = DynamicSamplingConfig()
    """Dynamic sampling and overlong shaping (DAPO's rollout side)."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints."""
    devices_per_host: int = 0
    """Simulated CPU devices in this process (0: leave JAX's default). Set by `launch`."""
    profile_dir: str = ""
    """Write a jax.profiler trace of steps 2-4 here (empty: no trace)."""
    tensorboard: bool = True
    """Also write TensorBoard scalars to run_dir/tb."""
    report_to: Literal["none", "tensorboard", "wandb"] = "none"
    """An experiment tracker for the metrics, besides metrics.jsonl, with the same names
    (locojax/trackers.py): wandb (offline under run_dir/wandb unless WANDB_MODE says
    otherwise; the wandb extra), tensorboard (run_dir/tb, as --tensorboard), or none."""
    progress: bool = True
    """Show a live progress bar (process 0 only)."""
    probe_allreduce: bool = False
    """Also time a gradient-sized all-reduce each step, apart from the step (perf/comm/*)."""
    profile_split: bool = False
    """Time the train step as compute, straggler wait and gradient all-reduce: run it as
    separate programs (locojax/rl/split_step.py; params equal the fused step's within a few
    ulps, not bitwise). Data parallel over more than one device only."""
    dump_rollouts: bool = False
    """Write every step's sampled tokens, texts and rewards to run_dir/rollouts/, where they
    are made: one step<s>.slots<a>-<b>.npz per host (or leased unit) and step."""
    # Memory and precision (locojax/train/memory_plan.py, docs/real_size.md).
    precision: Literal["f32", "bf16"] = "f32"
    """Compute dtype of rollout and training. bf16: bf16 activations, matmuls and KV cache
    (softmax, norms and accumulation in f32) over f32 master weights and optimizer state."""
    batch_invariant: bool = False
    """Batch-invariant kernels on both sides (`model/invariant.py`): a token's learner logprob
    is the same bits whatever its micro-batch, row and bucket, and the engine's equals it
    bitwise, so a step's sampler-learner gap must be 0 (`rl/logprob_gap.py`; with the cache
    and weights in the compute dtype). Slower: docs/design.md, "Batch-invariant logprobs"."""
    remat: Literal["auto", "on", "off"] = "auto"
    """Recompute each layer's activations in the backward instead of keeping them (about one
    more forward of compute); see the memory plan's `activations`. auto: on only when the
    memory plan finds the run does not fit without it, or on a CPU host fills more than 40%
    of its RAM, which other processes share (the plan says so)."""
    offload: Literal["auto", "off", "host"] = "auto"
    """auto: when the memory plan finds the run does not fit, keep the reference weights
    (β > 0) in host memory except during the program that reads them (one copy over the
    host link per step), and AdamW's moments too when rollout or evaluation alone does not
    fit otherwise (two copies per step), before trying remat and micro-batches (the plan
    says what it chose). off: keep everything on the device. host: keep both in host memory
    whether or not the device needs the room (where the device has host memory kinds)."""
    logprob_chunk: int = -1
    """Positions per chunk of the learner's logits (each rematerialised). -1: automatic,
    whenever a micro-batch's [rows, T, V] f32 logits would exceed 256 MiB; 0: never."""
    plan_only: bool = False
    """Print the memory plan (per device, from XLA's analysis of this run's programs compiled
    at its exact shapes) and exit without loading weights or running a step."""
    device_memory_gb: float = 0.0
    """Memory per device in GB (10^9 bytes) that the plan must fit; a run that does not is
    refused before its first step. 0: detected (accelerators: memory_stats; CPU: host RAM
    divided among its CPU devices)."""
    controller: ControllerConfig = ControllerConfig()
    """--mode controller: decode dispatch."""
    placement: Annotated[PlacementConfig, tyro.conf.OmitArgPrefixes] = PlacementConfig()
    """Ray modes: placement, staleness, leases (flags without a prefix: --max-staleness)."""
    train: TrainConfig = TrainConfig()
    """The learner's layout: --train.mesh data=D,fsdp=F shards params, gradients and
    optimizer state over fsdp."""
    lora: LoraConfig = LoraConfig()
    """LoRA: --lora.rank r > 0 trains rank-r adapters on a frozen base (docs/lora.md)."""
    time_limit_s: float = 0.0
    """Stop (evaluate, save, export) after the first step that ends this many seconds after
    the trainer started; `steps` stays the upper bound. 0 = no limit. Hosts agree on it."""

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.logprob_chunk < -1:
            raise ValueError(f"logprob_chunk must be >= 0, or -1 for automatic; got "
                             f"{self.logprob_chunk}")
        if self.device_memory_gb < 0:
            raise ValueError(f"device_memory_gb must be >= 0 (0: detect), got "
                             f"{self.device_memory_gb}")
        if self.time_limit_s < 0:
            raise ValueError(f"time_limit_s must be >= 0, got {self.time_limit_s}")
        if self.offload not in ("auto", "off", "host"):
            raise ValueError(f"offload must be 'auto', 'off' or 'host', got {self.offload!r}")
        if self.remat not in ("auto", "on", "off"):
            raise ValueError(f"remat must be 'auto', 'on' or 'off', got {self.remat!r}")
        if self.precision not in COMPUTE_DTYPES:
            raise ValueError(f"precision must be one of {sorted(COMPUTE_DTYPES)}, got "
                             f"{self.precision!r}")
        if self.dynamic.overlong_buffer > self.rollout.max_new_tokens:
            raise ValueError(f"dynamic.overlong_buffer={self.dynamic.overlong_buffer} exceeds "
                             f"rollout.max_new_tokens={self.rollout.max_new_tokens}")
        if (self.dynamic.overlong_filter or self.dynamic.overlong_buffer) \
                and self.rollout.ignore_eos:
            raise ValueError("overlong shaping needs stop tokens: with rollout.ignore_eos every "
                             "response is cut off")
        if self.mode in ASYNC_MODES and (self.curation.enabled or self.dynamic.max_rounds):
            # Workers admit each step's prompts on their own: exact only while step s's
            # admission is a function of s alone, i.e. with no pass-rate table learnt on the
            # learner.
            raise ValueError(f"mode {self.mode!r}: --curation.enabled and --dynamic.max-rounds "
                             "run in the single and colocated modes so far")
        if self.rollout.waves > 1 and (self.rollout.refill_slots or self.mode == "controller"):
            raise ValueError("--rollout.waves N > 1 generates whole batches one after another: "
                             "not with --rollout.refill-slots, nor in the controller mode, "
                             "whose hosts decode in chunks")
        if self.profile_split and self.train.fsdp > 1:
            raise ValueError("--profile-split times a data-parallel step; with --train.mesh "
                             "fsdp > 1 XLA schedules the collectives inside the step")
        if self.lora.rank and self.profile_split:
            raise ValueError("--profile-split does not time a LoRA step yet: drop it or "
                             "--lora.rank")
        resolve(self.learner_config().algo)  # unknown algorithm, missing Dr.GRPO constant, ...

    @property
    def group_size(self) -> int:
        return self.algo.group_size

    def learner_config(self) -> LearnerConfig:
        """The learner's config, with the values it must share with the sampler filled in
        (remat auto starts off; the memory plan may turn it on)."""
        algo = dataclasses.replace(self.algo, max_response_len=self.rollout.max_new_tokens)
        return LearnerConfig(algo=algo, optim=self.optim, grad_accum=self.grad_accum,
                             temperature=self.rollout.temperature,
                             skip_nonfinite=self.skip_nonfinite, remat=self.remat == "on",
                             logprob_chunk=self.logprob_chunk, rules=self.train.rules)


def check_run(cfg: RunConfig, num_processes: int, num_devices: int) -> None:
    """Refuse a config that cannot run here: its model or data are missing, or its batch
    does not split over these hosts and devices. Before any work starts."""
    from locojax.model.config import PRESETS as MODEL_PRESETS
    from locojax.model.loader import EMBEDDED

    if cfg.model not in (*EMBEDDED, *MODEL_PRESETS) and not Path(cfg.model).is_dir():
        raise ValueError(f"model {cfg.model!r} is neither a shipped checkpoint "
                         f"({', '.join(EMBEDDED)}), a preset ({', '.join(MODEL_PRESETS)}) nor a "
                         "directory")
    registry.check(cfg.task)
    b, g = cfg.rollout.prompts_per_step, cfg.group_size
    if cfg.mode == "single" and num_processes > 1:
        raise ValueError("mode 'single' is one controller: run it as one process (without "
                         "`launch`), or use mode 'colocated'")
    if b % num_processes:
        raise ValueError(f"rollout.prompts_per_step={b} does not split over {num_processes} "
                         "hosts: each host must get whole groups")
    cfg.train.shape(num_devices)  # --train.mesh must cover the learner's devices
    meshes.check_tp(cfg.rollout.tp, num_devices // num_processes)  # and tp a host's
    rows = b * g
    if rows % num_devices:
        raise ValueError(f"prompts_per_step x group_size = {b} x {g} = {rows} rows do not "
                         f"split over {num_devices} devices")
    if (rows // num_devices) % cfg.learner_config().rows_multiple:
        raise ValueError(f"{rows // num_devices} rows per device do not split into "
                         f"num_minibatches={cfg.algo.num_minibatches} x grad_accum="
                         f"{cfg.grad_accum} micro-batches")
    if cfg.eval.every and cfg.eval.batch_size % num_processes:
        raise ValueError(f"eval.batch_size={cfg.eval.batch_size} does not split over "
                         f"{num_processes} hosts")


# --- presets -------------------------------------------------------------------------------


def demo() -> RunConfig:
    """The embedded default: GRPO on 2-digit add/subtract from a shipped tiny checkpoint.

    The checkpoint (`embedded-strict`) already answers on a `#### N` line, but stopped halfway
    through learning the arithmetic (step 600 of a 1150-step SFT schedule), so what GRPO
    improves is the arithmetic itself (docs/demo.md, docs/learning.md). The learner's values
    held up in docs/learning.md's sweep (one seed, from a later SFT step): lr 2e-4, 16
    prompts, G = 4, eps_high 0.28 and temperature 0.7 each gained less in 5 minutes.
    """
    return RunConfig(
        model="embedded-strict", task=TaskConfig(name="arith", level=2), steps=300,
        rollout=RolloutConfig(prompts_per_step=32, max_new_tokens=12),  # P auto: 8
        optim=OptimConfig(lr=1e-4, warmup_steps=20), eval=EvalConfig(every=25),
    )


def gsm8k_qwen3(model_dir: str = "", data: str = "") -> RunConfig:
    """A real model on GSM8K: an HF Qwen3 directory and an HF-format GSM8K file."""
    return RunConfig(
        model=model_dir, task=TaskConfig(name="gsm8k", data=data, template="qwen"),
        rollout=RolloutConfig(prompts_per_step=32, max_new_tokens=512, max_prompt_tokens=256),
        optim=OptimConfig(lr=1e-6), run_dir="runs/gsm8k",
        eval=EvalConfig(every=20, num_examples=256, batch_size=64),
    )


def calc_demo() -> RunConfig:
    """Multi-turn tool use: GRPO on `calc` (3-digit x 2-digit products) from the shipped
    tiny-calc checkpoint, which mostly answers without its calculator tool; GRPO learns to
    call it (docs/calc_demo.md has the measured run)."""
    return RunConfig(
        model="embedded-calc", task=TaskConfig(name="calc", level=2), steps=40,
        rollout=RolloutConfig(prompts_per_step=32, max_new_tokens=32, max_prompt_tokens=8),
        # One call and its answer take ~58 tokens; a second call no longer fits (truncated).
        multi_turn=MultiTurnConfig(max_obs_tokens=32, max_trajectory_tokens=72),
        optim=OptimConfig(lr=1e-4, warmup_steps=10), eval=EvalConfig(every=5),
        run_dir="runs/calc-demo",
    )


REAL_MODEL_DIR = "models/SmolLM2-135M-Instruct"
"""Where `make real-model` (`locojax convert smollm2`) writes the real checkpoint."""


def real_demo() -> RunConfig:
    """A real model learning: SmolLM2-135M-Instruct (`make real-model`) on arith level 0 in
    chat form ("What is 9 + 18? Give only the final number."), scored by the last number
    of its reply. It answers 33% of the 200 held-out problems greedily at the start, often
    after rambling past the 32-token budget; docs/real_model.md has the measured runs
    (held-out accuracy, format rate and accuracy in format, three seeds). lr 1e-5, no
    warm-up: the values of the one exploratory run made before the seeds were registered."""
    return RunConfig(
        model=REAL_MODEL_DIR, mode="single", steps=40,
        task=TaskConfig(name="arith", level=0, template="chat", reward="flexible"),
        rollout=RolloutConfig(prompts_per_step=8, max_new_tokens=32),  # P auto: 48
        algo=AlgoConfig(group_size=8), optim=OptimConfig(lr=1e-5, warmup_steps=0),
        eval=EvalConfig(every=10, num_examples=200, batch_size=100), run_dir="runs/demo-real",
    )


def swe() -> RunConfig:
    """Multi-turn bug fixing: generated repositories (or `--task.data DIR` of your own tasks),
    view/replace/run_tests/submit tools, tests in the sandbox; at the turn limit the
    repository is tested as it stands (autosubmit). The default model is the random TINY
    preset, which exercises the pipeline only; pass `--model` for a real one."""
    return RunConfig(
        model="tiny", task=TaskConfig(name="swe", level=1, autosubmit=True), steps=20,
        rollout=RolloutConfig(prompts_per_step=4, max_new_tokens=64, max_prompt_tokens=768),
        algo=AlgoConfig(group_size=4),
        multi_turn=MultiTurnConfig(max_turns=4, max_obs_tokens=256, max_trajectory_tokens=640),
        eval=EvalConfig(every=0, num_examples=16, batch_size=16), run_dir="runs/swe",
    )


PRESETS = {
    "demo": ("GRPO on built-in arith from the embedded tiny checkpoint", demo()),
    "gsm8k": ("an HF Qwen3 checkpoint on GSM8K (pass --model and --task.data)", gsm8k_qwen3()),
    "calc-demo": ("multi-turn tool use (calc) from the embedded tiny-calc checkpoint",
                  calc_demo()),
    "real-demo": ("SmolLM2-135M-Instruct (make real-model) learning chat arithmetic",
                  real_demo()),
    "swe": ("multi-turn bug fixing in the sandbox (generated repos or --task.data DIR)", swe()),
}
