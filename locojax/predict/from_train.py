"""The prediction context of a `locojax train` command line: one builder, used by
`locojax predict train ...` and by benchmarks/validate_predict.py, so that what is validated
on this machine is what the command prints.

The run config is parsed by `locojax train`'s own parser (`locojax.train.config.PRESETS`
through tyro), the only import of locojax.train here; fields are read by attribute.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from locojax.predict import hardware, layout, presets, spec, train_fields
from locojax.predict.origin import Const
from locojax.predict.phases import Ctx


@dataclasses.dataclass
class TrainRun:
    cfg: object  # locojax.train.config.RunConfig
    ctx: Ctx
    source: str  # where the model config was read
    explicit_mode: bool  # --mode was given on the command line
    given: "layout.Given"  # the layout the command fixes (--rollout.tp, --train.mesh, ...)


def default_hosts(cfg) -> int:
    """Hosts of the run on this machine: the Ray modes' --hosts (the controller's too),
    single's devices, else 1 (colocated's hosts are `locojax launch --hosts`, which `train`
    does not see)."""
    if cfg.mode in ("controller", "disaggregated", "async"):
        return int(getattr(getattr(cfg, "placement", None), "hosts", 4))
    if cfg.mode == "single":
        return max(1, int(getattr(cfg, "devices_per_host", 0) or 1))
    return 1


def parse(argv: list[str], cluster: str = "", hardware_file: str = "", lengths_from: str = "",
          chars_per_token: float = 0.0, kv_read: str = "static") -> TrainRun:
    """The run `locojax train ARGV` would make, as a prediction context; every train field
    is honoured or refused by name (`train_fields.py`)."""
    import tyro

    from locojax.train.config import COMPUTE_DTYPES, PRESETS

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv, prog="locojax predict train")
    train_fields.check(cfg)
    if cfg.task.data and not Path(cfg.task.data).exists():
        raise FileNotFoundError(f"--task.data {cfg.task.data!r}: no such file or directory")
    if cfg.rollout.max_prompt_tokens == "auto":  # P as `train` sizes it, from the data
        from locojax.train.build import sized

        try:
            cfg = sized(cfg)[0]
        except (ValueError, FileNotFoundError, OSError) as e:
            raise ValueError(f"--rollout.max-prompt-tokens auto (the default) sizes the "
                             f"prompts with the run's tokenizer and data: {e}; give a "
                             "number") from None
    wl = presets.from_run(cfg, lengths_from, chars_per_token)
    model_cfg, source = spec.load(str(cfg.model))
    if cfg.lora.rank:  # as the builder does (`RunParts.of`): the learner trains adapters
        model_cfg = dataclasses.replace(model_cfg, lora=cfg.lora)
    from locojax.train.meshes import check_tp_model

    check_tp_model(cfg.rollout.tp, model_cfg)
    cl = hardware.parse_cluster(cluster or f"cpu-here-{default_hosts(cfg)}", hardware_file)
    if cfg.device_memory_gb:
        hbm = Const(cfg.device_memory_gb * 1e9, "bytes", "data", "--device-memory-gb")
        cl = hardware.Cluster(dataclasses.replace(cl.hw, hbm_bytes=hbm), cl.chips)
    lease = cfg.placement.prompts_per_lease
    if lease and cfg.rollout.prompts_per_step % lease:
        raise ValueError(f"--prompts-per-lease {lease} does not divide "
                         f"--rollout.prompts-per-step {cfg.rollout.prompts_per_step}")
    dtype = COMPUTE_DTYPES[cfg.precision]
    ctx = Ctx(model_cfg, str(cfg.model), wl, cl, dtype=dtype, kv_read=kv_read,
              remat=cfg.remat == "on", env_workers=cfg.multi_turn.env_workers,
              tp=cfg.rollout.tp if cfg.rollout.tp > 1 else 0,
              cache_dtype=COMPUTE_DTYPES[cfg.rollout.cache_dtype] if cfg.rollout.cache_dtype
              else "", epochs=cfg.algo.ppo_epochs, minibatches=cfg.algo.num_minibatches,
              lease_prompts=lease, decode_chunk=cfg.controller.decode_chunk,
              tensorboard=cfg.tensorboard, offload=cfg.offload != "off")
    given = layout.Given.of(cfg, cl)
    explicit = any(a == "--mode" or a.startswith("--mode=") for a in argv)
    return TrainRun(cfg, ctx, source, explicit, given)
