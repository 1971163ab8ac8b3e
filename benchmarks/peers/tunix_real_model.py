"""An HF Llama checkpoint (SmolLM2-135M-Instruct) as Tunix's nnx `Llama3`, in Tunix's venv.

Tunix 0.1.7 loads such a directory with `tunix.models.llama3.params
.create_model_from_safe_tensors(dir, ModelConfig)`. It has no reader for `config.json`, so
`llama3_fields` maps the HF config's fields to its `ModelConfig`, and refuses by name what
that model cannot compute (rope scaling, biases, another activation, untied heads whose
weights the file lacks). Tied embeddings, grouped KV heads (9 query, 3 KV heads for
SmolLM2) and head_dim 64 load as they are.

One departure is needed, and `load` makes it: Tunix 0.1.7's `Attention.block` calls
`apply_rope(x, positions, head_dim=...)` without the config's `rope_theta`, so every Llama3
runs at apply_rope's default θ = 1,000,000, whatever the config says. SmolLM2 uses θ =
100,000. Unpatched, its logits on the France chat prompt differ from transformers'/locojax's
by up to 6.0 (a bound of 0.05 holds with the patch; tests/test_tunix_real.py checks both).
The patch binds the module's `apply_rope` to the config's θ (one process, one model family).

Run as a file, it writes the model's f32 logits of a token-id list to an .npy file, for the
parity test: `python tunix_real_model.py MODEL_DIR OUT.npy IDS_JSON [--no-rope-fix]
[--export DIR]` (`--export`: the loaded model written back as an HF directory).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

ACTIVATIONS = ("silu",)
"""What Tunix's Llama3 MLP computes (`nnx.silu(gate) * up`)."""


def llama3_fields(hf: dict) -> dict:
    """Tunix `llama3.model.ModelConfig` keyword arguments from an HF `config.json` dict.

    Raises ValueError naming the field where Tunix's Llama3 would compute another model."""
    if hf.get("model_type") != "llama":
        raise ValueError(f"model_type {hf.get('model_type')!r}: Tunix's Llama3 loader reads "
                         "only model_type 'llama'")
    scaling = hf.get("rope_scaling") or {}
    rope_type = (hf.get("rope_parameters") or {}).get("rope_type", "default")
    if scaling or rope_type != "default":
        raise ValueError(f"rope scaling {scaling or rope_type!r}: Tunix 0.1.7's Llama3 applies "
                         "plain RoPE only")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise ValueError(f"{flag} is true: Tunix's Llama3 has no biases")
    if hf.get("hidden_act", "silu") not in ACTIVATIONS:
        raise ValueError(f"hidden_act {hf['hidden_act']!r}: Tunix's Llama3 MLP is SiLU-gated")
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads", hf["num_attention_heads"])
    if heads % kv:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv}")
    theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta"))
    if theta is None:
        raise ValueError("config.json has no rope_theta")
    return dict(num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
                embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
                num_heads=heads, head_dim=hf.get("head_dim", hf["hidden_size"] // heads),
                num_kv_heads=kv, rope_theta=int(theta), norm_eps=float(hf["rms_norm_eps"]),
                weight_tying=bool(hf.get("tie_word_embeddings", False)))


def load(model_dir: str | Path, rope_fix: bool = True, mesh=None):
    """(Tunix Llama3 in f32, its ModelConfig) from an HF checkpoint directory, placed on
    `mesh` if given (an RLCluster given a model on another mesh keeps a resharded copy)."""
    import jax.numpy as jnp
    from tunix.models.llama3 import model as llama3
    from tunix.models.llama3 import params as llama3_params

    cfg = llama3.ModelConfig(**llama3_fields(json.loads(Path(model_dir, "config.json")
                                                        .read_text())))
    if rope_fix:
        unbound = getattr(llama3.apply_rope, "func", llama3.apply_rope)
        # Departure from Tunix 0.1.7 (see the module docstring): the config's θ, not 1e6.
        llama3.apply_rope = functools.partial(unbound, rope_theta=cfg.rope_theta)
    model = llama3_params.create_model_from_safe_tensors(str(model_dir), cfg, mesh=mesh,
                                                         dtype=jnp.float32)
    return model, cfg


def logits(model, ids: list[int]):
    """[T, V] f32 logits of one unpadded sequence (causal mask, positions 0..T-1)."""
    import jax.numpy as jnp
    import numpy as np

    t = len(ids)
    mask = jnp.tril(jnp.ones((1, t, t), bool))  # [B, T, S]
    out, _ = model(jnp.asarray([ids]), jnp.arange(t)[None], None, mask)
    return np.asarray(out[0], np.float32)


COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "locojax.json")
"""The source directory's files an export keeps as they are (`locojax eval` and transformers
read the tokenizer and chat template from them)."""


def hf_tensors(model, cfg) -> dict:
    """The model's weights as HF Llama tensors (numpy f32): the inverse of Tunix's
    `llama3.params` key mapping, which Tunix 0.1.7 does not ship for Llama3."""
    import numpy as np
    from flax import nnx

    d = cfg.embed_dim
    state = nnx.to_flat_state(nnx.state(model, nnx.Param))
    out = {}
    for path, var in state:
        key, w = ".".join(str(k) for k in path), np.asarray(var.get_value(), np.float32)
        if key == "embedder.input_embedding":
            out["model.embed_tokens.weight"] = w
        elif key == "final_norm.w":
            out["model.norm.weight"] = w
        elif key == "lm_head.w":
            out["lm_head.weight"] = w.T
        else:  # layers.{i}.{attn|mlp}.{name}.{w|kernel}, layers.{i}.{norm}.w
            _, i, module, name = key.split(".")[:4]
            hf = f"model.layers.{i}."
            if module == "attn":  # q/k/v [D, N, H] -> [N·H, D]; o [N, H, D] -> [D, N·H]
                w = w.reshape(d, -1).T if name != "o_proj" else w.reshape(-1, d).T
                hf += f"self_attn.{name}.weight"
            elif module == "mlp":  # nnx.Linear kernels are [in, out]; HF's [out, in]
                w, hf = w.T, hf + f"mlp.{name}.weight"
            else:  # input_layernorm / post_attention_layernorm: `name` is the scale
                hf += f"{module}.weight"
            out[hf] = np.ascontiguousarray(w)
    return out


def export(model, cfg, source_dir: str | Path, out_dir: str | Path) -> None:
    """An HF checkpoint directory of `model`: its tensors and the source's config and
    tokenizer files."""
    import shutil

    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if Path(source_dir, name).is_file():
            shutil.copy(Path(source_dir, name), out / name)
    save_file(hf_tensors(model, cfg), str(out / "model.safetensors"),
              metadata={"format": "pt"})


def main(argv: list[str]) -> int:
    import numpy as np

    model_dir, out, ids = argv[0], argv[1], json.loads(argv[2])
    model, cfg = load(model_dir, rope_fix="--no-rope-fix" not in argv)
    np.save(out, logits(model, ids))
    if "--export" in argv:
        export(model, cfg, model_dir, argv[argv.index("--export") + 1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
