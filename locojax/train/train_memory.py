"""What a train step needs per device beyond its state, derived from the shapes alone: the
gradients, one chunk of logits with its softmax and gradient, the embedding gradient of a
chunk, and the activations autodiff keeps, counted by tracing `jax.vjp` of the decoder's own
layer (nothing runs).

The memory plan (`memory_plan.py`) sets this expectation beside XLA's compiled temporaries:
it names the biggest buffers when a run does not fit, and tests/test_memory_plan.py checks
that XLA's temporaries stay within it.

`Account` is the plan's analytic account of a device: what it holds all run (the train
state's own bytes, `held_bytes`), what only rollout adds (the KV cache, the engine's copy of
the weights) and what only the train step adds (`expected_train_temporaries`), with the held
buffers kept in host memory between the programs that read them (`READS`,
`rl/host_memory.py`). The plan's is `MemoryPlan.analytic` (it adds XLA's compiled figures
on top); `locojax predict` (`locojax/predict/memory.py`) builds the same account from the
shapes of hardware that is not here, so the two count the same terms by the same functions
(tests/test_predict_memory.py holds them within 10% at the validation shapes).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from locojax.model import decoder, lora
from locojax.model import params as params_lib
from locojax.model.config import ModelConfig
from locojax.model.sharding import make_mesh
from locojax.rl import gradients, logprobs, micro_batches, train_state
from locojax.rl.batch import logit_positions, split_group
from locojax.rl.config import LearnerConfig, OptimConfig
from locojax.train.program_cost import device_bytes

LOGIT_BUFFERS = 5
"""f32 buffers of one chunk's logits a step holds: logits, log-softmax, its exp, the
entropy's product, the logit gradient."""


def logits_bytes(rows: int, local_rows: int, targets: int, vocab: int,
                 chunk: int = decoder.AUTO_CHUNK) -> int:
    """Bytes of the logits one device holds in a train step: LOGIT_BUFFERS f32 buffers of one
    chunk, [local_rows, C, vocab], C the decoder's chunk (`decoder.logprob_chunk_size` of the
    traced micro-batch of `rows` rows over `targets` positions; all of them when whole)."""
    c = decoder.logprob_chunk_size(rows, targets, vocab, chunk)
    return LOGIT_BUFFERS * local_rows * (c or targets) * vocab * 4

def _residual_bytes(fn, args, platform: str, consts=()) -> int:
    """Bytes `jax.vjp(fn, *args)` keeps for the backward (its pullback's residuals), less the
    arguments themselves; `consts`: more arguments of `fn`, not differentiated. Traced
    abstractly: nothing runs. On CPU a bf16 residual also gets an f32 copy, since XLA:CPU
    upcasts both operands of a bf16 dot."""
    total = {}

    def probe(args, consts):
        _, pullback = jax.vjp(lambda *a: fn(*a, *consts), *args)
        inputs = {id(a) for a in jax.tree.leaves((args, consts))}
        upcast = platform == "cpu"
        total["bytes"] = sum(
            a.size * (a.dtype.itemsize + (4 if upcast and a.dtype == jnp.bfloat16 else 0))
            for a in jax.tree.leaves(pullback) if id(a) not in inputs)
        return 0

    jax.eval_shape(probe, args, consts)
    return total["bytes"]


def affine_in_rows(probe, rows: int, unit: int = 1) -> int:
    """`probe(rows)`, for `rows` a multiple of `unit`, from two probes, at `unit` and `2 unit`
    rows. Every residual a forward keeps has the rows as a factor of its shape (activations,
    attention scores, masks) or no dependence on them (a constant), so its bytes are affine
    in the rows, exactly: a sweep over batch sizes (`locojax predict`, the paper's tables)
    then traces each shape twice, not once per batch size (tests/test_train_memory.py
    checks the extrapolation against a direct probe)."""
    one, two = probe(unit), probe(2 * unit)
    return one + (rows // unit - 1) * (two - one)


def layer_residual_bytes(cfg: ModelConfig, rows: int, t: int, platform: str,
                         slots: int = 0) -> int:
    """Bytes autodiff keeps from one decoder layer's forward for its backward, on rows x t
    (attending to `slots` prompt keys first, as the shared-prefix forward's responses do,
    when > 0).

    Counted exactly from `jax.vjp` of `decoder.layer` at these shapes, less the layer's own
    inputs (weights, and the prompt's keys and values): `probed_layer_residual_bytes` at
    one and two rows (`affine_in_rows`)."""
    return affine_in_rows(
        lambda r: probed_layer_residual_bytes(cfg, r, t, platform, slots), rows)


@functools.lru_cache(maxsize=256)
def probed_layer_residual_bytes(cfg: ModelConfig, rows: int, t: int, platform: str,
                                slots: int = 0) -> int:
    """`layer_residual_bytes` traced at these very rows."""
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                          params_lib.abstract(cfg)["layers"])  # one layer's weights
    x = jax.ShapeDtypeStruct((rows, t, cfg.hidden_size), cfg.dtype)
    pos = jnp.zeros((rows, t), jnp.int32)
    causal = jnp.ones((rows, t, t), bool)
    if not slots:
        return _residual_bytes(lambda x, w: decoder.layer(cfg, x, w, pos, (None, causal))[0],
                               (x, shapes), platform)
    kv = (rows, cfg.num_key_value_heads, cfg.head_dim, slots)
    k = jax.ShapeDtypeStruct(kv, cfg.dtype)
    v = jax.ShapeDtypeStruct((*kv[:2], slots, kv[2]), cfg.dtype)
    visible = (jnp.ones((rows, t, slots), bool), causal)
    return _residual_bytes(
        lambda x, w, k, v: decoder.layer(cfg, x, w, pos, visible, (k, v))[0],
        (x, shapes, k, v), platform)


def forward_residual_bytes(cfg: ModelConfig, rows: int, columns: int, group: int, p: int,
                           remat: bool, platform: str) -> int:
    """Bytes autodiff keeps from the whole differentiated forward of `sequence_logprobs` (the
    hidden states the logits read), exactly as the train step runs it: with `group` > 1 the
    prompt once per group (`logprobs.prefix_hidden`); with remat, every layer's input.
    Probed at one and two groups of rows (`affine_in_rows`)."""
    return affine_in_rows(lambda r: probed_forward_residual_bytes(
        cfg, r, columns, group, p, remat, platform), rows, group)


@functools.lru_cache(maxsize=256)
def probed_forward_residual_bytes(cfg: ModelConfig, rows: int, columns: int, group: int,
                                  p: int, remat: bool, platform: str) -> int:
    """`forward_residual_bytes` traced at these very rows."""
    w = params_lib.abstract(cfg)
    tok = jax.ShapeDtypeStruct((rows, columns), jnp.int32)
    mask = jax.ShapeDtypeStruct((rows, columns), bool)
    if group > 1:
        def hidden(w, tokens, positions, attn):
            return logprobs.prefix_hidden(w, tokens, positions, attn, cfg, p, group,
                                                False, remat)
    else:
        def hidden(w, tokens, positions, attn):
            return decoder.forward(w, tokens[:, :-1], positions[:, :-1], cfg, mask=attn[:, :-1],
                                   remat=remat)[0]
    return _residual_bytes(hidden, (w,), platform, consts=(tok, tok, mask))


def gradient_bytes(cfg: ModelConfig, learner: LearnerConfig, param_bytes: int) -> int:
    """f32 gradient bytes a train step holds per device, under `learner`'s remat and
    grad_accum (`expected_train_temporaries` says which; `locojax predict` reads it too):
    `param_bytes` is the device's share of the f32 params, and each term shares alike."""
    if not gradients.in_place(learner, cfg):
        return param_bytes * (2 if learner.grad_accum > 1 else 1)
    share = param_bytes / (cfg.num_params() * 4)
    layers = sum(x.size for x in jax.tree.leaves(params_lib.abstract(cfg)["layers"]))
    one_layer = layers // cfg.num_hidden_layers * 4
    outside = (cfg.num_params() - layers) * 4  # embedding (tied or not), final norm
    return param_bytes + int(share * (one_layer + outside))


def _group_in_step(prefix, learner: LearnerConfig, rows: int, local: int) -> int:
    """Rows per group that the step's forward shares its prompt over (1: none shared).

    As in `train_step`: a split into micro-batches of single rows (rows not a multiple of
    micro-batches x G), or a device holding part of a group, leaves no whole group."""
    if local % (prefix.group if prefix is not None else 1):
        return 1
    return split_group(prefix, rows, learner.rows_multiple)


def expected_train_temporaries(cfg: ModelConfig, learner: LearnerConfig, rows: int, columns: int,
                               devices: int, platform: str | None = None,
                               prefix=None, param_bytes: int | None = None) -> dict[str, int]:
    """Named buffers a train step needs per device beyond its state, derived from shapes.

    rows x columns: the global batch; devices: how many share its rows; prefix: the batch's
    `TrainBatch.shared_prefix` (what a run's batch has); param_bytes: one device's share of
    the f32 params (None: replicated, all of them; FSDP: about 1/F of them).
    Meant as an upper bound, term by term: docs/real_size.md has XLA:CPU's temporaries
    against it in every configuration measured (f32 and bf16, remat or not, 2 to 28 layers,
    grad_accum 2, β > 0, V up to 151,936, shared prefix or not), data parallel: under FSDP
    it is not one yet (TINY, 4 layers, FSDP 2: XLA 80 MB against 68 MB expected, where data
    parallel at the same rows per device needs 44 MB; docs/real_size.md). The terms:
    - gradients: one f32 copy of the device's params, the running sum. With remat the layers'
      gradients are added into it inside the backward, in place (`gradients.in_place`,
      `model/accumulating_scan.py`): beside it only one layer's gradient and a micro-batch's
      gradient of the weights outside the layers (the embedding, the final norm). Without
      remat, a micro-batch's whole gradient too when grad_accum > 1. The optimizer then
      updates in place (`train_state.apply_in_place`); under FSDP, sharded like the params;
    - gathered weights (FSDP only): the whole params, gathered from their shards for the
      forward and again for the backward, in the compute dtype;
    - logits: five f32 buffers of one chunk's size: logits, log-softmax, its exp, the
      entropy's product, the logit gradient; over the positions that predict a target (the
      response's, with a shared prefix);
    - embedding-gradient partial: a chunk's [V, D] head gradient before it joins the sum;
    - activations: what autodiff keeps of the whole forward (`forward_residual_bytes`: all
      of every layer's residuals, or with remat only every layer's input), plus one layer's
      residuals for the gradients of the layer being differentiated (twice with remat: it is
      recomputed, and its gradients); with the prompt shared by a group, a layer step is the
      prompt's layer, its keys and values repeated to every row, and the responses' layer;
    - compute copy of the embedding (compute dtype below the params'), and on CPU its f32
      upcast: XLA:CPU has no bf16 x bf16 dot.
    """
    platform = platform or jax.default_backend()
    learner = micro_batches.resolve_shape(learner, rows, columns, prefix, cfg.vocab_size, devices,
                                          platform)
    targets = logit_positions(columns, prefix)
    micro = rows // learner.rows_multiple  # rows of one micro-batch, all devices
    local = max(1, micro // devices)
    v, d = cfg.vocab_size, cfg.hidden_size
    whole = lora.num_trainable(cfg) * 4  # under LoRA the state's params are the adapters
    param_bytes = whole if param_bytes is None else param_bytes
    out = {"gradients": gradient_bytes(cfg, learner, param_bytes)}
    if param_bytes < whole:
        out["gathered weights"] = cfg.num_params() * cfg.dtype.itemsize
    chunk = decoder.logprob_chunk_size(micro, targets, v, learner.logprob_chunk)
    out["logits"] = logits_bytes(micro, local, targets, v, learner.logprob_chunk)
    if chunk:
        out["embedding-gradient partial"] = v * d * 4
    group = _group_in_step(prefix, learner, rows, local)
    if group > 1:  # a layer step runs the prompt's rows, then every row's response
        p = prefix.columns
        repeated_kv = 2 * local * cfg.num_key_value_heads * cfg.head_dim * p * cfg.dtype.itemsize
        one_layer = (layer_residual_bytes(cfg, local // group, p, platform) + repeated_kv
                     + layer_residual_bytes(cfg, local, columns - p - 1, platform, slots=p))
    else:
        p = 0
        one_layer = layer_residual_bytes(cfg, local, columns - 1, platform)
    out["activations"] = (forward_residual_bytes(cfg, local, columns, group, p, learner.remat,
                                                  platform)
                          + (2 if learner.remat else 1) * one_layer)
    if cfg.dtype.itemsize < cfg.weight_dtype.itemsize:
        out["compute copy of the embedding"] = v * d * cfg.dtype.itemsize
        if platform == "cpu" and cfg.dtype.itemsize < 4:
            out["compute copy of the embedding"] += v * d * 4
    return out


READS = {"reference": ("ref_logprobs",), "optimizer": ("train_step",)}
"""Held buffers that may be kept in host memory, and the programs that read them (on the
device for those alone: `train_step.with_reference` moves the reference back)."""


def on_device(held: dict[str, int], offloaded: tuple[str, ...], program: str) -> int:
    """Bytes of `held` on the device while `program` runs: an offloaded buffer only in the
    programs that read it."""
    return sum(v for k, v in held.items() if k not in offloaded or program in READS.get(k, ()))


@dataclasses.dataclass
class Account:
    """A device's memory by the plan's analytic terms (bytes; module docstring). The KV cache
    and the train step's buffers are never live at once: the trainer releases the engine's
    cache after each rollout (`Engine.release_cache`)."""

    held: dict[str, int]  # all run: params, optimizer, frozen (LoRA's base), reference
    rollout: dict[str, int]  # live while the engine runs
    train: dict[str, int]  # live while the train step runs (`expected_train_temporaries`)
    offloaded: tuple[str, ...] = ()  # names of `held` in host memory but in their READS

    @property
    def phases(self) -> dict[str, int]:
        """Each phase's peak: the held bytes on the device then, plus its own buffers."""
        return {"rollout": on_device(self.held, self.offloaded, "generate")
                + sum(self.rollout.values()),
                "train step": on_device(self.held, self.offloaded, "train_step")
                + sum(self.train.values())}

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def offload(self, room: float) -> "Account":
        """Where the peak exceeds `room`, the held buffers the plan keeps in host memory
        (`plan_fit._offload`): the reference, then AdamW's moments too where rollout alone
        still exceeds it (the train step reads them, so only rollout is spared)."""
        if self.peak <= room:
            return self
        names = ("reference",) if self.held.get("reference") else ()
        out = dataclasses.replace(self, offloaded=names)
        if out.phases["rollout"] > room:
            out = dataclasses.replace(self, offloaded=names + ("optimizer",))
        return out


@functools.lru_cache(maxsize=64)
def held_bytes(cfg: ModelConfig, fsdp: int = 1, reference: bool = False) -> dict[str, int]:
    """What a learner device holds all run, from the train state's own shapes
    (`train_state.abstract`, which the plan's held buffers are): the f32 params, AdamW's
    moments and step counts, LoRA's frozen base; with `reference` (β > 0) a copy of the
    params, or under LoRA none (the base is the reference). FSDP over `fsdp` devices shares
    each alike (the step counts are replicated: 8 bytes over-shared)."""
    state = train_state.abstract(cfg, OptimConfig(), make_mesh({"data": 1}, jax.devices()[:1]))
    out = {"params": device_bytes(state.params), "optimizer": device_bytes(state.opt_state),
           "frozen": device_bytes(state.frozen)}
    out["reference"] = out["params"] if reference and state.frozen is None else 0
    return {k: v // fsdp for k, v in out.items()}
