"""Resume checks what it resumes (docs/design.md, "Resume resumes the same run").

Every checkpoint's JSON records the run's config, and `fingerprints` of what the run read:
the model directory (its starting weights, which are also the KL reference), the data files
and the tokenizer's vocabulary. Resuming (`--checkpoint.resume`, the default):

- `check(cfg)`, before any work (`loop.start`; the Ray driver before any actor starts):
  the newest readable checkpoint's config against the run's. `MAY_CHANGE` lists the fields a
  resumed run may change, each with the reason it cannot change what is trained; any other
  field that differs is refused by name, and so is a fingerprint that differs (the model,
  data and test data are compared by content, so a moved file is the same file).
  `--checkpoint.resume-force` resumes anyway and logs each difference.
- `restore(...)`: the newest committed checkpoint that restores. One that does not (damaged
  files) is set aside as `<step>.unrestorable`, with a warning, and the previous one is
  tried. With forced differences, a restore that fails names them instead of Orbax's error.
- `export_if_missing(...)`: a run resumed at its last step whose exported model is missing
  or incomplete (the run was killed while exporting) exports it again.

Hashing reads every byte of the model's files and data once per process (sha256, about
1-2 GB/s): seconds for the few-billion-parameter models this project is for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from locojax.checkpoint import Checkpointer
from locojax.model import loader
from locojax.tokenizer import fingerprint

log = logging.getLogger(__name__)

_LOGGING = "what is logged, traced or shown, not what is computed"
_MEMORY = ("memory and speed knobs: the objective does not depend on them (docs/design.md), so "
           "the run goes on with the same objective, equal to f32 rounding rather than bitwise")
_HOW = "how the work is executed, not what is computed"
_CLUSTER = "how the Ray cluster runs the work, not what it computes"

MAY_CHANGE: dict[str, str] = {
    "steps": "how far the run goes",
    "time_limit_s": "when the run stops",
    "run_dir": "where the run directory is",
    "progress": _LOGGING, "tensorboard": _LOGGING, "profile_dir": _LOGGING,
    "probe_allreduce": _LOGGING, "dump_rollouts": _LOGGING, "plan_only": _LOGGING,
    "eval": "held-out evaluation reads the params and never changes them",
    "checkpoint": "when checkpoints are written and kept, and resume itself",
    "device_memory_gb": _MEMORY, "grad_accum": _MEMORY, "remat": _MEMORY,
    "logprob_chunk": _MEMORY, "profile_split": _MEMORY, "train.mesh": _MEMORY,
    "rollout.tp": _MEMORY,
    "controller.decode_chunk": _HOW,
    "reward.workers": _HOW, "reward.load_timeout_s": _HOW, "multi_turn.env_workers": _HOW,
    "task.sandbox": "how model-written code is isolated, not what it is scored on",
    "placement.ray_address": _CLUSTER, "placement.ray_cpus": _CLUSTER,
    "placement.lease_timeout_s": _CLUSTER, "placement.verifiers": _CLUSTER,
    "placement.max_attempts": _CLUSTER, "placement.stall_warning_s": _CLUSTER,
    "placement.verifier_timeout_s": _CLUSTER, "placement.start_timeout_s": _CLUSTER,
}
"""Config fields (dotted; a section name covers its fields) a resumed run may change."""

BY_CONTENT = {"model": "model", "task.data": "task.data", "task.test_data": "task.test_data"}
"""Config fields that name inputs: compared by their fingerprints (content), not by path."""

MODEL_FILES = (*loader.MODEL_FILES, "*.safetensors")
"""The files of a model directory that a run reads (so other files there do not count)."""


def may_change(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in MAY_CHANGE)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def as_json(cfg) -> dict:
    """The config as the checkpoint stores it (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def differences(saved: dict, cfg) -> list[str]:
    """Fields of `cfg` that differ from the `saved` config and may not change on resume. A
    field the checkpoint does not have (it predates the field) counts only if the run sets it
    to something other than its default."""
    now, before = flatten(as_json(cfg)), flatten(saved)
    default = flatten(as_json(type(cfg)()))
    out = []
    for name, value in now.items():
        if may_change(name) or name in BY_CONTENT:
            continue
        if before.get(name, default.get(name)) != value:
            out.append(name)
    return out


# --- fingerprints --------------------------------------------------------------------------


def fingerprint_path(path: str | Path, patterns: tuple[str, ...] = ("*",)) -> str:
    """sha256 (hex) of a file's bytes, or of a directory's files matching `patterns` (names
    relative to it, then bytes, in sorted order)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    files = sorted({p for pattern in patterns for p in path.rglob(pattern) if p.is_file()})
    for p in files:
        with open(p, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        h.update(f"{p.relative_to(path).as_posix()}\0{digest}\n".encode())
    return h.hexdigest()


_CACHE: dict[tuple, dict[str, str]] = {}


def fingerprints(cfg) -> dict[str, str]:
    """{input: fingerprint} of what `cfg` reads: the model (a preset: its name, as its
    weights are a function of the seed, which the config holds), the tokenizer's vocabulary,
    and the task's data files or directories. Computed once per process."""
    key = (cfg.model, cfg.task.data, cfg.task.test_data)
    if key not in _CACHE:
        model_dir = loader.resolve_dir(cfg.model)
        out = {"model": f"preset:{cfg.model}" if model_dir is None
               else fingerprint_path(model_dir, MODEL_FILES),
               "tokenizer": fingerprint(loader.load_tokenizer_of(cfg.model))}
        for name in ("data", "test_data"):
            if getattr(cfg.task, name):
                out[f"task.{name}"] = fingerprint_path(getattr(cfg.task, name))
        _CACHE[key] = out
    return _CACHE[key]


def recorded(cfg) -> dict:
    """What a checkpoint's JSON records for these checks."""
    return {"config": as_json(cfg), "mode": cfg.mode, "fingerprints": fingerprints(cfg)}


def _fingerprint_differences(saved: dict, cfg) -> list[str]:
    """Inputs whose fingerprint differs ('task.data (the data file)'); a checkpoint written
    before fingerprints were recorded has none to compare."""
    if "fingerprints" not in saved:
        return []
    now = fingerprints(cfg)
    what = {"model": "the model directory, also the KL reference", "tokenizer": "its vocabulary",
            "task.data": "the data", "task.test_data": "the held-out data"}
    return [f"{name} ({what[name]})" for name in sorted(set(now) | set(saved["fingerprints"]))
            if now.get(name) != saved["fingerprints"].get(name)]


# --- before any work -----------------------------------------------------------------------


def checkpoint_dir(cfg) -> str:
    return os.path.join(os.path.abspath(cfg.run_dir), "checkpoints")


def has_checkpoints(directory: str) -> bool:
    return os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory))


def check(cfg) -> None:
    """Refuse, before any work, to resume a checkpoint of another run (ValueError naming
    every field and input that differs), or any checkpoint without --checkpoint.resume."""
    directory = checkpoint_dir(cfg)
    if cfg.plan_only or not has_checkpoints(directory):
        return
    if not cfg.checkpoint.resume:
        raise ValueError(f"{directory} holds checkpoints of an earlier run; pass "
                         "--checkpoint.resume to continue it, or choose another --run-dir")
    ckpt = Checkpointer(directory)
    try:
        saved = _newest_meta(ckpt)
    finally:
        ckpt.close()
    if saved is None:
        return  # none is readable: `restore` says so, with each one's error
    step, meta = saved
    fields = differences(meta.get("config", {}), cfg)
    inputs = _fingerprint_differences(meta, cfg)
    if not fields and not inputs:
        return
    what = "; ".join(filter(None, [
        fields and "config fields " + ", ".join(
            f"{f} ({flatten(meta.get('config', {})).get(f, 'absent')!r} -> "
            f"{flatten(as_json(cfg)).get(f)!r})" for f in fields),
        inputs and "inputs " + ", ".join(inputs)]))
    message = f"checkpoint {step} under {directory} is of another run: {what}"
    if cfg.checkpoint.resume_force:
        log.warning("%s; resuming anyway (--checkpoint.resume-force)", message)
        return
    raise ValueError(f"{message}. Only fields listed in locojax/train/resume.py MAY_CHANGE may "
                     "change on resume; pass --checkpoint.resume-force to resume anyway, or "
                     "choose another --run-dir")


def _newest_meta(ckpt: Checkpointer) -> tuple[int, dict] | None:
    for step in sorted(ckpt.all_steps(), reverse=True):
        try:
            return step, ckpt.read_meta(step)
        except Exception as e:  # noqa: BLE001 - damaged: `restore` falls back past it
            log.warning("checkpoint %d: its JSON cannot be read (%s: %s)", step,
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    return None


# --- restore -------------------------------------------------------------------------------


@dataclasses.dataclass
class Resumed:
    step: int  # the next step to train
    state: Any
    meta: dict
    rollout: dict | None  # the rollout source's arrays (Ray modes), if any


def restore(cfg, ckpt: Checkpointer, like, is_main: bool) -> Resumed | None:
    """The newest committed checkpoint that restores into `like`'s structure; None if there
    is none. Damaged ones are set aside (by the main host) and the previous one tried."""
    failed = []
    for step in sorted(ckpt.all_steps(), reverse=True):
        try:
            state, meta = ckpt.restore(step, like)
            rollout = ckpt.restore_rollout(step)
        except Exception as e:  # noqa: BLE001 - damaged files, or another run's arrays
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            _refuse_if_forced(cfg, ckpt, step, reason)
            failed.append(step)
            where = ckpt.set_aside(step) if is_main else "(set aside by host 0)"
            log.warning("checkpoint %d cannot be restored (%s); moved to %s, trying the "
                        "previous one", step, reason, where)
            continue
        if failed:
            log.warning("resumed from checkpoint %d: the newer checkpoint(s) %s could not be "
                        "restored", step, failed)
        return Resumed(int(meta["next_step"]), state, meta, rollout)
    if failed:
        raise RuntimeError(f"no checkpoint under {ckpt.directory} can be restored (tried "
                           f"{failed}; each was set aside, with the warning above)")
    return None


def _refuse_if_forced(cfg, ckpt: Checkpointer, step: int, reason: str) -> None:
    """A forced resume past config differences whose arrays do not fit: name the fields."""
    if not cfg.checkpoint.resume_force:
        return
    try:
        fields = differences(ckpt.read_meta(step).get("config", {}), cfg)
    except Exception:  # noqa: BLE001 - its JSON is damaged too: a damaged checkpoint
        return
    if fields:
        raise ValueError(f"checkpoint {step} under {ckpt.directory} does not fit this run "
                         f"(--checkpoint.resume-force went past differences in "
                         f"{', '.join(fields)}): {reason}")


def export_if_missing(path: str, cfg, model_cfg, params, step: int) -> None:
    """Export `params` as `path` unless a whole export of step `step` is already there."""
    if loader.is_complete(path) and loader.read_meta(path).get("steps") == step:
        return
    log.warning("%s is missing or incomplete (the run was killed while exporting?): "
                "exporting step %d again", path, step)
    loader.save(path, model_cfg, params, cfg.model, {"made_by": "locojax train", "steps": step})
