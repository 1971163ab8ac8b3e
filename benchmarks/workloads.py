"""The workloads the benchmarks train on, as the `locojax train` command lines that run them.

bench_modes.py's paper workloads (gsm8k, math, swe: TINY architecture, random f32 weights,
the built-in char tokenizer) and its legacy arith shapes (docs/design.md's TINY and SMALL),
each a `Shape` and one argv builder (`train_argv`), and bench_placement.py's points
(`placement_points`, `placement_argv`); ab_runs.py, calibrate_predict.py and
validate_predict.py rebuild the same commands, so that a point means the same run wherever
it is named. bench_modes.py's docstring says what each
workload is.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from benchmarks.harness import CLI, ROOT, run_logged

@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # model preset (docs/design.md canonical shape)
    prompts: int  # B, over all hosts (strong scaling's global batch)
    group: int  # G
    prompt_tokens: int  # P (padded columns)
    new_tokens: int  # most tokens per completion (swe: per model turn)
    steps: int  # default steps per run
    weak_prompts: int = 0  # b: weak scaling's prompts per host (0: B / 4)
    title: str = ""  # the tables' heading

    def __post_init__(self):
        if not self.weak_prompts:
            object.__setattr__(self, "weak_prompts", max(1, self.prompts // 4))
        if not self.title:
            object.__setattr__(self, "title", self.name)


SHAPES = {  # the legacy arith workloads' shapes (docs/design.md's TINY and SMALL)
    "tiny": Shape("TINY", "tiny", 8, 4, 16, 32, steps=20),
    "small": Shape("SMALL", "small", 16, 8, 32, 64, steps=7),
}
PAPER = {  # the paper's workloads, TINY architecture (random f32 weights, char tokenizer)
    "gsm8k": Shape("GSM8K", "tiny", 8, 4, 256, 64, steps=5,
                   title="GSM8K (TINY random f32, char tokenizer, P 256, 64 new tokens)"),
    "math": Shape("MATH", "tiny", 8, 4, 256, 64, steps=5,
                  title="Boxed math, MATH-500 rows, math-verify (TINY, P 256, 64 new tokens)"),
    "swe": Shape("SWE", "tiny", 8, 4, 768, 32, steps=5,
                 title="swe level 1 (TINY, P 768, 2 turns of <= 32 tokens, sandboxed tests)"),
}
WORKLOADS = ("gsm8k", "math", "swe", "arith", "arith-var")
MODES = ("single", "colocated", "controller")
SWE_PROMPT_TOKENS = 768  # the char tokenizer's SWE prompts are 620-670 characters
SWE_OBS_TOKENS = 64
SFT_LEVEL = 1  # arith level of the variable-length workload's SFT and prompts
FIXED_LEVEL = 3  # arith level of the fixed-length workload (content only: lengths are forced)
DATA = {"gsm8k": ROOT.parent / "shared/data/gsm8k/train.jsonl",
        "math": ROOT.parent / "shared/data/math500/test.jsonl"}


def sft_model(shape: Shape, work_dir: Path, sft_steps: int, timeout: float) -> tuple[Path, str]:
    """The arith-var workload's model: `locojax sft` on level-1 arith (reused if present)."""
    out = work_dir / f"sft-{shape.arch}-level{SFT_LEVEL}-steps{sft_steps}"
    argv = [*CLI, "sft", "--task", "arith", "--level", str(SFT_LEVEL), "--arch", shape.arch,
            "--sft.steps", str(sft_steps), "--eval-examples", "0", "--out", str(out)]
    cmd = shlex.join(argv)
    if (out / "locojax.json").exists():
        print(f"# reusing SFT model {out} (made by: {cmd})", flush=True)
        return out, cmd
    print(f"$ {cmd}", flush=True)
    code, tail = run_logged(argv, work_dir / f"sft-{shape.arch}.log", timeout)
    if code != 0:
        raise RuntimeError(f"SFT for {shape.name} failed ({code}):\n{tail}")
    return out, cmd


def prepare_data(workload: str, source: Path, prompt_tokens: int, work_dir: Path) -> Path:
    """`source` less the rows whose prompt (the task's plain template) does not encode within
    `prompt_tokens` with the char tokenizer: non-ASCII text, or too long (the run would stop)."""
    from locojax.envs import gsm8k, math_boxed
    from locojax.envs.prompt import encode_prompt
    from locojax.tokenizer.char import CharTokenizer

    module = gsm8k if workload == "gsm8k" else math_boxed
    out = work_dir / f"{workload}-p{prompt_tokens}-{source.stem}.jsonl"
    tok, lines = CharTokenizer(), source.read_text().splitlines(keepends=True)
    examples = module.load(source, "plain").examples  # ids name the file's line: "x.jsonl:12"
    kept = []
    for ex in examples:
        try:
            fits = len(encode_prompt(tok, ex)) <= prompt_tokens
        except ValueError:  # a character outside the char tokenizer's
            fits = False
        if fits:
            kept.append(lines[int(ex.id.rsplit(":", 1)[1]) - 1])
    out.write_text("".join(kept))
    print(f"# {workload}: {len(kept)} of {len(examples)} rows of {source} encode within "
          f"{prompt_tokens} char tokens -> {out}", flush=True)
    return out

def swe_train(mode: str, model: str, prompts: int, group: int, turn_tokens: int, steps: int,
              run_dir: Path, beta: float = 0.0) -> list[str]:
    """`train swe` on generated level-1 repositories: 2 model turns of at most `turn_tokens`
    around one error observation, then the sandboxed test run (also bench_placement's)."""
    return [
        "train", "swe", "--mode", mode, "--model", model, "--task.level", "1",
        "--rollout.prompts-per-step", str(prompts), "--algo.group-size", str(group),
        "--rollout.max-prompt-tokens", str(SWE_PROMPT_TOKENS),
        "--rollout.max-new-tokens", str(turn_tokens), "--multi-turn.max-turns", "2",
        "--multi-turn.max-obs-tokens", str(SWE_OBS_TOKENS),
        "--multi-turn.max-trajectory-tokens", str(2 * turn_tokens + SWE_OBS_TOKENS),
        "--algo.beta", str(beta), "--steps", str(steps), "--eval.every", "0",
        "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir),
    ]


def train_argv(shape: Shape, workload: str, model: str, mode: str, n: int, steps: int,
               beta: float, run_dir: Path, *, prompts: int = 0, data: str = "",
               ray_address: str = "", split: bool = False,
               decode_chunk: int = 0) -> list[str]:
    """The run's argv. `prompts`: the global prompts per step (0: the shape's B)."""
    b = prompts or shape.prompts
    if workload == "swe":
        train = swe_train(mode, model, b, shape.group, shape.new_tokens, steps, run_dir, beta)
    elif workload in ("gsm8k", "math"):
        train = [
            "train", "gsm8k", "--mode", mode, "--model", model, "--task.name", workload,
            "--task.data", data, "--task.template", "plain",
            "--rollout.prompts-per-step", str(b), "--algo.group-size", str(shape.group),
            "--rollout.max-prompt-tokens", str(shape.prompt_tokens),
            "--rollout.max-new-tokens", str(shape.new_tokens), "--rollout.ignore-eos",
            "--algo.beta", str(beta), "--steps", str(steps), "--eval.every", "0",
            "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir),
        ]
    else:
        fixed = workload == "arith"
        train = [
            "train", "demo", "--mode", mode, "--model", model, "--task.name", "arith",
            "--task.level", str(FIXED_LEVEL if fixed else SFT_LEVEL),
            "--rollout.prompts-per-step", str(b), "--algo.group-size", str(shape.group),
            "--rollout.max-prompt-tokens", str(shape.prompt_tokens),
            "--rollout.max-new-tokens", str(shape.new_tokens),
            *(["--rollout.ignore-eos"] if fixed else []),
            "--algo.beta", str(beta), "--steps", str(steps), "--eval.every", "0",
            "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir),
        ]
    if split:
        train.append("--profile-split")
    if mode == "single":
        return [*CLI, *train, "--devices-per-host", str(n)]
    if mode == "controller":
        return [*CLI, *train, "--hosts", str(n), "--devices-per-host", "1",
                *(["--controller.decode-chunk", str(decode_chunk)] if decode_chunk else []),
                *(["--ray-address", ray_address] if ray_address else [])]
    return [*CLI, "launch", "--hosts", str(n), "--devices-per-host", "1", "--", *train]


HOSTS = 4
"""bench_placement.py's simulated hosts of one device each: its points (colocated, DA at
rollout fractions, async at staleness k) are commands over this many."""


@dataclasses.dataclass(frozen=True)
class Point:
    name: str  # colocated | da-0.25 | ... | async-k1 | ...
    mode: str
    extra: tuple[str, ...]


def placement_points(fractions, ks) -> list[Point]:
    out = [Point("colocated", "colocated", ())]
    out += [Point(f"da-{f:g}", "disaggregated", ("--hosts", str(HOSTS), "--rollout-fraction",
                                                 str(f))) for f in fractions]
    out += [Point(f"async-k{k}", "async", ("--hosts", str(HOSTS), "--workers", str(HOSTS - 1),
                                           "--learner-hosts", "1", "--max-staleness", str(k)))
            for k in ks]
    return out


def placement_argv(p: Point, args, run_dir: Path, ray_address: str) -> list[str]:
    if args.workload == "swe":
        train = [*swe_train(p.mode, "tiny", args.prompts, args.group, args.new_tokens,
                            args.steps, run_dir), *p.extra]
    else:
        train = arith_train(p, args, run_dir)
    if p.mode == "colocated":
        return [*CLI, "launch", "--hosts", str(HOSTS), "--devices-per-host", "1", "--", *train]
    return [*CLI, *train, "--ray-address", ray_address]


def arith_train(p: Point, args, run_dir: Path) -> list[str]:
    return ["train", "demo", "--mode", p.mode, "--model", "tiny", "--task.name", "arith",
             "--task.level", "3", "--rollout.prompts-per-step", str(args.prompts),
             "--algo.group-size", str(args.group), "--rollout.max-prompt-tokens", "16",
             "--rollout.max-new-tokens", str(args.new_tokens), "--rollout.ignore-eos",
             "--steps", str(args.steps), "--eval.every", "0", "--no-progress",
             "--no-tensorboard", "--run-dir", str(run_dir), *p.extra]
