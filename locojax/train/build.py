"""One builder for every role of a run: what a config turns into, made in one place.

    parts = RunParts.of(cfg)              # task, model config, tokenizer, sampling, limits
    engine = parts.engine(mesh)           # this role's devices
    weights = parts.weights(mesh, rules)  # loaded straight into that layout
    producer = parts.producer(engine, runner)

A learner host (single, colocated, the Ray learner group), a Ray rollout worker and a
controller's host all build their parts here; they differ only in the mesh, the layout
rules, and where rewards are scored. Nothing reads a weight until `weights` is called, so
planning a run (`--plan-only`) builds the parts and an engine, compiles, and stops.

The commands that only sample build here too, so a model is read, tokenized and sampled
the way training does it (f32 master weights, the run's compute dtype, the same stop ids):
`locojax eval` builds a whole `RunParts` from its flags; `locojax generate` and `locojax
curate`, which have no run's task, call the part functions below (`model_config`,
`tokenizer_of`, `sampling_of`, `engine_of`, `weights_of`) that `RunParts` is made of.
"""

from __future__ import annotations

import dataclasses

import jax

from locojax.engine.engine import CACHE_DTYPES, WEIGHT_DTYPES, Engine
from locojax.engine.refill import Refill
from locojax.engine.sampling import SamplingConfig
from locojax.envs import data_lengths, registry
from locojax.envs.base import Task
from locojax.model import loader, lora
from locojax.model.config import ModelConfig
from locojax.model.params import Weights
from locojax.model.sharding import ROLLOUT_REPLICATED, Rules, weight_shardings
from locojax.rl import logprob_gap
from locojax.rl.config import LearnerConfig
from locojax.rollout import limits as limits_lib
from locojax.tokenizer import Tokenizer
from locojax.tokenizer.chat_template import with_chat_template
from locojax.train.config import COMPUTE_DTYPES, RolloutConfig, RunConfig
from locojax.train.curation import Curator
from locojax.train.data import PromptStream
from locojax.train.producer import Producer


LORA_KEY = 0x10_7A
"""Folded into `key(seed)` for the adapters' A, so they do not share the rollouts' draws."""


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What every role of a run derives from its config, before any weight or device."""

    cfg: RunConfig
    task: Task
    model_cfg: ModelConfig  # f32 master weights, computing in the run's precision
    tokenizer: Tokenizer
    learner: LearnerConfig
    sampling: SamplingConfig  # how rollouts are sampled (every producer, and the plan)
    limits: limits_lib.Limits | None  # multi-turn: resolved, checked to fit cache and model
    prompts: data_lengths.Sized | None = None  # P and the prompt lengths it came from

    @classmethod
    def of(cls, cfg: RunConfig) -> RunParts:
        cfg, task, tokenizer, prompts = sized(cfg)
        model_cfg = model_config(cfg.model, cfg.precision)
        if cfg.batch_invariant:  # fixed-order kernels on both sides (model/invariant.py)
            model_cfg = dataclasses.replace(model_cfg, batch_invariant=True)
        if cfg.lora.rank:  # adapters on a frozen base: what the learner trains (lora.py)
            model_cfg = dataclasses.replace(model_cfg, lora=cfg.lora)
        if cfg.optim.hf_padding_idx:
            model_cfg = dataclasses.replace(model_cfg, embedding_padding_idx=tokenizer.pad_id)
        limits = None if not task.multi_turn else limits_lib.resolve(
            cfg.multi_turn, task.max_turns, cfg.rollout.max_new_tokens,
            cfg.rollout.max_prompt_tokens, model_cfg.max_position_embeddings)
        return cls(cfg, task, model_cfg, tokenizer, cfg.learner_config(),
                   sampling_of(cfg.rollout, tokenizer), limits, prompts)

    def engine(self, mesh, rules: Rules = ROLLOUT_REPLICATED) -> Engine:
        r = self.cfg.rollout
        return engine_of(self.model_cfg, mesh, rules, r.cache_dtype, r.weights_dtype,
                         Refill(r.refill_slots, r.refill_at) if r.refill_slots else None,
                         max(1, r.waves))

    def gap_bound(self, terms: float, columns: int) -> float:
        """The largest sampler-learner logprob gap rounding explains (`rl/logprob_gap.py`) at
        `terms` (`logprob_gap.logit_terms` of the weights) and `columns` keys."""
        r = self.cfg.rollout
        narrow = [d for d in (CACHE_DTYPES.get(r.cache_dtype), WEIGHT_DTYPES.get(r.weights_dtype))
                  if d is not None]
        if lora.enabled(self.model_cfg):  # the sampler's merged weights: a narrower base's
            narrow.append(self.model_cfg.lora.base_dtype)
        return logprob_gap.bound(self.model_cfg, float(terms), columns, self.learner.temperature,
                                 narrow)

    def check_gap(self, metrics: dict, columns: int, sampler_version: int,
                  learner_version: int) -> None:
        """Stop the run if this step's sampler-learner logprob gap passed the bound rounding
        explains (`rl/logprob_gap.py`), naming both weight versions; the bound is logged as
        `rollout/logprob_gap_bound`. columns: the train batch's width (the keys' count)."""
        if "rollout/logprob_gap_max" not in metrics:  # stale rows: measured by the workers
            return
        limit = self.gap_bound(metrics["rollout/logit_terms"], columns)
        metrics["rollout/logprob_gap_bound"] = limit
        logprob_gap.check(metrics, limit, sampler_version, learner_version)

    def weights(self, mesh, rules: Rules) -> Weights:
        """The starting weights, loaded (or initialised, for presets) straight into `rules`'
        layout over `mesh`, even when it spans processes."""
        return weights_of(self.cfg.model, self.cfg.seed, self.cfg.precision, mesh, rules)

    def train_weights(self, mesh, rules: Rules) -> tuple[Weights, Weights | None]:
        """(What the optimizer trains, the frozen base or None), laid out by `rules` over
        `mesh`: the starting weights; under LoRA, fresh adapters drawn from the run's seed
        and the starting weights as the base, in `--lora.base-dtype` (`lora.py`)."""
        weights = self.weights(mesh, rules)
        if not lora.enabled(self.model_cfg):
            return weights, None
        cfg = self.model_cfg
        init = jax.jit(lora.init, static_argnums=0,
                       out_shardings=weight_shardings(cfg, mesh, rules, lora.declare(cfg)))
        key = jax.random.fold_in(jax.random.key(self.cfg.seed), LORA_KEY)
        return init(cfg, key), lora.base_copy(cfg, weights)

    def curator(self) -> Curator:
        """A fresh admission state: the pass-rate table, the re-admission queue, the cursor."""
        cfg = self.cfg
        return Curator(cfg.curation, PromptStream(self.task.train, cfg.seed),
                       cfg.rollout.prompts_per_step, cfg.seed)

    def producer(self, engine: Engine, runner, dump_dir: str | None = None) -> Producer:
        """The producer half of a step on `engine`, scoring with `runner` (a `RewardRunner`,
        or the Ray modes' verifier pool). Its curator is its own: the learner's is the one
        its inline source advances; a rollout worker's, with curation off, admits step s as
        a function of s alone."""
        cfg = self.cfg
        return Producer(engine, self.tokenizer, self.task, runner, self.curator(),
                        self.learner.algo, self.sampling, cfg.rollout.prompts_per_step,
                        cfg.rollout.max_prompt_tokens, jax.random.key(cfg.seed), cfg.dynamic,
                        cfg.multi_turn, self.limits, dump_dir,
                        tail=(cfg.rollout.tail_median, cfg.rollout.tail_sigma))


def sized(cfg: RunConfig) -> tuple[RunConfig, Task, Tokenizer, data_lengths.Sized]:
    """`cfg` with P resolved, its task with every prompt encoded once (P sized from the
    data for auto, rows over P refused or skipped), the tokenizer, and what sizing found.
    `RunParts.of` builds on it; `locojax predict train` takes its P."""
    task = registry.build(cfg.task, cfg.seed, cfg.multi_turn.max_turns)
    tokenizer = tokenizer_of(cfg.model, cfg.task.template)
    task, prompts = data_lengths.fit(task, tokenizer, cfg.rollout.max_prompt_tokens,
                                     cfg.task.skip_invalid)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(
        cfg.rollout, max_prompt_tokens=prompts.max_prompt_tokens))
    return cfg, task, tokenizer, prompts


def model_config(model: str, precision: str = "f32") -> ModelConfig:
    """The config of `model` (a spec of `loader.load`), computing in `precision`."""
    return loader.load_config(model, **_dtypes(precision))


def tokenizer_of(model: str, template: str = "plain") -> Tokenizer:
    """`model`'s tokenizer; with template `chat`, carrying the checkpoint's chat template."""
    tokenizer = loader.load_tokenizer_of(model)
    if template == "chat":
        tokenizer = with_chat_template(tokenizer, loader.resolve_dir(loader.base_of(model)[0]))
    return tokenizer


def sampling_of(rollout: RolloutConfig, tokenizer: Tokenizer) -> SamplingConfig:
    """How `rollout` samples, stopping at `tokenizer`'s stop ids and padding with its pad."""
    return SamplingConfig(
        max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature,
        top_k=rollout.top_k, top_p=rollout.top_p, ignore_eos=rollout.ignore_eos,
        stop_token_ids=tuple(tokenizer.stop_ids), pad_token_id=tokenizer.pad_id)


def engine_of(model_cfg: ModelConfig, mesh=None, rules: Rules = ROLLOUT_REPLICATED,
              cache_dtype: str | None = None, weights_dtype: str | None = None,
              refill: Refill | None = None, waves: int = 1) -> Engine:
    """An engine over `mesh` (None: the default device); `cache_dtype` None: compute dtype;
    `weights_dtype` None: decode with the weights as given (else a rollout copy); `refill`
    None: a generate decodes all its rows at once."""
    return Engine(model_cfg, mesh=mesh, rules=rules,
                  cache_dtype=cache_dtype and COMPUTE_DTYPES[cache_dtype],
                  weights_dtype=weights_dtype, refill=refill, waves=waves)


def weights_of(model: str, seed: int = 0, precision: str = "f32", mesh=None,
               rules: Rules = ROLLOUT_REPLICATED) -> Weights:
    """`model`'s weights in f32 (presets: initialised from `seed`), laid out by `rules` over
    `mesh` (None: the default device)."""
    shardings = None if mesh is None else (lambda c: weight_shardings(c, mesh, rules))
    return loader.load(model, seed=seed, shardings=shardings, **_dtypes(precision)).weights


def _dtypes(precision: str) -> dict:
    """f32 master weights whatever the checkpoint's dtype; `precision` sets the compute."""
    return dict(param_dtype="float32", compute_dtype=COMPUTE_DTYPES[precision])
