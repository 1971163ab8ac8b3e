"""One GRPO update, locojax against TRL: the same fixed batch, the same real weights.

docs/results/real_model_vs_trl.md ("Three seeds") leaves TRL a few held-out points ahead
after 40 steps with both sides configured alike. This A/B takes sampling out: ONE batch,
built here, goes to both sides, and each applies its own update to the real
SmolLM2-135M-Instruct, so what differs is the arithmetic of an update and nothing else.

The batch: the first B prompts of `real-demo`'s seed-0 stream (chat arith level 0), encoded
by locojax (`rollout.single_turn.encode_prompts`, P 48 as the runs' settings give), G
completions each (`completions`): short replies in the model's styles (a number, an
equation, a sentence; right or one off) ending in <|im_end|>, and one rambling reply cut at
N 32 tokens with no stop token. Rewards are the task's reward of each decoded text; the
advantages locojax's GRPO rule (group mean, sample std), handed to both sides as they are
(TRL's own rule divides by std + 1e-4, locojax's by std + 1e-6; printed apart).

locojax: the RunConfig of bench_real_trl's locojax runs (`real-demo` with its SETTINGS as
flags; B and G from here), its `learner_config()` (lr 1e-5, weight decay 0, β 0, ε 0.2,
token-mean, clip 1.0, auto grad-accum), the checkpoint's f32 weights, and what
`train_step.update` runs (`check`, `train_step`, `finish`; β 0: no reference pass), with
`return_grads` so the pre-clip gradient is kept. TRL: peers/trl_update_worker.py in TRL's
venv (`GRPOTrainer.train()` on the handed-over batch: its `dapo` loss, HF's clip, torch
AdamW), in two arms: as TRL runs, and with the input embedding's `padding_idx` cleared (HF
sets it to the config's pad token, SmolLM2's <|im_end|>, and gives that row no lookup
gradient). Compared: the loss, the pre-clip gradient norm, and for four named tensors the
pre-clip gradient and the change of the weights, each as ‖locojax - TRL‖ / ‖TRL‖ (L2); a
gradient that differs is then located (`where`: the rows that hold the difference).

Tolerance. With the ratio exactly 1 the loss is -Σ m·A / Σ m whatever the weights: a sum of
the batch's tokens, bounded by 2 γ_n (tests/tolerance.py `worst_case`, n tokens) times its
condition Σ|m·A| / |Σ m·A|, which the batch fixes and which is printed. A gradient element
is the end of a chain of reductions (`reduction_depth`: every layer's forward and backward,
the softmax over the vocabulary, the sum over the batch's positions); each side is off by
the suite's probabilistic bound λ√n·u for that depth, so two sides by twice that, relative
to the terms' magnitudes. The gradient norm adds its own sum of every parameter's square.
The weight changes get the gradients' tolerance: Adam's first step u = ĝ / (|ĝ| + ε) turns
a relative error τ of an element of ĝ into at most τ/4 of u (the worst case at |ĝ| = ε).
f32 is where the runs compute, but there rounding and a small real difference could both be
~1e-4; `--dtypes ... float64` runs both sides again in float64 (TRL's f32 islands widened by
the worker), where the same bounds are 2^29 times smaller: a difference that stays there is
arithmetic, one that shrinks with u was rounding. (In float64 the weight changes also carry
locojax's learning rate, which `train_state.schedule` holds in f32: the "median Δ ratio"
column then reads f32(1e-5) / 1e-5 = 1 - 2.5e-8, a rounding of the f32 runs' own size.)

Usage:
    .venv/bin/python -m benchmarks.ab_update_trl              # f32 and f64, both arms, 1 update
    .venv/bin/python -m benchmarks.ab_update_trl --dtypes float32 --trl-padding-idx keep \
        --updates 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import sys
from pathlib import Path


from benchmarks import harness
from benchmarks.real_runs import SETTINGS, ab_refusal, locojax_argv
from benchmarks.peers import install
from benchmarks.peers.trl_common import tensor_names

CUT = ("To find {q}, I work it out one step at a time: first I write down the larger number, "
       "then I count once for every unit of the smaller one, and when I am done I reach {v}, "
       "so the final answer is {v}.")
"""The rambling reply, long enough that N = 32 tokens cut it before any stop token."""


def run_config(model: str, prompts: int, group: int):
    """The RunConfig of bench_real_trl's locojax runs (seed 0), B prompts of G completions."""
    import tyro

    from locojax.train.config import PRESETS

    argv = locojax_argv(model, 0, 1, Path("runs/unused"), 0)[len(harness.CLI) + 1:]
    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv)
    return dataclasses.replace(
        cfg, algo=dataclasses.replace(cfg.algo, group_size=group),
        rollout=dataclasses.replace(cfg.rollout, prompts_per_step=prompts))


PATTERNS = ("101", "011", "110", "111")
"""Per prompt (cycled), which short replies are right (1) or one off (0): groups differ."""


def completions(example, k: int, g: int) -> list[str]:
    """G replies to prompt k: g - 1 short ones ending in a stop token, in the model's styles,
    right or one off by `PATTERNS`, and the cut rambling reply."""
    q = re.search(r"What is (.+?)\?", example.prompt[-1]["content"]).group(1)
    a = int(example.answer)
    styles = ("{v}", "{q} = {v}", "The answer is {v}.")
    pattern = PATTERNS[k % len(PATTERNS)]
    short = [styles[j % 3].format(q=q, v=a if pattern[j % 3] == "1" else a + 1)
             for j in range(g - 1)]
    return short + [CUT.format(q=q, v=a)]


def build_batch(cfg, prompts: int, group: int) -> tuple[dict, list[str]]:
    """The fixed batch as numpy arrays (what both sides read) and the decoded replies."""
    import numpy as np

    from locojax.envs import registry
    from locojax.rl import algorithms
    from locojax.rollout.single_turn import encode_prompts
    from locojax.train import build
    from locojax.train.data import PromptStream

    task = registry.build(cfg.task, cfg.seed, cfg.multi_turn.max_turns)
    tokenizer = build.tokenizer_of(cfg.model, cfg.task.template)
    examples = PromptStream(task.train, cfg.seed).take(0, prompts, 0, prompts)
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, examples,
                                                cfg.rollout.max_prompt_tokens)
    n = cfg.rollout.max_new_tokens
    tokens = np.full((prompts * group, n), tokenizer.pad_id, np.int32)
    mask = np.zeros((prompts * group, n), bool)
    for k, ex in enumerate(examples):
        for j, text in enumerate(completions(ex, k, group)):
            ids = tokenizer.encode(text)
            ids = ids[:n] if len(ids) >= n else ids + [tokenizer.eos_id]  # cut, or stopped
            tokens[k * group + j, :len(ids)], mask[k * group + j, :len(ids)] = ids, True
    texts = [tokenizer.decode(row[m].tolist()) for row, m in zip(tokens, mask)]
    rewards = np.asarray([task.reward(t, examples[r // group]) for r, t in enumerate(texts)],
                         np.float32)
    group_ids = np.repeat(np.arange(prompts), group).astype(np.int32)
    adv, _ = algorithms.compute_advantages(cfg.learner_config().algo, rewards, group_ids)
    return dict(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, completion_tokens=tokens,
                completion_mask=mask, rewards=rewards, advantages=np.asarray(adv, np.float32),
                group_size=np.int32(group)), texts


def train_batch(arrays: dict):
    """The TrainBatch a locojax step assembles from these rollouts (`Producer.assemble`)."""
    import numpy as np

    from locojax.rl import batch as batch_lib

    g = int(arrays["group_size"])
    rows = lambda x: np.repeat(x, g, axis=0)  # noqa: E731  per prompt → per row
    return batch_lib.from_rollout(
        rows(arrays["prompt_tokens"]), rows(arrays["prompt_mask"]), arrays["completion_tokens"],
        arrays["completion_mask"], np.zeros(arrays["completion_tokens"].shape, np.float32),
        arrays["advantages"], np.repeat(np.arange(len(arrays["advantages"]) // g), g), group_size=g)


def locojax_update(cfg, arrays: dict, dtype: str, updates: int) -> dict:
    """`updates` locojax steps on the batch from the checkpoint: the worker's quantities.
    (The sampler logprobs are zeros: with one update per step they only feed the mismatch
    metric, `rl/gradients.py`.)"""
    import jax
    import numpy as np

    from locojax.model import hf_io, loader
    from locojax.rl import train_state, train_step

    wide = jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext()
    with wide:
        loaded = loader.load(cfg.model, param_dtype=dtype, compute_dtype=dtype)
        model_cfg, learner, batch = loaded.cfg, cfg.learner_config(), train_batch(arrays)
        names = tensor_names(model_cfg.num_hidden_layers)

        def pick(tree):  # copies: the step donates the buffers they would view
            sd = hf_io.to_state_dict(tree, model_cfg)
            return {n: np.array(sd[n], copy=True) for n in names}

        state = train_state.init(loaded.weights, learner.optim, model_cfg)
        del loaded
        before, out, grads = pick(state.params), {"loss": [], "grad_norm": [], "lr": []}, None
        for _ in range(updates):
            train_step.check(batch, learner)
            state, metrics, g = train_step.train_step(state, batch, None, model_cfg=model_cfg,
                                                      cfg=train_step.program_cfg(learner),
                                                      return_grads=True)
            grads = grads or pick(g)
            state, metrics = train_step.finish(state, metrics, learner)
            for key, name in (("loss", "actor/pg_loss"), ("grad_norm", "actor/grad_norm"),
                              ("lr", "actor/lr")):
                out[key].append(metrics[name])
        after = pick(state.params)
    arrays = {k: np.asarray(v, np.float64) for k, v in out.items()}
    arrays.update({f"grad/{n}": grads[n] for n in names})
    arrays.update({f"delta/{n}": after[n] - before[n] for n in names})
    return arrays


def trl_update(python: Path, model: str, batch: Path, out: Path, dtype: str, updates: int,
               padding_idx: str) -> dict:
    import numpy as np

    log = out.with_suffix(".log")
    code, tail = harness.run_logged(
        [str(python), "-m", "benchmarks.peers.trl_update_worker", "--model", model, "--batch",
         str(batch), "--out", str(out), "--updates", str(updates), "--dtype", dtype,
         "--padding-idx", padding_idx, "--settings", json.dumps(SETTINGS)], log, timeout=3600)
    if code:
        raise RuntimeError(f"TRL's update failed ({code}), log {log}:\n{tail}")
    return dict(np.load(out))


def reduction_depth(cfg, rows: int, columns: int) -> int:
    """Reduction terms in sequence from the weights to one gradient element: each layer's
    forward (norm D, q/k/v D, scores h, softmax and p·v ≤ T each, o-proj D, norm D, gate/up D,
    down F), the final norm, the logits (D) and the softmax over V; the backward the same
    chain again; then the sum over the batch's rows × T positions."""
    d, t = cfg.hidden_size, columns
    layer = 5 * d + cfg.head_dim + 2 * t + cfg.intermediate_size
    return 2 * (cfg.num_hidden_layers * layer + 2 * d + cfg.vocab_size) + rows * t


def loss_condition(arrays: dict) -> tuple[int, float]:
    """(n tokens, Σ|m·A| / |Σ m·A|) of the loss -Σ m·A / Σ m at ratio 1."""
    import numpy as np

    m = arrays["completion_mask"]
    terms = (m * arrays["advantages"][:, None]).astype(np.float64)
    return int(m.sum()), float(np.abs(terms).sum() / max(abs(terms.sum()), 1e-300))


def rel(a, b) -> float:
    """‖a - b‖ / ‖b‖ (L2), in float64 (0 when both are 0)."""
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    num, den = np.linalg.norm(a - b), np.linalg.norm(b)
    return float(num / den) if den else (0.0 if not num else math.inf)


def compare(loco: dict, trl: dict, tol_loss: float, tol_norm: float, tol_grad: float,
            lr: float) -> list[list]:
    """The table's rows: quantity, locojax, TRL, relative difference, tolerance, verdict."""
    import numpy as np

    rows = []

    def row(name, a, b, shown_a, shown_b, tol):
        d = rel(a, b)
        rows.append([name, shown_a, shown_b, f"{d:.2e}", f"{tol:.1e}",
                     "equal" if d <= tol else "DIFFERS"])

    for u, (a, b) in enumerate(zip(loco["loss"], trl["loss"])):
        row(f"loss, update {u + 1}", a, b, f"{a:.9g}", f"{b:.9g}", tol_loss)
    for u, (a, b) in enumerate(zip(loco["grad_norm"], trl["grad_norm"])):
        row(f"grad norm (pre-clip), update {u + 1}", a, b, f"{a:.9g}", f"{b:.9g}", tol_norm)
    names = [k[len("grad/"):] for k in trl if k.startswith("grad/")]
    for n in names:
        a, b = loco[f"grad/{n}"], trl[f"grad/{n}"]
        row(f"grad {n}", a, b, f"‖g‖ {np.linalg.norm(a):.6g}", f"‖g‖ {np.linalg.norm(b):.6g}",
            tol_grad)
    for n in names:
        a, b = loco[f"delta/{n}"], trl[f"delta/{n}"]
        big = np.abs(b) > lr / 2  # where Adam's first step is ~lr·sign(g)
        ratio = float(np.median(a[big] / b[big])) if big.any() else math.nan
        row(f"delta {n}", a, b, f"‖Δ‖ {np.linalg.norm(a):.6g}",
            f"‖Δ‖ {np.linalg.norm(b):.6g}; median Δ ratio {ratio:.10f}", tol_grad)
    return rows


def where(loco: dict, trl: dict, tol: float) -> list[str]:
    """For each tensor whose gradient differs past `tol`: the rows (first axis; the
    embedding's row is a token id) that hold 99% of the squared difference, when few do."""
    import numpy as np

    lines = []
    for key in [k for k in trl if k.startswith("grad/")]:
        a, b = np.asarray(loco[key], np.float64), np.asarray(trl[key], np.float64)
        if rel(a, b) <= tol:
            continue
        sq = ((a - b) ** 2).reshape(len(a), -1).sum(axis=1)
        order = np.argsort(-sq)
        k = int(np.searchsorted(np.cumsum(sq[order]) / sq.sum(), 0.99)) + 1
        rows = f"row(s) {sorted(order[:k].tolist())}" if k <= 8 else f"{k} rows"
        lines.append(f"{key}: 99% of the squared difference in {rows}; row {order[0]}: "
                     f"‖locojax - TRL‖ / ‖TRL‖ = {rel(a[order[0]], b[order[0]]):.3g}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    ap.add_argument("--prompts", type=int, default=4, help="B prompts")
    ap.add_argument("--group", type=int, default=4, help="G completions per prompt")
    ap.add_argument("--updates", type=int, default=1,
                    help="optimizer updates on the batch (each with π_old = sg(π_θ))")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                    choices=["float32", "float64"])
    ap.add_argument("--trl-padding-idx", nargs="+", default=["keep", "none"],
                    choices=["keep", "none"],
                    help="TRL arms: keep HF's embedding padding_idx (as TRL runs), or clear it")
    ap.add_argument("--out", type=Path, default=Path("runs/ab-update-trl"))
    args = ap.parse_args(argv)
    refusal = ab_refusal(args.model)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    print(harness.header("ab_update_trl", f"settings {json.dumps(SETTINGS)}"))
    print(harness.command_line())
    return run(args, install.PEERS["trl"].python(install.DEFAULT_CACHE))


def run(args, python: Path) -> int:
    import numpy as np

    from locojax.model import loader
    from tests.tolerance import probabilistic, worst_case

    cfg = run_config(args.model, args.prompts, args.group)
    arrays, texts = build_batch(cfg, args.prompts, args.group)
    args.out.mkdir(parents=True, exist_ok=True)
    batch_path = args.out / "batch.npz"
    np.savez(batch_path, **arrays)
    describe(arrays, texts)
    rows, n = arrays["completion_tokens"].shape
    model_cfg = loader.load_config(args.model)
    depth = reduction_depth(model_cfg, rows, arrays["prompt_tokens"].shape[1] + n)
    tokens, cond = loss_condition(arrays)
    print(f"tolerance: loss 2·γ_n·cond, n = {tokens} tokens, cond Σ|m·A|/|Σ m·A| = "
          f"{cond:.3g}; gradients and deltas 2·λ√n·u, reduction depth n = {depth}; the "
          f"gradient norm the same with its own sum of {model_cfg.num_params()} squares added")
    for dtype in args.dtypes:
        loco = locojax_update(cfg, arrays, dtype, args.updates)
        tol_grad = 2 * probabilistic(depth, dtype)
        tol_norm = 2 * probabilistic(depth + model_cfg.num_params(), dtype)
        for arm in args.trl_padding_idx:
            trl = trl_update(python, args.model, batch_path,
                             args.out / f"trl-{dtype}-padding-{arm}.npz", dtype, args.updates,
                             arm)
            print(f"\n{dtype}, {args.updates} update(s), TRL's embedding padding_idx {arm}; "
                  f"lr locojax {', '.join(f'{x:.12g}' for x in loco['lr'])}, TRL "
                  f"{', '.join(f'{x:.12g}' for x in trl['lr'])}; load {harness.loads()}")
            table = compare(loco, trl, 2 * worst_case(tokens, dtype) * cond, tol_norm,
                            tol_grad, float(trl["lr"][0]))
            for line in harness.table(["quantity", "locojax", "TRL", "‖locojax - TRL‖ / ‖TRL‖",
                                       "tolerance", "verdict"], table):
                print(line)
            for line in where(loco, trl, tol_grad):
                print(line)
    print(f"\nload at the end {harness.loads()}; batch {batch_path}")
    return 0


def describe(arrays: dict, texts: list[str]) -> None:
    """The batch, row by row, and how far TRL's own advantage rule is from the one used."""
    import numpy as np

    r, g = arrays["rewards"].astype(np.float64), int(arrays["group_size"])
    groups = r.reshape(-1, g)
    trl_adv = ((groups - groups.mean(1, keepdims=True))
               / (groups.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)
    print(f"batch: {len(r) // g} prompts x G {g}, P {arrays['prompt_tokens'].shape[1]}, "
          f"N {arrays['completion_tokens'].shape[1]}; TRL's advantage rule (std + 1e-4) is "
          f"{rel(trl_adv, arrays['advantages']):.2e} (L2, relative) from this one's (std + 1e-6)")
    for line in harness.table(
            ["row", "tokens", "ends", "reward", "advantage", "reply"],
            [[i, int(m.sum()), "cut" if m.all() else "stop", f"{r[i]:.0f}",
              f"{arrays['advantages'][i]:+.4f}", repr(t[:48] + ("..." if len(t) > 48 else ""))]
             for i, (m, t) in enumerate(zip(arrays["completion_mask"], texts))]):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
