"""What the TRL workers and the scripts that drive them share, in one leaf.

Imported in TRL's venv (by trl_real_worker, trl_sample_worker, trl_update_worker, run as
modules from the repository root) and in locojax's (ab_update_trl), so it imports TRL only
inside a function: `grpo_config`, the real-model side's `GRPOConfig`, and `tensor_names`,
the tensors the one-update A/B compares.
"""

from __future__ import annotations

from pathlib import Path


def tensor_names(num_layers: int) -> tuple[str, ...]:
    """The HF names of the tensors both sides report: the (tied) embedding, the first layer's
    query projection (the deepest in the backward), the last layer's MLP down projection and
    the final norm scale."""
    return ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
            f"model.layers.{num_layers - 1}.mlp.down_proj.weight", "model.norm.weight")


def grpo_config(s: dict, output_dir: Path, steps: int, seed: int, device: str, torch):
    """The GRPOConfig of the TRL side: B·G rows a step, one update per generation, the
    settings `s` (bench_real_trl.SETTINGS) and TRL's defaults otherwise."""
    from trl import GRPOConfig

    B, G = s["prompts_per_step"], s["group_size"]
    # A fixed length (`ignore_eos`, locojax's --rollout.ignore-eos): transformers'
    # min_new_tokens masks the generation config's EOS ids, TRL's own `eos_token_ids`, until
    # N tokens, so no completion ends early and each one's N tokens are trained.
    fixed = {"min_new_tokens": s["max_new_tokens"]} if s.get("ignore_eos") else None
    return GRPOConfig(
        output_dir=str(output_dir), per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1, num_generations=G,
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=1.0,
        top_k=0, beta=s["beta"], epsilon=s["eps"], num_iterations=1,
        learning_rate=s["lr"], weight_decay=s["weight_decay"], lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch", max_steps=steps, shuffle_dataset=False,
        use_cpu=device == "cpu",
        bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, seed=seed, dataloader_num_workers=0,
        loss_type=s["trl_loss_type"], model_init_kwargs={"dtype": torch.float32},
        generation_kwargs=fixed)
