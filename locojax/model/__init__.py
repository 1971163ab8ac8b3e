"""The model: every family as plain pytrees and one pure forward.

    families.py       each family (Qwen3, Qwen2/2.5, Llama 3.x, Gemma 3 text), declared once
    config.py         `ModelConfig` and the benchmark presets
    params.py         every weight declared once: shape, dtype, logical axes, init
    decoder.py        the forward of every family
    accumulating_scan.py  the layer scan whose backward sums weight gradients in place
    attention.py      the KV cache and attention over it
    decode_kernel.py  a decode step's attention over the cache as one Pallas kernel (TPU)
    invariant.py      batch-invariant kernels: fixed-order sums, tiled matmuls, attention
    invariant_jit.py  `model_jit`: a model's programs compiled with the options its config needs
    sharding.py       logical axes to mesh axes, one rules table per role
    hf_config.py      HF `config.json` to `ModelConfig` and back
    hf_io.py          HF checkpoints (safetensors) to weights and back
    loader.py         a model spec string to (config, weights, tokenizer); start here
    gguf_convert.py   a GGUF file to an HF checkpoint (`locojax convert`)
    lora.py           LoRA adapters on a frozen base: declared once, viewed, merged
    lora_io.py        adapters in PEFT's format (`adapter_model.safetensors`) and back
"""
