"""How the next token is drawn from the logits: greedy, temperature, top-k and top-p.

`sample` is a pure function of (logits, key, config), so the engine's decode loop and the
tests call exactly the same code. It also returns the log-probability of the drawn token
under the *temperature-scaled, untruncated* policy, which is what the trainer recomputes
(`decoder.token_logprobs(..., temperature)`) for the importance ratio: top-k / top-p only
decide which tokens may be drawn, they are not part of the policy being optimised
(as in verl and TRL, which score rollouts with the full softmax).

References: top-p is "nucleus sampling" (Holtzman et al. 2019, arXiv:1904.09751); the
draw is inverse-CDF sampling with one uniform per row.
Departure from `jax.random.categorical`: Gumbel-max needs B*V threefry draws per step,
~24 ms for [128, 4096] on 2 CPU cores (longer than the model's forward); the inverse CDF
needs B of them and takes ~0.2 ms.

Legend: b batch, v vocab.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from locojax.model import invariant

# Preceding mass within this relative distance of top_p counts as having reached it, so
# that f32 rounding of a softmax cannot add a token that exactly closes the nucleus.
_TOP_P_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """One generation request's decoding rules. Hashable: the engine compiles per config."""

    max_new_tokens: int = 64
    """N: most tokens generated per sequence, the stop token included."""
    temperature: float = 1.0
    """τ: logits are divided by τ before the softmax. 0 means greedy (argmax)."""
    top_k: int = 0
    """Draw only among the k most probable tokens. 0 turns it off."""
    top_p: float = 1.0
    """Draw only from the smallest set of most probable tokens whose mass reaches top_p
    (nucleus sampling). 1.0 turns it off."""
    stop_token_ids: tuple[int, ...] = ()
    """A sequence ends after it generates one of these ids (the stop token is kept)."""
    ignore_eos: bool = False
    """Never stop early: every sequence generates exactly max_new_tokens (benchmarks)."""
    min_new_tokens: int = 0
    """Stop tokens generated before this many tokens do not end the sequence. They are
    not masked out of the distribution, so the sampling policy (and its logprobs) is
    unchanged; they simply count as ordinary tokens."""
    pad_token_id: int = 0
    """Written into the output after a sequence has stopped."""

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"SamplingConfig.{name}={getattr(self, name)!r}: {why}")

        is_int = lambda x: isinstance(x, numbers.Integral) and not isinstance(x, bool)  # noqa: E731
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            bad("max_new_tokens", "must be an int >= 1")
        if not self.temperature >= 0 or self.temperature == float("inf"):
            bad("temperature", "must be a finite number >= 0 (0 = greedy)")
        if not is_int(self.top_k) or self.top_k < 0:
            bad("top_k", "must be an int >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1] (1.0 = off)")
        if not is_int(self.min_new_tokens) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            bad("min_new_tokens", f"must be an int in [0, max_new_tokens={self.max_new_tokens}]")
        if not isinstance(self.stop_token_ids, tuple) or not all(
                is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a tuple of non-negative ints")
        if not is_int(self.pad_token_id) or self.pad_token_id < 0:
            bad("pad_token_id", "must be an int >= 0")
        # Plain Python scalars, so equal configs hash equal (the engine compiles per config).
        for name in ("max_new_tokens", "top_k", "min_new_tokens", "pad_token_id"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("temperature", "top_p"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate_vocab(self, vocab_size: int) -> None:
        """Ids must index the model's vocabulary; checked once the model is known."""
        for name in ("stop_token_ids", "pad_token_id"):
            ids = getattr(self, name)
            ids = ids if isinstance(ids, tuple) else (ids,)
            if any(t >= vocab_size for t in ids):
                raise ValueError(
                    f"SamplingConfig.{name}={getattr(self, name)!r}: ids must be < "
                    f"vocab_size={vocab_size}")
        if self.top_k > vocab_size:
            raise ValueError(f"SamplingConfig.top_k={self.top_k} exceeds vocab_size={vocab_size}")


def policy_logprobs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """log π(· | context) [B, V]: softmax of logits / τ (τ = 1 for greedy), untruncated."""
    tau = 1.0 if cfg.greedy else cfg.temperature
    # The learner's `decoder.token_logprobs`: logits / τ and a fixed-order normaliser, so in
    # a batch-invariant run (`ModelConfig.batch_invariant`) the two agree bitwise.
    return invariant.log_softmax(logits.astype(jnp.float32) / tau)


def sample(logits: jax.Array, key: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Next tokens [B] int32 from logits [B, V] f32."""
    return sample_with_logprobs(logits, key, cfg)[0]


def sample_with_logprobs(logits: jax.Array, key: jax.Array | None, cfg: SamplingConfig,
                         uniforms: jax.Array | None = None):
    """(tokens [B] int32, log π(token) [B] f32) where π is `policy_logprobs`.

    key: one key, or a [B] batch of keys (one per row). uniforms: [B] draws in [0, 1) to use
    instead of drawing from `key` (the engine draws every step's before its decode loop);
    `uniform_draws(key, B)` gives the ones `key` would.
    """
    logp = policy_logprobs(logits, cfg)  # [B, V]
    if cfg.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        probs = jnp.exp(logp)
        if cfg.top_k or cfg.top_p < 1.0:
            probs = jnp.where(_keep(probs, cfg), probs, 0.0)
        if uniforms is None:
            uniforms = uniform_draws(key, probs.shape[0])
        tokens = _inverse_cdf(probs, uniforms)
    picked = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, picked


def kept_tokens(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """[B, V] bool: which tokens `sample` may draw under cfg (for tests and diagnostics)."""
    if cfg.greedy:
        return jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=bool)
    probs = jnp.exp(policy_logprobs(logits, cfg))
    if cfg.top_k or cfg.top_p < 1.0:
        return _keep(probs, cfg)
    return probs > 0


def _keep(probs: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """[B, V] bool: tokens at least as probable as the top-k and top-p thresholds.

    Each threshold τ is found by bisection over the bit patterns of non-negative f32s
    (ordered like the floats themselves), so it is exact after 31 halvings:
      top-k: the largest τ with  #{p ≥ τ} ≥ k           (the k-th largest probability);
      top-p: the largest τ with  Σ_{p ≥ τ} p ≥ top_p    (the nucleus's smallest member).
    Departure from a sort: XLA:CPU sorts a [128, 4096] batch in ~160 ms, this takes ~2 ms.
    Tokens tied with the threshold are all kept (ties have probability ~0 with real logits).
    """
    keep = jnp.ones(probs.shape, bool)
    if cfg.top_k:
        tau = _largest_threshold(probs, lambda above: jnp.sum(above, -1) >= cfg.top_k)
        keep &= probs >= tau[:, None]
    if cfg.top_p < 1.0:
        needed = cfg.top_p * (1.0 - _TOP_P_RTOL)
        tau = _largest_threshold(
            probs, lambda above: jnp.sum(jnp.where(above, probs, 0.0), -1) >= needed)
        keep &= probs >= tau[:, None]
    return keep


def _largest_threshold(probs, holds) -> jax.Array:
    """[B] the largest τ ≥ 0 with holds(probs ≥ τ), for `holds` monotone (true at τ = 0)."""
    as_bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.int32)  # noqa: E731
    as_float = lambda x: jax.lax.bitcast_convert_type(x, jnp.float32)  # noqa: E731

    def halve(_, bounds):  # invariant: holds at lo (or lo = 0), fails at hi
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = holds(probs >= as_float(mid)[:, None])
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo = jnp.zeros(probs.shape[:1], jnp.int32)
    hi = as_bits(jnp.max(probs, axis=-1)) + 1  # just above the largest: keeps nothing
    lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi))
    return as_float(lo)


def uniform_draws(key: jax.Array, b: int) -> jax.Array:
    """[B] uniforms in [0, 1): from one key, or one per row from a [B] batch of keys.

    Per-row keys make a row's draw independent of which other rows share its batch, so
    the same (row, step) samples the same token on one device or across hosts.
    """
    if key.ndim == 0:
        return jax.random.uniform(key, (b,), jnp.float32)
    return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(key)


def _inverse_cdf(probs: jax.Array, uniforms: jax.Array, block: int = 64) -> jax.Array:
    """Index drawn from unnormalised probs [B, V]: the first whose running mass ≥ u·total.

    u lies in (0, 1], so a zero-probability token is never drawn (its running mass equals
    its predecessor's). Two levels (pick a block of 64 by block mass, then a token inside
    it) because a full-length cumsum over 4096 costs ~10x more on XLA:CPU.
    """
    b, v = probs.shape
    p = jnp.pad(probs, ((0, 0), (0, -v % block))).reshape(b, -1, block)  # [B, V/64, 64]
    sums = jnp.sum(p, axis=-1)  # [B, V/64]
    cdf = jnp.cumsum(sums, axis=-1)
    u = 1.0 - uniforms  # (0, 1]
    target = u * cdf[:, -1]
    j = jnp.minimum(jnp.sum(cdf < target[:, None], axis=-1), p.shape[1] - 1)  # [B] block
    take = lambda a: jnp.take_along_axis(a, j[:, None], axis=1)[:, 0]  # noqa: E731
    inner = jnp.take_along_axis(p, j[:, None, None], axis=1)[:, 0]  # [B, 64]
    inner_cdf = jnp.cumsum(inner, axis=-1)
    # Rounding may put the residual a hair outside the block's own (0, total]: clamp it in.
    resid = jnp.clip(target - (take(cdf) - take(sums)), jnp.finfo(jnp.float32).tiny,
                     inner_cdf[:, -1])
    i = jnp.minimum(jnp.sum(inner_cdf < resid[:, None], axis=-1), block - 1)
    return (j * block + i).astype(jnp.int32)

