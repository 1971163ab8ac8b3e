"""Run checkpoints: everything a run needs to continue bitwise (docs/design.md, exact continuation).

A checkpoint holds two items, and a third where a mode has one:
- `state`: the array pytree (params, optimizer state, step counter, PRNG key data), written
  by Orbax shard by shard from every host;
- `meta`: JSON (data cursor, config, run id, anything else plain);
- `rollout`: host-side numpy arrays of the asynchronous modes' rollout buffer and the weight
  versions it still needs (`restore_rollout`); their JSON half lives in `meta`.

Atomicity comes from Orbax: a step is written under a temporary name and renamed only once
complete, and `latest_step` never returns an uncommitted step, so a crash mid-save leaves the
previous checkpoint as the one that loads. The last `keep` steps are kept. A committed step
whose files were damaged afterwards is moved out of the way by `set_aside` (to
`<step>.unrestorable`, which Orbax does not list), so the run can fall back to the previous
one and later write that step again (`train/resume.py`, which sets aside only a checkpoint
with a deterministic defect, never one that met an I/O error).

PRNG keys are stored as raw key data (`jax.random.key_data`) so that restore does not depend
on Orbax's typed-key support; callers wrap them back with `jax.random.wrap_key_data`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


SET_ASIDE = ".unrestorable"
"""Suffix of a checkpoint moved out of the way by `Checkpointer.set_aside`."""


def set_aside_names(directory: str) -> list[str]:
    """The checkpoints set aside under `directory` (`<step>.unrestorable[-n]`), sorted."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if SET_ASIDE in n)


class Checkpointer:
    """Save / restore run state under `directory/<step>/`, keeping the newest `keep`."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = False):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        self._manager.reload()
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict, rollout: dict | None = None) -> None:
        """Write `state` (arrays), `meta` (JSON) and, if given, `rollout` (a non-empty tree of
        numpy arrays) as checkpoint `step`; blocks unless async."""
        self._manager.reload()  # a step another host set aside may be written again
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if rollout:
            items["rollout"] = ocp.args.StandardSave(rollout)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def wait(self) -> None:
        """Block until an async save has committed."""
        self._manager.wait_until_finished()

    def restore(self, step: int | None, like: Any) -> tuple[Any, dict]:
        """Restore into the structure, shapes, dtypes and shardings of `like` (arrays or
        ShapeDtypeStructs with `.sharding`). `step=None` takes the latest committed one."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no committed checkpoint under {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], dict(restored["meta"])

    def read_meta(self, step: int) -> dict:
        """The JSON saved with checkpoint `step`, without reading any array."""
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def set_aside(self, step: int) -> str:
        """Move committed checkpoint `step` to `<step>.unrestorable` (kept for inspection, no
        longer listed); returns its new path."""
        self.wait()
        src = os.path.join(self.directory, str(step))
        dst, n = f"{src}{SET_ASIDE}", 1
        while os.path.exists(dst):
            dst, n = f"{src}{SET_ASIDE}-{n}", n + 1
        os.rename(src, dst)
        self._manager.reload()
        return dst

    def restore_rollout(self, step: int) -> dict | None:
        """The `rollout` arrays saved with checkpoint `step` (numpy), or None if it has none."""
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(rollout=ocp.args.StandardRestore()))
        except KeyError:  # saved without one (single, colocated)
            return None
        return restored["rollout"]

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
