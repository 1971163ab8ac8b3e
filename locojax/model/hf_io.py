"""HF checkpoints (safetensors + config.json) of every family ↔ locojax weights.

Everything is driven by the declarations in `params.py`: each `WeightDecl` names its HF
tensor(s) and the exact layout conversion, so this file never lists a weight by hand.

- `from_state_dict` / `to_state_dict`: in-memory conversion of HF-named numpy tensors.
- `load_weights` / `load_model`: read `model.safetensors` or shards listed in
  `model.safetensors.index.json`, validate every name and shape against the declarations
  before reading any data, and build each array with `jax.make_array_from_callback`, so a
  device only ever receives its own shard and the host holds one layer of one tensor (plus
  the shard being handed over) at a time, never a second full copy of the model.
- `save_weights`: the inverse, sharded like `save_pretrained` above `max_shard_bytes`, in
  the checkpoint dtype, plus config.json. Saving is deterministic, so save → load → save
  reproduces the files bit for bit.

Reference: HF transformers `modeling_utils.save_pretrained` / `load_state_dict` (file and
index naming, `{"format": "pt"}` metadata, tied checkpoints omit `lm_head.weight`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from locojax.model.config import ModelConfig
from locojax.jsonfile import read_object
from locojax.model.hf_config import load_config, save_config
from locojax.model.params import WeightDecl, Weights, declare, is_decl

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32", "BF16", "F16"}
_TIED_HEAD = "lm_head.weight"


def _hf_names(w: WeightDecl, cfg: ModelConfig) -> list[str]:
    if w.stacked:
        return [w.hf_name.format(i=i) for i in range(cfg.num_hidden_layers)]
    return [w.hf_name]


def _layer_shape(w: WeightDecl) -> tuple[int, ...]:
    return w.shape[1:] if w.stacked else w.shape


def _hf_shape(w: WeightDecl) -> tuple[int, ...]:
    """Shape of one HF tensor of `w`, derived from `to_hf` without touching data."""
    return tuple(jax.eval_shape(w.to_hf, jax.ShapeDtypeStruct(_layer_shape(w), jnp.float32)).shape)


def from_state_dict(state: dict[str, np.ndarray], cfg: ModelConfig) -> Weights:
    """Weights from an HF state dict of numpy arrays (e.g. `{k: v.numpy() for k, v in sd}`)."""

    def one(w: WeightDecl):
        parts = [w.from_hf(np.asarray(state[name])) for name in _hf_names(w, cfg)]
        arr = np.stack(parts) if w.stacked else parts[0]
        return jnp.asarray(arr, cfg.weight_dtype)

    return jax.tree.map(one, declare(cfg), is_leaf=is_decl)


def to_state_dict(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named numpy tensors from weights (the inverse of `from_state_dict`)."""
    out = {}
    decls = jax.tree.leaves(declare(cfg), is_leaf=is_decl)
    for w, arr in zip(decls, jax.tree.leaves(weights)):
        arr = np.asarray(arr)
        for i, name in enumerate(_hf_names(w, cfg)):
            out[name] = np.ascontiguousarray(w.to_hf(arr[i] if w.stacked else arr))
    return out


class Checkpoint(contextlib.AbstractContextManager):
    """The tensors of one safetensors checkpoint: which file holds each, with its shape and
    dtype read from the file headers. Data is read only by `read`, one tensor at a time."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir)
        self._handles: dict[Path, object] = {}
        index, single = self.dir / INDEX_FILE, self.dir / SINGLE_FILE
        if index.is_file():
            self.source = index
            weight_map = read_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: no 'weight_map' object")
            files = sorted({self.dir / v for v in weight_map.values()})
        elif single.is_file():
            self.source, weight_map, files = single, None, [single]
        else:
            raise FileNotFoundError(
                f"no {SINGLE_FILE} or {INDEX_FILE} in {self.dir} "
                "(only safetensors checkpoints are supported)")
        self.file: dict[str, Path] = {}
        self.shape: dict[str, tuple[int, ...]] = {}
        self.dtype: dict[str, str] = {}
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"{self.source} lists {path.name}, which does not exist")
            handle = self._open(path)
            for name in handle.keys():
                if name in self.file:
                    raise ValueError(f"tensor {name!r} is in both {self.file[name]} and {path}")
                sl = handle.get_slice(name)
                self.file[name], self.shape[name] = path, tuple(sl.get_shape())
                self.dtype[name] = sl.get_dtype()
        for name, fname in (weight_map or {}).items():
            if self.file.get(name) != self.dir / fname:
                raise ValueError(f"{self.source} maps tensor {name!r} to {fname}, "
                                 f"which does not contain it")

    def _open(self, path: Path):
        if path not in self._handles:
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except Exception as e:  # safetensors raises its own types, without the path
                raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
        return self._handles[path]

    def read(self, name: str) -> np.ndarray:
        """One whole tensor, as stored (HF layout and dtype)."""
        return self._open(self.file[name]).get_tensor(name)

    def close(self):
        self._handles.clear()

    def __exit__(self, *exc):
        self.close()

    def check(self, cfg: ModelConfig):
        """Every declared tensor present with its HF shape and a float dtype; nothing else.

        A tied model accepts a stored `lm_head.weight` equal to the embedding and ignores it
        (some exporters write the tied copy; HF `save_pretrained` omits it)."""
        expected = {}
        for w in jax.tree.leaves(declare(cfg), is_leaf=is_decl):
            shape = _hf_shape(w)
            expected.update((name, shape) for name in _hf_names(w, cfg))
        if cfg.tie_word_embeddings and _TIED_HEAD in self.file:
            expected[_TIED_HEAD] = (cfg.vocab_size, cfg.hidden_size)
        for name, shape in expected.items():
            if name not in self.file:
                raise ValueError(f"missing tensor {name!r} in {self.source}")
            where = f"tensor {name!r} in {self.file[name]}"
            if self.shape[name] != shape:
                raise ValueError(f"{where} has shape {list(self.shape[name])}, "
                                 f"expected {list(shape)}")
            if self.dtype[name] not in _FLOAT_DTYPES:
                raise ValueError(f"{where} has dtype {self.dtype[name]}, expected one of "
                                 f"{sorted(_FLOAT_DTYPES)}")
        for name in sorted(set(self.file) - set(expected)):
            raise ValueError(f"unexpected tensor {name!r} in {self.file[name]}")
        if cfg.tie_word_embeddings and _TIED_HEAD in self.file:
            self._check_tied_copy()

    def _check_tied_copy(self, rows: int = 4096):
        """A stored head must equal the embedding, else the checkpoint is really untied and
        a tied model would silently drop its head. Compared in row blocks, so the host never
        holds both matrices."""
        embed = "model.embed_tokens.weight"
        a = self._open(self.file[_TIED_HEAD]).get_slice(_TIED_HEAD)
        b = self._open(self.file[embed]).get_slice(embed)
        n = self.shape[embed][0]
        for start in range(0, n, rows):
            stop = min(start + rows, n)  # safetensors slices do not clip
            if not np.array_equal(a[start:stop], b[start:stop]):
                raise ValueError(
                    f"unexpected tensor {_TIED_HEAD!r} in {self.file[_TIED_HEAD]}: it differs "
                    f"from {embed!r}, so the checkpoint is untied, but the config says "
                    "tie_word_embeddings=true")


def _index_key(index) -> tuple:
    return tuple((s.start, s.stop, s.step) if isinstance(s, slice) else s for s in index)


def _load_one(ckpt: Checkpoint, w: WeightDecl, names: list[str], sharding, dtype) -> jax.Array:
    """One weight straight into `sharding`: each device's callback reads only the layers
    in its index. Devices asking for the same index (replicas) share one read."""
    last: dict = {}

    def callback(index):
        key = _index_key(index)
        if key not in last:
            if w.stacked:
                layers = range(len(names))[index[0]]
                parts = [np.asarray(w.from_hf(ckpt.read(names[i])))[index[1:]] for i in layers]
                out = np.stack(parts) if parts else np.zeros((0,) + _layer_shape(w), dtype)
            else:
                out = np.asarray(w.from_hf(ckpt.read(names[0])))[index]
            last.clear()  # hold one shard at a time, not every device's
            last[key] = np.ascontiguousarray(out.astype(dtype, copy=False))
        return last[key]

    return jax.make_array_from_callback(w.shape, sharding, callback)


Shardings = Weights  # same tree as the weights, of jax.sharding.Sharding leaves


def load_weights(model_dir: str | Path, cfg: ModelConfig,
                 shardings: Shardings | None = None) -> Weights:
    """Weights of `cfg` from a safetensors checkpoint, cast to `cfg.param_dtype`.

    shardings: a tree like the weights (e.g. `sharding.weight_shardings(cfg, mesh, rules)`);
    default: everything on the first device. Raises ValueError naming the tensor and file
    for a missing, unexpected or wrongly shaped tensor, before reading any data.
    """
    decls, treedef = jax.tree.flatten(declare(cfg), is_leaf=is_decl)
    if shardings is None:
        leaves = [SingleDeviceSharding(jax.devices()[0])] * len(decls)
    else:
        try:
            leaves = treedef.flatten_up_to(shardings)
        except (ValueError, TypeError) as e:
            raise ValueError(f"shardings do not match the weight tree of this config: {e}")
    with Checkpoint(model_dir) as ckpt:
        ckpt.check(cfg)
        arrays = [_load_one(ckpt, w, _hf_names(w, cfg), s, cfg.weight_dtype)
                  for w, s in zip(decls, leaves)]
    return jax.tree.unflatten(treedef, arrays)


def load_model(model_dir: str | Path,
               shardings: Shardings | Callable[[ModelConfig], Shardings] | None = None,
               **overrides) -> tuple[ModelConfig, Weights]:
    """(cfg, weights) from an HF checkpoint directory. `overrides` go to `load_config` (e.g.
    `param_dtype="float32"` to keep an f32 master copy of a bf16 checkpoint). Since the
    config is only known here, `shardings` may be a function of it, e.g.
    `lambda cfg: weight_shardings(cfg, mesh, ROLLOUT_TP)`."""
    cfg = load_config(model_dir, **overrides)
    if callable(shardings):
        shardings = shardings(cfg)
    return cfg, load_weights(model_dir, cfg, shardings)


def _stale_files(model_dir: Path) -> list[Path]:
    return [p for p in (model_dir / SINGLE_FILE, model_dir / INDEX_FILE) if p.exists()] + \
        sorted(model_dir.glob("model-*-of-*.safetensors"))


def save_weights(weights: Weights, cfg: ModelConfig, model_dir: str | Path,
                 dtype: str | None = None, max_shard_bytes: int | None = None,
                 config_extra: dict | None = None) -> Path:
    """Write `weights` as an HF checkpoint: safetensors in `dtype` (default
    `cfg.param_dtype`) and config.json (plus `config_extra` keys, e.g. token ids). Over
    `max_shard_bytes` (default: no limit) the tensors are split, in declaration order, into
    `model-0000i-of-0000n.safetensors` with an index json, as `save_pretrained` does; a
    tensor larger than the limit gets its own shard. Previous checkpoint files in
    `model_dir` are removed first. Returns `model_dir`.

    Host memory: one weight (all its layers) plus one shard at a time.
    """
    model_dir = Path(model_dir)
    dtype = dtype or cfg.param_dtype
    np_dtype = jnp.dtype(dtype)  # bfloat16 is ml_dtypes.bfloat16, which safetensors writes
    decls, treedef = jax.tree.flatten(declare(cfg), is_leaf=is_decl)
    try:
        arrays = treedef.flatten_up_to(weights)
    except (ValueError, TypeError) as e:
        raise ValueError(f"weights do not match the weight tree of this config: {e}")
    for w, arr in zip(decls, arrays):
        if tuple(arr.shape) != w.shape:
            raise ValueError(f"weight for {w.hf_name!r} has shape {tuple(arr.shape)}, "
                             f"expected {w.shape}")
        if isinstance(arr, jax.Array) and not arr.is_fully_addressable:
            raise ValueError(f"weight for {w.hf_name!r} spans processes; gather it first "
                             "(e.g. multihost_utils.process_allgather) and save on one host")

    # Plan the shards from shapes alone, so file names can carry the shard count.
    entries = [(k, i, name)
               for k, w in enumerate(decls) for i, name in enumerate(_hf_names(w, cfg))]
    layer_bytes = [int(np.prod(_hf_shape(w))) * np_dtype.itemsize for w in decls]
    sizes = [layer_bytes[k] for k, _, _ in entries]
    shard_of, cur, used = [], 0, 0
    for size in sizes:
        if max_shard_bytes and used and used + size > max_shard_bytes:
            cur, used = cur + 1, 0
        shard_of.append(cur)
        used += size
    n_shards = cur + 1
    files = [SINGLE_FILE] if n_shards == 1 else [
        f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors" for i in range(n_shards)]

    model_dir.mkdir(parents=True, exist_ok=True)
    for p in _stale_files(model_dir):
        p.unlink()
    weight_map, shard, host, host_k = {}, {}, None, -1
    for j, (k, i, name) in enumerate(entries):
        if k != host_k:  # one device→host transfer per weight
            host, host_k = np.asarray(jax.device_get(arrays[k])), k
        w = decls[k]
        layer = host[i] if w.stacked else host
        shard[name] = np.ascontiguousarray(w.to_hf(layer).astype(np_dtype))
        weight_map[name] = files[shard_of[j]]
        if j + 1 == len(entries) or shard_of[j + 1] != shard_of[j]:
            save_file(shard, str(model_dir / files[shard_of[j]]), metadata={"format": "pt"})
            shard = {}
    if n_shards > 1:
        index = {"metadata": {"total_size": sum(sizes)},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(model_dir / INDEX_FILE, "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    save_config(cfg, model_dir, dtype, **(config_extra or {}))
    return model_dir
