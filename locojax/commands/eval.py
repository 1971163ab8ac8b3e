"""`locojax eval`: score a checkpoint on a benchmark, outside any training run.

    locojax eval --model DIR --task gsm8k --data gsm8k/test.jsonl
    locojax eval --model DIR --task math --data math500/test.jsonl --k 8 --template chat
    locojax eval --model embedded-calc --task calc --level 2 --limit 200      # multi-turn
    locojax eval --model DIR --task gsm8k --data FILE --tp 8   # weights split over 8 devices
    locojax eval --model DIR --task data --data FILE --reward my_mod:fn     # your own reward
    locojax launch --hosts 2 -- eval --model DIR --task gsm8k --data FILE     # 2 local hosts

Samples k completions of every row on the engine (batched; rows grouped by prompt length,
each group padded to its own width: `eval_groups.py`), scores them
with the task's reward as training does (`evaluate.score`, the scorer of the in-training
evaluation; multi-turn tasks step their environments, tools and all) and reports accuracy
(the share of correct samples, which is pass@1), pass@j for j = 1, 2, 4, ..., k by the
unbiased estimator, the mean completion length in tokens and the share of completions a
length limit cut off. It writes OUT (one JSON line per row: id, the prompt as the model saw
it, gold answer, correct count, and per sample its reward, length, truncation and text) and
OUT.summary.json.

Data files are checked as `train` checks them: a malformed row stops the run naming
`file:line`; with --skip-invalid such rows are skipped and counted. Procedural tasks (arith,
calc, swe without --data) are scored on their held-out split for --seed.

Under `locojax launch --hosts N` each host scores its own contiguous share of the rows on its
own devices; host 0 gathers the rows and writes the files. A sample is keyed by its global
row, so the result does not depend on the number of hosts.

With --tp N each host's engine splits the model's heads, MLP and vocabulary, and its KV
cache, over N of its devices (rows over the rest), as `train --rollout.tp N` does: a
checkpoint trained that way to fit its devices is scored on the same devices. Greedy
completions are those of --tp 1 wherever the top token leads by more than the reduction-order
bound (tests/test_rollout_tp.py).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Literal

import tyro

from locojax.rollout.limits import MultiTurnConfig


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    """Score a checkpoint on a task's rows: accuracy, pass@k, lengths, truncation."""

    model: str = "embedded"
    """An HF checkpoint directory (Qwen3, Qwen2/2.5, Llama 3.x or Gemma 3 (text)), a shipped
    checkpoint (embedded, embedded-strict, embedded-calc) or a preset (tiny, small, char_demo:
    random weights)."""
    task: str = "gsm8k"
    """Task: arith, calc, gsm8k, math, swe, data, or your own module:function (as `train
    --task.name`; docs/your_task.md)."""
    data: str = ""
    """The rows to score (.jsonl or .parquet) for gsm8k / math; for data also a `datasets`
    directory or hub name; for swe a task directory; procedural tasks need none."""
    template: Literal["plain", "qwen", "chat"] = "plain"
    """Prompt template of gsm8k, math and arith: plain, qwen (hand-written ChatML; gsm8k,
    math) or chat (the checkpoint's own chat template, from its tokenizer_config.json)."""
    reward: tuple[str, ...] = ()
    """Correctness of gsm8k and arith: strict (the default, `#### N`) or flexible (the last
    number); or your own TRL-style rewards, module:function, several after one flag, with
    strict or flexible among them to keep the built-in correctness (as `train --task.reward`)."""
    reward_weights: tuple[float, ...] = ()
    """Weights of the module:function rewards (default: all 1)."""
    prompt_field: str = "prompt"
    """data: the prompt column (text, or a list of chat messages)."""
    answer_field: str = "answer"
    """data: the gold-answer column (optional)."""
    split: str = "test"
    """data: the split of a `datasets` source with several."""
    format_weight: float = 0.0
    """Weight of the task's format reward (gsm8k, arith, math), as `train --task.format-weight`."""
    k: int = 1
    """Samples per row; pass@j is reported for j = 1, 2, 4, ... up to k."""
    temperature: float | None = None
    """Sampling temperature (default: greedy for k = 1, else 1.0)."""
    max_new_tokens: int = 256
    """Most tokens per completion (multi-turn: per model turn)."""
    max_prompt_tokens: int | Literal["auto"] = "auto"
    """Prompts are left-padded to this. auto: the longest prompt of the rows, rounded up to a
    bucket. Every prompt is encoded before any sampling: one longer than this, or one the
    tokenizer cannot encode, is an error naming its row (--skip-invalid: skipped, counted)."""
    batch_size: int = 32
    """Rows per generate call (each sampled k times) at prompt widths up to 256; wider
    groups take proportionally fewer rows (the same prompt tokens per call)."""
    one_width: bool = False
    """Pad every row to --max-prompt-tokens (one compiled shape) instead of grouping the rows
    by prompt length, each group padded to its own power-of-two width."""
    limit: int = 0
    """Score only the first this many valid rows (0: all)."""
    skip_invalid: bool = False
    """Skip malformed rows (and count them) instead of stopping at the first."""
    level: int = 3
    """Difficulty level of procedural tasks (arith, calc, swe)."""
    seed: int = 0
    """Seed of the samples, and of a procedural task's held-out split."""
    tp: int = 1
    """Tensor parallelism: each host's engine holds its weights and KV cache split over this
    many of its devices (heads, MLP, vocabulary), rows over the rest; as `train --rollout.tp`.
    Must divide the host's devices and the model's attention heads and MLP width."""
    precision: Literal["f32", "bf16"] = "f32"
    """Compute dtype (weights are held in f32, as in training)."""
    sandbox: str = "auto"
    """Isolation of the model-written code a task runs (swe): see `locojax train --help`."""
    out: str = "eval.jsonl"
    """Where the per-row results go; the summary goes to OUT.summary.json."""
    multi_turn: MultiTurnConfig = dataclasses.field(default_factory=MultiTurnConfig)
    """Limits of multi-turn trajectories (calc, swe)."""


MULTI_TURN_TASKS = ("calc", "swe")
MULTI_TURN_WIDTH = 256
"""--max-prompt-tokens auto on a built-in multi-turn task: its first prompt comes from its env,
which the rows cannot size, so this width (a prompt over it is still an error naming it)."""

OWN_FLAGS = {"--rollout.max-prompt-tokens": "--max-prompt-tokens",
             "--task.skip-invalid": "--skip-invalid"}
"""`train`'s spelling of an option (in the builder's messages) -> this command's."""


def own_flags(message: str) -> str:
    """`message` naming this command's flags rather than `train`'s."""
    for train, own in OWN_FLAGS.items():
        message = message.replace(train, own)
    return message


def pass_ks(k: int) -> list[int]:
    """The j of the reported pass@j: powers of two below k, and k."""
    return sorted({2 ** i for i in range(k.bit_length()) if 2 ** i < k} | {k})


def summarize(rows: list[dict], k: int, multi_turn: bool) -> dict[str, float]:
    """The aggregate of per-row records (as `row_record` writes them; at least one)."""
    import numpy as np

    from locojax.evaluate import CORRECT, pass_at_k

    solved = [r["correct"] for r in rows]
    out = {"rows": len(rows), "samples_per_row": k,
           "accuracy": float(np.mean(solved) / k),
           **{f"pass@{j}": float(np.mean([pass_at_k(k, c, j) for c in solved]))
              for j in pass_ks(k)},
           "reward_mean": float(np.mean([r["rewards"] for r in rows])),
           "mean_length": float(np.mean([r["lengths"] for r in rows])),
           "truncated_fraction": float(np.mean([r["truncated"] for r in rows]))}
    if multi_turn:
        out["tool_call_rate"] = float(np.mean([[t > 0 for t in r["tool_calls"]] for r in rows]))
    if "in_format" in rows[0]:
        ok = np.asarray([r["in_format"] for r in rows], bool)
        right = np.asarray([[x >= CORRECT for x in r["rewards"]] for r in rows], bool)
        out["format_rate"] = float(ok.mean())
        out["accuracy_in_format"] = float((ok & right).sum() / max(ok.sum(), 1))
    return out


def row_record(example, scores, i: int, tokenizer, in_format=None) -> dict:
    """Row i of `scores` (an `evaluate.Scores`) as one JSON-able record, with the prompt as
    the model saw it (chat messages rendered by the run's template)."""
    prompt = example.prompt
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
    rec = {"id": example.id, "prompt": prompt, "answer": example.answer,
           "correct": int(scores.correct[i].sum()),
           "rewards": [float(x) for x in scores.rewards[i]],
           "lengths": [int(x) for x in scores.lengths[i]],
           "truncated": [bool(x) for x in scores.truncated[i]],
           "completions": list(scores.texts[i])}
    if scores.tool_calls is not None:
        rec["tool_calls"] = [int(x) for x in scores.tool_calls[i]]
    if in_format is not None:
        rec["in_format"] = [bool(x) for x in in_format[i]]
    return rec


def gather_rows(wiring, rows: list[dict]) -> list[dict]:
    """Every host's records, in host order (each host holds a contiguous share, so this is
    row order): their JSON as bytes, padded to the longest, in two gathers."""
    import numpy as np

    blob = np.frombuffer(json.dumps(rows).encode(), np.uint8)
    sizes = np.asarray(wiring.gather_over_hosts(np.asarray([blob.size], np.int64)))
    buf = np.zeros((1, max(int(sizes.max()), 1)), np.uint8)
    buf[0, :blob.size] = blob
    every = np.asarray(wiring.gather_over_hosts(buf))
    return [r for size, host in zip(sizes.tolist(), every)
            for r in json.loads(bytes(host[:size]))]


def main(argv: list[str]) -> int:
    args = tyro.cli(EvalArgs, args=argv, prog="locojax eval")
    from locojax import distributed
    from locojax.commands import eval_groups
    from locojax.envs.data import DataError

    try:
        if args.k < 1 or args.batch_size < 1 or args.limit < 0:
            raise ValueError("--k and --batch-size must be >= 1 and --limit >= 0")
        host = distributed.initialize()  # before anything touches the JAX backend
    except (ValueError, OSError, TypeError) as e:
        print(f"locojax eval: {e}", file=sys.stderr)
        return 2
    try:
        setup = _setup(args, host)
        rows = _ordered(args, setup[1])
        if host.process_id == 0:
            parts = setup[1]
            print(f"prompts: {parts.prompts.describe(args.max_prompt_tokens)}", flush=True)
            if rows[2] is not None:
                print(eval_groups.describe(rows[2], parts.cfg.rollout.max_prompt_tokens,
                                           args.batch_size), flush=True)
        rows = _score(args, host, *setup, *rows)
    except (ValueError, OSError, TypeError, DataError) as e:  # bad input, named
        return _failed(host, e, 2)
    except Exception as e:
        if not host.is_multihost:
            raise
        return _failed(host, e, 1)
    if host.process_id == 0:
        _report(args, host, setup[1].task, setup[3], rows)
    return 0


def _failed(host, error: Exception, code: int) -> int:
    """Say `error` (in this command's flags) and return `code`; on several hosts, as the
    last line, leaving at once (`locojax/failure.py`)."""
    from locojax import failure

    if host.is_multihost:
        return failure.stop("eval", error, code, host.process_id, host.num_processes,
                            show_traceback=code != 2)
    print(f"locojax eval: {own_flags(str(error))}", file=sys.stderr)
    return code


def _setup(args: EvalArgs, host):
    """The parts every host builds, by the builder training uses (`RunParts`): wiring,
    task, weights, tokenizer, sampling, limits."""
    import jax

    from locojax.train import meshes
    from locojax.train.build import RunParts
    from locojax.train.config import RolloutConfig, RunConfig
    from locojax.train.wiring import Colocated, Single

    task_cfg = task_config(args)
    width = args.max_prompt_tokens
    if width == "auto" and args.task in MULTI_TURN_TASKS:
        width = MULTI_TURN_WIDTH  # a multi-turn prompt comes from its env: not sized by rows
    cfg = RunConfig(model=args.model, task=task_cfg, seed=args.seed, precision=args.precision,
                    multi_turn=args.multi_turn, rollout=RolloutConfig(
                        max_new_tokens=args.max_new_tokens, max_prompt_tokens=width,
                        tp=args.tp))
    meshes.check_tp(args.tp, jax.local_device_count(), flag="--tp")
    parts = RunParts.of(cfg)
    meshes.check_tp_model(args.tp, parts.model_cfg, flag="--tp")
    wiring = (Colocated if host.is_multihost else Single)(host, tp=args.tp)
    # This host's devices (each host holds its own copy), split over `tensor` under --tp.
    weights = parts.weights(wiring.rollout_mesh, wiring.rollout_rules)
    temperature = args.temperature if args.temperature is not None else (
        0.0 if args.k == 1 else 1.0)
    # Eval may sample greedily, which a training run's config (whose temperature is also the
    # learner's) cannot say: the run's sampling at eval's temperature.
    sampling = dataclasses.replace(parts.sampling, temperature=temperature)
    return wiring, parts, weights, sampling


def task_config(args: EvalArgs):
    """The task of `args` as `train --task.*` would name it, scored on its held-out rows."""
    from locojax.envs.registry import TaskConfig

    return TaskConfig(
        name=args.task, level=args.level, data=args.data, test_data=args.data,
        train_size=1,  # a procedural task's test split does not depend on it; eval reads none
        template=args.template, skip_invalid=args.skip_invalid, sandbox=args.sandbox,
        reward=args.reward, format_weight=args.format_weight,
        reward_weights=args.reward_weights, prompt_field=args.prompt_field,
        answer_field=args.answer_field, split=args.split, test_split=args.split)


def _ordered(args: EvalArgs, parts):
    """The rows to score, their order by encoded prompt length and their lengths in that
    order (identity and None under --one-width or for a multi-turn task)."""
    import numpy as np

    from locojax.commands import eval_groups
    from locojax.envs.prompt import encode_prompt

    examples = list(parts.task.test)[:args.limit or None]
    if args.one_width or parts.task.multi_turn:
        return examples, np.arange(len(examples)), None
    lengths = [len(encode_prompt(parts.tokenizer, ex)) for ex in examples]
    perm = eval_groups.order(lengths)
    return examples, perm, [lengths[i] for i in perm.tolist()]


def _score(args: EvalArgs, host, wiring, parts, weights, sampling, examples, perm,
           sorted_lengths):
    """This host's share of the rows (a contiguous run of the length order) scored group by
    group, then every host's records gathered and put back in the rows' order."""
    import jax

    from locojax import evaluate
    from locojax.commands import eval_groups
    from locojax.envs.pool import EnvPool
    from locojax.envs.rewards import RewardRunner

    task, tokenizer, cap = parts.task, parts.tokenizer, parts.cfg.rollout.max_prompt_tokens
    ordered = [examples[i] for i in perm.tolist()]
    n, h, hosts = len(ordered), host.process_id, host.num_processes
    lo, hi = n * h // hosts, n * (h + 1) // hosts
    if sorted_lengths is None:  # multi-turn prompts grow by turns: --batch-size as asked
        per_call = args.batch_size if task.multi_turn else eval_groups.rows_at(
            cap, args.batch_size)
        runs = eval_groups.one_width(cap, per_call, lo, hi)
    else:
        runs = eval_groups.groups(sorted_lengths, cap, args.batch_size, lo, hi)
    rows = []
    if runs:
        engine = parts.engine(wiring.rollout_mesh, wiring.rollout_rules)
        mt = args.multi_turn
        with RewardRunner() as runner, EnvPool(mt.env_workers, mt.env_timeout_s) as pool:
            for g in runs:
                mine = ordered[g.start:g.stop]
                # first_index: the run's place in the length order, which keys its samples
                scores = evaluate.score(engine, weights, tokenizer, task, runner, mine,
                                        sampling, args.k, g.width, g.rows,
                                        jax.random.key(args.seed), first_index=g.start,
                                        pool=pool, limits=parts.limits)
                fmt = (evaluate.in_format(task, scores, mine) if task.format_check is not None
                       else None)
                rows += [row_record(ex, scores, i, tokenizer, fmt) for i, ex in enumerate(mine)]
    return eval_groups.unsort(gather_rows(wiring, rows), perm)


def _report(args: EvalArgs, host, task, sampling, rows: list[dict]) -> None:
    import os

    summary = {"task": args.task, "model": args.model, "data": args.data,
               "template": args.template, "temperature": sampling.temperature,
               "hosts": host.num_processes,
               "skipped": getattr(task.test, "skipped", 0),  # data files only
               **summarize(rows, args.k, task.multi_turn)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(args.out + ".summary.json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    source = args.data or f"the held-out split (level {args.level}, seed {args.seed})"
    print(f"locojax eval: {args.task} on {source}: {summary['rows']} rows x {args.k} "
          f"sample(s), temperature {summary['temperature']}, model {args.model}, "
          f"{host.num_processes} host(s)")
    if summary["skipped"]:
        print(f"skipped {summary['skipped']} malformed rows; first: {task.test.problems[0]}")
    passes = "  ".join(f"pass@{j} {summary[f'pass@{j}']:.3f}" for j in pass_ks(args.k))
    print(f"accuracy {summary['accuracy']:.3f}  {passes}  mean length "
          f"{summary['mean_length']:.1f} tokens  truncated {summary['truncated_fraction']:.3f}"
          + (f"  tool-call rate {summary['tool_call_rate']:.3f}" if task.multi_turn else "")
          + (f"\nin format {summary['format_rate']:.3f}  accuracy in format "
             f"{summary['accuracy_in_format']:.3f}" if "format_rate" in summary else ""))
    print(f"rows: {args.out}\nsummary: {args.out}.summary.json")
