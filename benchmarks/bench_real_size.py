"""A real config at its real size on this machine: the memory plan against measured peak RSS.

    python -m benchmarks.bench_real_size --data ../shared/data/gsm8k/train.jsonl
    python -m benchmarks.bench_real_size --config gemma-3-1b-it --data FILE
    python -m benchmarks.bench_real_size --model DIR --data FILE   # an existing HF dir
    python -m benchmarks.bench_real_size --config llama-3.2-1b-instruct --data FILE --plan-only

Without --model it first writes a random-weight HF directory of --config (a published
config.json in tests/data/hf_configs.json; default qwen3-0.6b: 28 layers, d=1024, ffn 3072,
16 q / 8 kv heads of 128, vocab 151,936, tied) with transformers, built from the config dict
itself (`AutoConfig.for_model`, f32, transformers' own init), and a byte-level BPE tokenizer
trained offline on the data with `tokenizers`, in a child process. A second child process
then runs `locojax train gsm8k`'s Trainer in-process: it prints the memory plan (compiled at
the run's shapes), runs the steps (GSM8K prompts, GRPO, rollout on the engine, exactly
--new-tokens per completion), and reports its peak RSS (VmHWM) next to the plan, the step
times, generation tokens/s and the phase times. The child's RSS before the plan (Python,
jax, the tokenizer) is reported too: the plan counts device buffers only. With --save it
then also writes the run checkpoint and the exported model, and reports the peak including
them.

Targets (issue 11) at 8 rows x 192 tokens (4 prompts x G 2, 160-token window, 32 new): peak
RSS within 25% of the plan, and at most params + optimizer + gradients + 30%. It is memory
heavy (~12 GB at 0.6B, ~4 x 4 bytes per parameter): on a shared machine run it under
`flock /tmp/locojax_bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


from benchmarks import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "tests", "data", "hf_configs.json")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _rows(path: str, n: int) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


# --- child 1: the random HF directory --------------------------------------------------------


def write_model(out: str, data: str, tokenizer_vocab: int, config: str, layers: int,
                weights: bool = True) -> None:
    """A random-weight model of published config `config` (transformers' own init, f32, at
    most `layers` layers when > 0) and a BPE tokenizer; without `weights`, only its
    config.json (enough for the plan: `--plan-only`)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(CONFIGS) as f:
        fields = json.load(f)[config]
    # Token ids of the real vocabulary mean nothing to the 4,096-token tokenizer below.
    fields = {**fields, "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": None,
              "pad_token_id": None}
    if layers:
        fields["num_hidden_layers"] = layers
    os.makedirs(out, exist_ok=True)
    if weights:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
        model = model.float().eval()
        model.save_pretrained(out)
        del model
    else:
        AutoConfig.for_model(**fields).save_pretrained(out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rows = _rows(data, 2000)
    tok.train_from_iterator(
        [r["question"] + " " + r["answer"] for r in rows],
        trainers.BpeTrainer(vocab_size=tokenizer_vocab, special_tokens=SPECIAL,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)


# --- child 2: the run ------------------------------------------------------------------------


def train(args) -> dict:
    baseline_kb = _status_kb("VmRSS")  # before jax and locojax
    import dataclasses

    from locojax.envs.base import Example
    from locojax.envs.gsm8k import make_prompt
    from locojax.model import loader
    from locojax.profiler import StepTimer
    from locojax.envs.prompt import encode_prompt
    from locojax.train import wiring
    from locojax.train.config import EvalConfig, RolloutConfig, gsm8k_qwen3
    from locojax.train.loop import start

    # The first 64 rows whose chat-formatted prompt fits the window, as the run formats them.
    base = gsm8k_qwen3(args.model, args.data)
    tokenizer = loader.load_tokenizer_of(args.model)
    data = os.path.join(args.work, "gsm8k_fit.jsonl")
    kept = 0
    with open(args.data) as src, open(data, "w") as dst:
        for line in src:
            prompt = make_prompt(json.loads(line)["question"], base.task.template)
            if len(encode_prompt(tokenizer, Example("", prompt, ""))) <= args.prompt_tokens:
                dst.write(line)
                kept += 1
            if kept == 64:
                break
    cfg = dataclasses.replace(
        gsm8k_qwen3(args.model, data), mode="single", steps=args.steps,
        run_dir=os.path.join(args.work, "run"), progress=False, tensorboard=False,
        algo=dataclasses.replace(base.algo, group_size=args.group),
        rollout=RolloutConfig(prompts_per_step=args.prompts, max_new_tokens=args.new_tokens,
                              max_prompt_tokens=args.prompt_tokens, ignore_eos=True),
        eval=EvalConfig(every=0), precision=args.precision, remat=args.remat,
        device_memory_gb=args.device_memory_gb, plan_only=args.plan_only)
    jax_kb = _status_kb("VmRSS")
    t0 = time.perf_counter()
    trainer = start(cfg, wiring.join("single"))  # prints the plan; compiles the step's programs
    if args.plan_only:
        return {"plan_only": True, "init_s": time.perf_counter() - t0}
    init_s = time.perf_counter() - t0
    plan = trainer.memory
    steps = []
    for step in range(cfg.steps):
        timer = StepTimer()
        metrics = trainer.step(step, timer)
        perf = timer.finish_step()
        steps.append({"metrics": metrics, "perf": perf, "hwm_kb": _status_kb("VmHWM")})
        print(f"step {step + 1}: {perf['perf/step_time']:.1f} s, peak RSS so far "
              f"{steps[-1]['hwm_kb'] * 1024 / 1e9:.2f} GB", flush=True)
    out = {"baseline_kb": baseline_kb, "jax_kb": jax_kb, "init_s": init_s,
           "plan_text": plan.format(), "plan_peak": plan.peak, "held": plan.held,
           "expected": plan.expected, "compile_s": {p.name: p.compile_s for p in plan.programs},
           "num_params": trainer.parts.model_cfg.num_params(), "steps": steps,
           "remat": plan.settings["remat"], "grad_accum": plan.settings["grad_accum"],
           "rows": cfg.rollout.prompts_per_step * cfg.group_size,
           "columns": cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens}
    if args.save:
        t0 = time.perf_counter()
        trainer.save(cfg.steps - 1)
        trainer.ckpt.close()
        loader.save(os.path.join(cfg.run_dir, "final_model"), trainer.parts.model_cfg,
                    trainer.state.params, cfg.model)
        out["save_s"] = time.perf_counter() - t0
        out["hwm_with_save_kb"] = _status_kb("VmHWM")
    return out


# --- the parent: report ----------------------------------------------------------------------


def _run_child(argv: list[str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_real_size", *argv],
                          cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        sys.exit(f"child {argv[0]} failed (exit {proc.returncode})")
    return proc.stdout


def report(r: dict, args) -> None:
    if r.get("plan_only"):
        print(f"planned in {r['init_s']:.1f} s; nothing run (--plan-only)")
        return
    to_bytes = lambda kb: kb * 1024  # noqa: E731  (/proc's "kB" are KiB)
    peak = to_bytes(r["steps"][-1]["hwm_kb"])
    plan = r["plan_peak"]
    p = r["held"]["params"]
    budget = p + r["held"]["optimizer"] + r["num_params"] * 4  # params + optimizer + grads
    print(f"\nrows x tokens: {r['rows']} x {r['columns']}; precision {args.precision}, "
          f"remat {args.remat} -> {'on' if r['remat'] else 'off'}, {r['grad_accum']} "
          "micro-batch(es)")
    print(f"RSS before jax: {to_bytes(r['baseline_kb']) / 1e9:.2f} GB; after imports "
          f"{to_bytes(r['jax_kb']) / 1e9:.2f} GB")
    print(f"peak RSS over {len(r['steps'])} steps: {peak / 1e9:.2f} GB; plan {plan / 1e9:.2f} GB "
          f"-> measured/plan {peak / plan:.3f} (target within 25%: "
          f"{'met' if abs(peak / plan - 1) <= 0.25 else 'MISSED'})")
    print(f"params + optimizer + gradients: {budget / 1e9:.2f} GB -> peak is "
          f"{100 * (peak / budget - 1):+.1f}% of it (target <= +30%: "
          f"{'met' if peak <= 1.3 * budget else 'MISSED'})")
    if "hwm_with_save_kb" in r:
        print(f"peak RSS including the checkpoint and the exported model: "
              f"{to_bytes(r['hwm_with_save_kb']) / 1e9:.2f} GB (save {r['save_s']:.1f} s)")
    print(f"start-up (plan compiles every program, loads weights): {r['init_s']:.1f} s; compile "
          + ", ".join(f"{k} {v:.1f} s" for k, v in r["compile_s"].items() if v))
    gen = r["rows"] * args.new_tokens
    for i, s in enumerate(r["steps"]):
        perf = s["perf"]
        phases = {k.split("/")[-1]: v for k, v in perf.items() if k.startswith("perf/phase/")}
        gen_s = phases.get("prefill", 0) + phases.get("decode", 0)
        print(f"step {i + 1}: {perf['perf/step_time']:.2f} s (compile inside the step "
              f"{perf['perf/compile_time']:.2f} s), generation {gen} tokens in {gen_s:.2f} s = "
              f"{gen / max(gen_s, 1e-9):.1f} tokens/s; phases "
              + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + f"; logprob_mismatch {s['metrics']['rollout/logprob_mismatch']:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="an HF dir (default: write a random --config)")
    ap.add_argument("--config", default="qwen3-0.6b", help="a key of tests/data/hf_configs.json")
    ap.add_argument("--data", required=True, help="GSM8K jsonl (HF format: question, answer)")
    ap.add_argument("--work", default="", help="scratch dir (default: a temp dir, removed)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--remat", choices=["auto", "on", "off"], default="on",
                    help="auto: the plan decides against --device-memory-gb")
    ap.add_argument("--device-memory-gb", type=float, default=0.0, help="0: this host's RAM")
    ap.add_argument("--save", action="store_true", help="also checkpoint and export, measured")
    ap.add_argument("--tokenizer-vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=0, help="fewer for a quick dry run (0: all)")
    ap.add_argument("--plan-only", action="store_true",
                    help="write only the config and tokenizer, print the run's plan, run nothing")
    ap.add_argument("--child", choices=["write", "train"], default=None,
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "write":
        write_model(args.model, args.data, args.tokenizer_vocab, args.config, args.layers,
                    not args.plan_only)
        return
    if args.child == "train":
        print("RESULT " + json.dumps(train(args)), flush=True)
        return

    print(harness.command_line())
    print(harness.header("bench_real_size"))
    work = args.work or tempfile.mkdtemp(prefix="bench_real_size_")
    os.makedirs(work, exist_ok=True)
    model = args.model
    if not model:
        model = os.path.join(work, f"{args.config}-random")
        t0 = time.perf_counter()
        _run_child(["--child", "write", "--model", model, "--data", args.data,
                    "--tokenizer-vocab", str(args.tokenizer_vocab), "--config", args.config,
                    "--layers", str(args.layers)] + (["--plan-only"] if args.plan_only else []))
        print(f"wrote a random {args.config} ({args.layers or 'all'} layers) to {model} in "
              f"{time.perf_counter() - t0:.0f} s")
    flags = ["--child", "train", "--model", model, "--data", args.data, "--work", work,
             "--prompts", str(args.prompts), "--group", str(args.group), "--prompt-tokens",
             str(args.prompt_tokens), "--new-tokens", str(args.new_tokens), "--steps",
             str(args.steps), "--precision", args.precision,
             "--remat", args.remat, "--device-memory-gb", str(args.device_memory_gb)]
    flags += ["--config", args.config] + (["--save"] if args.save else [])
    flags += ["--plan-only"] if args.plan_only else []
    out = _run_child(flags)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            report(json.loads(line[len("RESULT "):]), args)
        else:
            print(line)
    if not args.work:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end {harness.loads()}")


if __name__ == "__main__":
    main()
