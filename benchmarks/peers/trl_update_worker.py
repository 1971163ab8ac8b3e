"""The TRL side of `ab_update_trl.py`: TRL's own GRPO update on a fixed batch, in TRL's venv.

The batch (written by `ab_update_trl.py`) holds token ids, masks and advantages. This worker
turns it into the inputs dict that `GRPOTrainer._generate_and_score_completions` returns
(prompts left-padded and completions right-padded to the batch's longest, with TRL's own
`pad`; `num_items_in_batch` the completion tokens) and runs `trainer.train()` for `--updates`
optimizer steps with `_prepare_inputs` handing over that dict instead of generating.
Everything else is TRL's and HF Trainer's code, unchanged: the `dapo` loss with the old
logprobs the detached current ones (ratio 1), the backward, `_clip_grad_norm` (max_grad_norm
1.0) and torch's AdamW. The GRPOConfig is `trl_real_worker.py`'s, value for value.
`--padding-idx none` is the one change made on purpose, for the A/B's second arm: HF builds
the input embedding with `padding_idx = config.pad_token_id`, and nn.Embedding gives that row
no lookup gradient; SmolLM2's pad token is <|im_end|>, a real token of every chat prompt.

`--dtype float64` widens the f32 islands of that code, as tests/hf_reference.py does for
transformers: LlamaRMSNorm and the rotary embedding compute in their input's dtype, and TRL's
chunked log-prob kernel (f32 accumulators whatever the model's dtype) is replaced by its plain
equivalent, log_softmax(h Wᵀ / τ) at the labels. The rounding changes, not the arithmetic.

Writes OUT (npz): `loss` [U], `grad_norm` [U] (pre-clip, as `_clip_grad_norm` returns it),
`lr` [U], and for each of `tensor_names` its first update's pre-clip gradient (`grad/NAME`)
and its change over the U updates (`delta/NAME`), in the model's dtype.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from benchmarks.peers.trl_common import tensor_names


def trl_inputs(batch, torch, pad_id: int) -> dict:
    """The dict `_generate_and_score_completions` would return for these rows, padded with
    TRL's tokenizer's pad id (no old logprobs: with one iteration per generation TRL uses the
    detached current ones)."""
    from trl.trainer.utils import pad

    g = int(batch["group_size"])
    prompts = [torch.tensor(batch["prompt_tokens"][r // g][batch["prompt_mask"][r // g]])
               for r in range(len(batch["advantages"]))]
    completions = [torch.tensor(t[m]) for t, m in zip(batch["completion_tokens"],
                                                      batch["completion_mask"])]
    ones = lambda xs: [torch.ones_like(x, dtype=torch.long) for x in xs]  # noqa: E731
    completion_mask = pad(ones(completions), padding_value=0, padding_side="right")
    return {
        "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
        "prompt_mask": pad(ones(prompts), padding_value=0, padding_side="left"),
        "completion_ids": pad(completions, padding_value=pad_id, padding_side="right"),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(batch["advantages"], dtype=torch.float32),
        "num_items_in_batch": completion_mask.sum(),
    }


@contextlib.contextmanager
def widened(torch):
    """HF Llama's RMSNorm and RoPE, and TRL's log-prob kernel, in their input's dtype."""
    from unittest import mock

    import trl.trainer.utils as trl_utils
    from transformers.models.llama import modeling_llama as llama

    def rms_norm(self, x):  # LlamaRMSNorm.forward without its cast to f32
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x

    def rope(self, x, position_ids):  # LlamaRotaryEmbedding.forward, default type, in x's dtype
        dim = self.config.head_dim
        theta = self.config.rope_parameters["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim)
        emb = torch.cat([position_ids[..., None].to(x.dtype) * inv] * 2, dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    class PlainLogProb:
        """`ChunkedLogProbFunction.apply` in the input's dtype, through autograd."""

        @staticmethod
        def apply(hidden, weight, bias, labels, temperature, _chunk, softcap, scale, _outputs):
            z = hidden @ weight.t() + (0 if bias is None else bias)
            z = z * scale
            if softcap is not None:
                z = softcap * torch.tanh(z / softcap)
            logp = torch.log_softmax(z / temperature, dim=-1)
            target = logp.gather(-1, labels[:, None]).squeeze(-1)
            return target, -(logp.exp() * logp).sum(-1), None, None, None

    with mock.patch.object(llama.LlamaRMSNorm, "forward", rms_norm), \
            mock.patch.object(llama.LlamaRotaryEmbedding, "forward", rope), \
            mock.patch.object(trl_utils, "_ChunkedLogProbFunction", PlainLogProb):
        yield


def unused_reward(completions, **_):
    """GRPOTrainer needs a reward function; nothing is generated, so nothing calls it."""
    raise AssertionError("the A/B hands TRL its batch; no completion is generated or scored")


def run(args, s: dict, torch) -> dict:
    import datasets
    import numpy as np
    from trl import GRPOConfig, GRPOTrainer

    batch = dict(np.load(args.batch))
    rows, g = len(batch["advantages"]), int(batch["group_size"])
    data = datasets.Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": str(i)}] for i in range(rows // g)]})
    # trl_real_worker.py's GRPOConfig, value for value; max_steps: the updates of the A/B
    config = GRPOConfig(
        output_dir=str(args.out) + ".trl", per_device_train_batch_size=rows,
        gradient_accumulation_steps=1, num_generations=g,
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=1.0,
        top_k=0, beta=s["beta"], epsilon=s["eps"], num_iterations=1,
        learning_rate=s["lr"], weight_decay=s["weight_decay"], lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch", max_steps=args.updates, shuffle_dataset=False, use_cpu=True,
        bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
        loss_type=s["trl_loss_type"], model_init_kwargs={"dtype": getattr(torch, args.dtype)})
    trainer = GRPOTrainer(model=args.model, reward_funcs=unused_reward, args=config,
                          train_dataset=data)
    if args.padding_idx == "none":  # the A/B's other arm: the embedding's pad row trains too
        trainer.model.get_input_embeddings().padding_idx = None
    inputs = trl_inputs(batch, torch, trainer.processing_class.pad_token_id)
    names = tensor_names(trainer.model.config.num_hidden_layers)
    params = dict(trainer.model.named_parameters())
    before = {n: params[n].detach().clone() for n in names}
    out = {"loss": [], "grad_norm": [], "lr": []}
    grads = {}
    compute_loss, clip = trainer.compute_loss, trainer._clip_grad_norm

    def recorded_loss(model, inputs_, **kw):
        loss = compute_loss(model, inputs_, **kw)
        out["loss"].append(loss.item())
        return loss

    def recorded_clip(model):  # HF calls it after the backward, before optimizer.step()
        if not grads:
            grads.update({n: params[n].grad.detach().clone() for n in names})
        norm = clip(model)
        out["grad_norm"].append(float(norm))
        out["lr"].append(float(trainer.optimizer.param_groups[0]["lr"]))
        return norm

    trainer.compute_loss, trainer._clip_grad_norm = recorded_loss, recorded_clip
    trainer._prepare_inputs = lambda _rows: inputs
    trainer.train()
    after = dict(trainer.model.named_parameters())
    arrays = {k: np.asarray(v, np.float64) for k, v in out.items()}
    for n in names:
        arrays[f"grad/{n}"] = grads[n].numpy()
        arrays[f"delta/{n}"] = (after[n].detach() - before[n]).numpy()
    return arrays


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True, help="the .npz ab_update_trl.py wrote")
    ap.add_argument("--out", required=True, help="the .npz this writes")
    ap.add_argument("--updates", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--settings", required=True, help="JSON of bench_real_trl.SETTINGS")
    ap.add_argument("--padding-idx", choices=["keep", "none"], default="keep",
                    help="none: clear the input embedding's padding_idx (HF sets it to the "
                         "config's pad_token_id, whose row then gets no lookup gradient)")
    args = ap.parse_args(argv)
    s = json.loads(args.settings)

    import numpy as np
    import torch
    import transformers
    import trl

    torch.set_num_threads(os.cpu_count())
    print(f"trl {trl.__version__} torch {torch.__version__} transformers "
          f"{transformers.__version__} dtype {args.dtype} padding_idx {args.padding_idx} "
          f"threads {torch.get_num_threads()}", flush=True)
    with widened(torch) if args.dtype == "float64" else contextlib.nullcontext():
        arrays = run(args, s, torch)
    np.savez(args.out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
