"""The TRL side of `bench_peers.py`: TRL's `GRPOTrainer` on a random Qwen3, in TRL's own venv.

Set up as TRL's docs recommend for a single CPU process: `GRPOConfig` + `GRPOTrainer` with a
reward function, generation by transformers `generate` (KV cache on, TRL's default without
vLLM), `per_device_train_batch_size` = B·G completions and `num_generations` = G so each
step generates once and takes one AdamW update, β as given (a reference model when β > 0).
Prompts are fed in order (`shuffle_dataset=False`) so step s trains on `common.prompts(s)`.

The token "text" is decimal ids (a WordLevel tokenizer over "0".."V-1", plus "<eos>" = V,
which the V-way model can never sample: exactly N new tokens). Torch runs with every core.

Phases: generate = `_generate_single_turn`; reference = `_get_per_token_logps_and_entropies`
on the reference model; train = `training_step` minus its input preparation, plus the
optimizer step; other = the rest of the step (rewards, advantages, data loading, logging).
Steps are driven by the driver from a `TrainerCallback.on_step_end`.
"""

from __future__ import annotations

import os
import sys
import time

from benchmarks.peers import common


def make_tokenizer(shape):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(shape.vocab)}
    vocab["<eos>"] = common.eos_id(shape)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>",
                                   pad_token=str(common.PAD_ID), unk_token="<eos>")


def build_trainer(args):
    """TRL's `GRPOTrainer` on the random model, set up as TRL's docs do (the docstring)."""
    import datasets
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads or os.cpu_count())
    torch.manual_seed(0)
    s = common.SHAPES[args.shape]
    # TRL takes a model path (as its docs do with a Hub id), so that β > 0 can load its
    # reference copy from the same place: the random model is saved once, then loaded.
    model_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                             f"locojax-bench-peers-trl-{args.shape}")
    Qwen3ForCausalLM(Qwen3Config(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
        num_hidden_layers=s.layers, num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads, head_dim=s.head_dim, rope_theta=common.ROPE_THETA,
        rms_norm_eps=common.RMS_EPS, tie_word_embeddings=True, pad_token_id=common.PAD_ID,
        eos_token_id=common.eos_id(s), bos_token_id=None)).float().save_pretrained(model_dir)
    tokenizer = make_tokenizer(s)
    steps = args.max_steps + 1
    rows = [common.to_text(p) for step in range(steps) for p in common.prompts(s, step)]
    dataset = datasets.Dataset.from_dict({"prompt": rows})

    def even_reward(completions, **_):
        return [common.even_fraction(c) for c in completions]

    config = GRPOConfig(
        output_dir=os.environ.get("TMPDIR", "/tmp") + "/locojax-bench-peers-trl",
        per_device_train_batch_size=s.rows, gradient_accumulation_steps=1,
        num_generations=s.group, max_completion_length=s.new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=args.beta, num_iterations=1,
        learning_rate=common.LR, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", max_steps=steps, shuffle_dataset=False, use_cpu=True,
        bf16=False, fp16=False, report_to="none", save_strategy="no",
        logging_steps=10 ** 6, disable_tqdm=True, seed=0, dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32})
    trainer = GRPOTrainer(model=model_dir, reward_funcs=even_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer)
    return trainer


def timed_phases(trainer) -> common.PhaseClock:
    """Wrap the trainer's phases so each step's time goes to its `PhaseClock`; the optimizer
    step is added by the callback (`StepEnds`)."""
    clock = common.PhaseClock()
    trainer._generate_single_turn = clock.timed("generate", trainer._generate_single_turn)
    logps = trainer._get_per_token_logps_and_entropies

    def logps_timed(model, *a, **k):
        if model is trainer.ref_model:
            return clock.timed("reference", logps)(model, *a, **k)
        return logps(model, *a, **k)

    trainer._get_per_token_logps_and_entropies = logps_timed
    prepare, train_step = trainer._prepare_inputs, trainer.training_step
    prep = {"s": 0.0}

    def prepare_timed(*a, **k):
        t0 = time.perf_counter()
        out = prepare(*a, **k)
        prep["s"] += time.perf_counter() - t0
        return out

    def training_step_timed(*a, **k):
        t0 = time.perf_counter()
        prep["s"] = 0.0
        out = train_step(*a, **k)
        clock.add("train", time.perf_counter() - t0 - prep["s"])
        return out

    trainer._prepare_inputs, trainer.training_step = prepare_timed, training_step_timed
    return clock


def main(argv=None) -> int:
    args = common.worker_args(argv)
    channel = common.Channel()
    t_setup = time.perf_counter()
    with channel.reporting("setup: "):
        import torch
        import transformers
        import trl
        from transformers import TrainerCallback

        trainer = build_trainer(args)
    clock = timed_phases(trainer)
    versions = {"trl": trl.__version__, "torch": torch.__version__,
                "transformers": transformers.__version__, "torch_threads": torch.get_num_threads()}
    driven = common.Driven(channel, versions, t_setup, args.warmup)

    class StepEnds(TrainerCallback):
        """Each step ends here: its record goes to the protocol's skeleton."""

        def __init__(self):
            self.step, self.t0, self.opt0 = 0, 0.0, 0.0

        def on_train_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, *_, **__):
            self.opt0 = time.perf_counter()

        def on_optimizer_step(self, *_, **__):
            clock.add("train", time.perf_counter() - self.opt0)

        def on_step_end(self, _args, _state, control, **__):
            record = clock.close_step(self.step, time.perf_counter() - self.t0)
            self.step += 1
            if not driven.end_step(record):
                control.should_training_stop = True
            self.t0 = time.perf_counter()
            return control

    trainer.add_callback(StepEnds())
    with channel.reporting():
        trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
