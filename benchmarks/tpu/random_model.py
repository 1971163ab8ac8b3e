"""A random-weight HF checkpoint of a published config, written by locojax's own init (no
torch), for the chip's runs: the size is what they measure, not what the model knows.

    python -m benchmarks.tpu.random_model CONFIG.json OUT_DIR [--tokenizer tiny|DIR]
        [--dtype float32|bfloat16] [--tiny] [--vocab V]     # dtype: default the config's

--tiny cuts the config to 2 layers at d 64 (a CPU dry run of the same command), keeping the
vocabulary unless --vocab is given; --tokenizer is copied beside the weights (`tiny`: the
char tokenizer named in locojax.json).
"""

from __future__ import annotations

import argparse
import json
import time

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def write(config_path: str, out_dir: str, tokenizer: str = "tiny", dtype: str | None = None,
          tiny: bool = False, vocab: int | None = None, made_by: str = "") -> str:
    import jax

    from locojax.model import hf_config, loader, params

    with open(config_path) as f:
        fields = json.load(f)
    if tiny:
        fields = {**fields, **TINY}
    if vocab:
        fields["vocab_size"] = vocab
    cfg = (hf_config.config_from_dict(fields, param_dtype=dtype) if dtype
           else hf_config.config_from_dict(fields))  # the config's own dtype
    t0 = time.perf_counter()
    weights = jax.jit(lambda k: params.init(cfg, k))(jax.random.key(0))
    loader.save(out_dir, cfg, weights, tokenizer,
                {"made_by": made_by or f"benchmarks/tpu/random_model.py: {config_path}"},
                dtype=dtype)
    print(f"wrote {out_dir}: {cfg.num_params() / 1e6:.1f}M params ({cfg.param_dtype}) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default="tiny")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the config's")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--made-by", default="")
    a = ap.parse_args()
    write(a.config, a.out, a.tokenizer, a.dtype, a.tiny, a.vocab, a.made_by)


if __name__ == "__main__":
    main()
