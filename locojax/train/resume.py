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
- `restore(...)`: the newest committed checkpoint that restores. One with a deterministic
  defect (its data fails to decode, its structure does not match, a file is missing) is set
  aside as `<step>.unrestorable`, with a warning, and the previous one is tried. An I/O
  error (`is_io_error`: EIO, a stale NFS handle, a timeout) says nothing about the
  checkpoint: the read is retried `IO_ATTEMPTS` times, then the run stops naming the file,
  and nothing is set aside (one transient error used to rename both good checkpoints, and
  the next start trained from step 0). With forced differences, a restore that fails names
  them instead of Orbax's error.
- A run dir holding set-aside checkpoints and none that restores is refused (`check`, and
  `restore`), saying what to do: it never starts again from step 0 on its own.
- `export_if_missing(...)`: a run resumed at its last step whose exported model is missing
  or incomplete (the run was killed while exporting) exports it again.

Hashing reads every byte of the model's files and data once per process (sha256, about
1-2 GB/s): seconds for the few-billion-parameter models this project is for.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from locojax.checkpoint import SET_ASIDE, Checkpointer, set_aside_names
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
    "progress": _LOGGING, "tensorboard": _LOGGING, "report_to": _LOGGING,
    "profile_dir": _LOGGING,
    "probe_allreduce": _LOGGING, "dump_rollouts": _LOGGING, "plan_only": _LOGGING,
    "eval": "held-out evaluation reads the params and never changes them",
    "checkpoint": "when checkpoints are written and kept, and resume itself",
    "device_memory_gb": _MEMORY, "grad_accum": _MEMORY, "remat": _MEMORY, "offload": _MEMORY,
    "logprob_chunk": _MEMORY, "profile_split": _MEMORY, "train.mesh": _MEMORY,
    "rollout.tp": _MEMORY, "rollout.waves": _MEMORY,
    "controller.decode_chunk": _HOW,
    "reward.workers": _HOW, "reward.load_timeout_s": _HOW, "multi_turn.env_workers": _HOW,
    "task.sandbox": "how model-written code is isolated, not what it is scored on",
    "placement.ray_address": _CLUSTER, "placement.ray_cpus": _CLUSTER,
    "placement.lease_timeout_s": _CLUSTER, "placement.verifiers": _CLUSTER,
    "placement.max_attempts": _CLUSTER, "placement.stall_warning_s": _CLUSTER,
    "placement.verifier_timeout_s": _CLUSTER, "placement.start_timeout_s": _CLUSTER,
}
"""Config fields (dotted; a section name covers its fields) a resumed run may change. Not
`task.reward` nor its weights: they are what the run is trained on; they are compared in
one spelling (`_canonical`), so a checkpoint that recorded the reward as one string still
resumes."""

BY_CONTENT = {"model": "model", "task.data": "task.data", "task.test_data": "task.test_data"}
"""Config fields that name inputs: compared by their fingerprints (content), not by path."""

MODEL_FILES = (*loader.MODEL_FILES, "*.safetensors")
"""The files of a model directory that a run reads (so other files there do not count)."""


RESOLVED = {"rollout.max_prompt_tokens": "auto"}
"""Field -> a value that a run resolves at start-up from inputs the fingerprints cover,
so they match any value the checkpoint recorded: auto's P is the longest prompt of the data,
tokenized (`data_lengths.fit`); a checkpoint holds the resolved number. (A run that had an
explicit P and resumes with auto may get another P: padding only, as rows over P were
refused, unless --task.skip-invalid skipped them.)"""


def _rewards(value) -> list:
    """`task.reward` as one list: a checkpoint written while it was one string (before
    several `module:function` rewards) recorded "strict" or "flexible"; "strict" alone is
    the default a run with no --task.reward gets, so it is the empty list."""
    value = [value] if isinstance(value, str) else list(value or [])
    return [] if value == ["strict"] else value


def _weights(rewards, value) -> list[float]:
    """`task.reward_weights`: none given means 1 for each `module:function` reward."""
    users = [r for r in _rewards(rewards) if ":" in r]
    return [float(w) for w in value] if value else [1.0] * len(users)


def _canonical(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat config with each field that has several spellings of one value in one
    spelling: `task.reward` and its weights, the fields a user's rewards came in with."""
    out = dict(flat)
    if "task.reward" in out:
        out["task.reward"] = _rewards(out["task.reward"])
    if "task.reward_weights" in out:
        out["task.reward_weights"] = _weights(flat.get("task.reward"),
                                              out["task.reward_weights"])
    return out


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
    now, before = _canonical(flatten(as_json(cfg))), _canonical(flatten(saved))
    default = _canonical(flatten(as_json(type(cfg)())))
    out = []
    for name, value in now.items():
        if may_change(name) or name in BY_CONTENT or RESOLVED.get(name, ()) == value:
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


def refuse_fresh_start(directory: str, tried: list[int] = ()) -> None:
    """Raise (RuntimeError) if `directory` holds set-aside checkpoints: with none that
    restores, the run would start again from step 0 and rewrite the run's logs."""
    aside = set_aside_names(directory)
    if not aside and not tried:
        return
    what = f"tried {list(tried)}, each set aside with the warning above; " if tried else ""
    raise RuntimeError(
        f"no checkpoint under {directory} can be restored ({what}set aside: "
        f"{', '.join(aside)}), and starting again from step 0 would lose the run. If a "
        f"checkpoint was set aside by a passing fault (a disk or network error), rename "
        f"<step>{SET_ASIDE} back to <step> to try it again; to start over, move {directory} "
        "away or choose another --run-dir")


def check(cfg) -> None:
    """Refuse, before any work, to resume a checkpoint of another run (ValueError naming
    every field and input that differs), or any checkpoint without --checkpoint.resume, or
    a fresh start over checkpoints set aside (`refuse_fresh_start`)."""
    directory = checkpoint_dir(cfg)
    if cfg.plan_only:
        return
    if not has_checkpoints(directory):
        refuse_fresh_start(directory)
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


IO_ATTEMPTS = 3
"""Reads of a checkpoint that fail with an I/O error before the run stops."""
IO_RETRY_DELAY_S = 2.0
"""Wait before the first retry; doubled before each next one."""

_NOT_FOUND = (FileNotFoundError, NotADirectoryError, IsADirectoryError)  # structure, not I/O
# Status codes tensorstore (Orbax's array I/O) gives an OS error (absl's ErrnoToStatusCode:
# EIO, EAGAIN, ESTALE -> UNAVAILABLE; EACCES -> PERMISSION_DENIED; ENOSPC ->
# RESOURCE_EXHAUSTED; ETIMEDOUT -> DEADLINE_EXCEEDED). Damaged data decodes to OUT_OF_RANGE,
# DATA_LOSS, INVALID_ARGUMENT, FAILED_PRECONDITION or NOT_FOUND: deterministic.
_IO_STATUS = re.compile(r"\b(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|"
                        r"PERMISSION_DENIED|CANCELLED):")
_FILE = re.compile(r'(?:local )?file "([^"]+)"')


class CheckpointIOError(RuntimeError):
    """Reading a checkpoint kept failing with an I/O error: the run stops, nothing set aside."""


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_io_error(e: BaseException) -> bool:
    """Whether a failed read says nothing about the checkpoint itself (retry it; never set
    it aside): an OSError other than a missing file, or tensorstore's status for one."""
    for x in _chain(e):
        if isinstance(x, OSError) and not isinstance(x, _NOT_FOUND) \
                and x.errno != errno.ENOENT:
            return True
        if _IO_STATUS.search(str(x)):
            return True
    return False


def failed_file(e: BaseException, fallback: str) -> str:
    """The file a failed read names (an OSError's filename, tensorstore's `file "..."`)."""
    for x in _chain(e):
        if isinstance(x, OSError) and x.filename:
            return os.fspath(x.filename)
    for x in _chain(e):
        if m := _FILE.findall(str(x)):
            return m[-1]
    return fallback


def _read(ckpt: Checkpointer, step: int, like):
    """(state, meta, rollout) of checkpoint `step`, retrying I/O errors; past the last
    attempt, a RuntimeError naming the file stops the run."""
    delay = IO_RETRY_DELAY_S
    for attempt in range(1, IO_ATTEMPTS + 1):
        try:
            state, meta = ckpt.restore(step, like)
            return state, meta, ckpt.restore_rollout(step)
        except Exception as e:  # noqa: BLE001 - sorted below: I/O, or a defect
            if not is_io_error(e):
                raise
            where = failed_file(e, os.path.join(ckpt.directory, str(step)))
            first = str(e).splitlines()[0] if str(e) else ""
            if attempt == IO_ATTEMPTS:
                raise CheckpointIOError(
                    f"checkpoint {step}: reading {where} failed {IO_ATTEMPTS} times with an "
                    f"I/O error ({type(e).__name__}: {first[:300]}). Not set aside: the "
                    "checkpoint may be whole. Fix the storage and start the run again") from e
            log.warning("checkpoint %d: I/O error reading %s (%s: %s); retrying in %.0f s "
                        "(attempt %d of %d)", step, where, type(e).__name__, first[:200],
                        delay, attempt + 1, IO_ATTEMPTS)
            time.sleep(delay)
            delay *= 2


def restore(cfg, ckpt: Checkpointer, like, is_main: bool) -> Resumed | None:
    """The newest committed checkpoint that restores into `like`'s structure; None if there
    is none and none was set aside. A defective one is set aside (by the main host) and the
    previous one tried; an I/O error is retried, then stops the run (`_read`)."""
    failed = []
    for step in sorted(ckpt.all_steps(), reverse=True):
        try:
            state, meta, rollout = _read(ckpt, step, like)
        except CheckpointIOError:  # retried and failed: stop, setting nothing aside
            raise
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
    refuse_fresh_start(ckpt.directory, failed)
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
