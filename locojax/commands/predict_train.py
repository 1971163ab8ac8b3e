"""`locojax predict train ARGS`: the prediction context of a `locojax train` command line.
One builder, used by the command and by the benchmarks that validate it
(benchmarks/validate_heldout.py, validate_predict.py, predict_programs.py), so that what is
validated on this machine is what the command prints.

The run config is parsed by `locojax train`'s own parser (`locojax.train.config.PRESETS`
through tyro); fields are read by attribute, so that a refactored config with the same
fields still reads. Every field is honoured, refused by name or declared irrelevant
(`predict_fields.py`). From the config come the cost model's three inputs (locojax/predict):
the model (`spec.load`), the workload (`workload_of`: B, G, P, N, the task, β and the
turns; the completion lengths from `--rollout.ignore-eos` (exactly N), a rollout dump or
data file (`--lengths-from`), the task's data file (reference solutions) or, failing all,
the cap N, stated as such) and the cluster, with the layout the command fixes (`given_of`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
from pathlib import Path

import numpy as np

from locojax.commands import predict_fields
from locojax.predict import hardware, layout, spec
from locojax.predict.origin import Const
from locojax.predict.phases import Ctx
from locojax.predict.workload import Lengths, Workload

CHARS_PER_TOKEN = 4.0  # English BPE text (assumed; the char tokenizer's is 1)


@dataclasses.dataclass
class TrainRun:
    cfg: object  # locojax.train.config.RunConfig
    ctx: Ctx
    source: str  # where the model config was read
    explicit_mode: bool  # --mode was given on the command line
    given: layout.Given  # the layout the command fixes (--rollout.tp, --train.mesh, ...)


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
    is honoured or refused by name (`predict_fields.py`)."""
    import tyro

    from locojax.train.config import COMPUTE_DTYPES, PRESETS

    cfg = tyro.extras.overridable_config_cli(PRESETS, args=argv, prog="locojax predict train")
    predict_fields.check(cfg)
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
    wl = workload_of(cfg, lengths_from, chars_per_token)
    model_cfg, source = spec.load(str(cfg.model))
    if cfg.lora.rank:  # as the builder does (`RunParts.of`): the learner trains adapters
        model_cfg = dataclasses.replace(model_cfg, lora=cfg.lora)
    from locojax.train.meshes import check_tp_model

    check_tp_model(cfg.rollout.tp, model_cfg)
    cl = hardware.parse_cluster(cluster or f"{hardware.default()}-{default_hosts(cfg)}",
                                hardware_file)
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
    given = given_of(cfg, cl)
    explicit = any(a == "--mode" or a.startswith("--mode=") for a in argv)
    return TrainRun(cfg, ctx, source, explicit, given)


def given_of(cfg, cluster: hardware.Cluster) -> layout.Given:
    """What the run config fixes of the layout: `--rollout.tp`, `--train.mesh`, `--remat
    on|off`, `--grad-accum`."""
    from locojax.train.meshes import parse_mesh

    mesh = parse_mesh(cfg.train.mesh)
    remat = {"on": True, "off": False}.get(cfg.remat)
    tp = cfg.rollout.tp if cfg.rollout.tp > 1 else 0
    # cpu-here's "hosts" are simulated devices of this machine: --mode single drives
    # them from one process, so its tp may span them.
    per_host = cluster.chips if cluster.shared_cores else cluster.chips_per_host
    if tp and tp > min(cluster.chips, per_host):
        raise ValueError(f"--rollout.tp {tp}: rollout stays inside a host, and a host of "
                         f"{cluster.describe()} has {cluster.chips_per_host} chips")
    if mesh and cfg.mode not in ("disaggregated", "async"):
        cfg.train.shape(cluster.chips)  # train's own refusal: D x F must be the chips
    return layout.Given(tp, mesh.get("fsdp", 0), mesh.get("data", 0), remat, cfg.grad_accum)


def workload_of(cfg, lengths_from: str = "", chars_per_token: float = 0.0) -> Workload:
    """The workload of a `locojax train` RunConfig (see the module docstring)."""
    ro, algo, task = cfg.rollout, cfg.algo, cfg.task
    n, p = ro.max_new_tokens, ro.max_prompt_tokens
    multi = getattr(cfg, "multi_turn", None)
    turns = getattr(multi, "max_turns", 1) if task.name in ("swe", "calc") else 1
    obs = getattr(multi, "max_obs_tokens", 0) if turns > 1 else 0
    trajectory = getattr(multi, "max_trajectory_tokens", 0) if turns > 1 else 0
    cpt = chars_per_token or (1.0 if str(cfg.model).startswith(("embedded", "tiny", "small"))
                              else CHARS_PER_TOKEN)
    if ro.ignore_eos:
        lengths = Lengths.fixed(n, "--rollout.ignore-eos: every completion is exactly N")
    elif lengths_from and Path(lengths_from).is_dir():
        lengths = from_rollout_dump(lengths_from, n)
    elif lengths_from:
        lengths = from_data_file(lengths_from, cpt, n)
    elif getattr(task, "data", "") and Path(task.data).is_file():
        lengths = from_data_file(task.data, cpt, n)
    else:
        lengths = Lengths.fixed(n, "assumed: every completion runs to the cap N (pass "
                                   "--lengths-from RUN_DIR or a data file for a distribution)")
    return Workload(f"train {task.name}", ro.prompts_per_step, algo.group_size, p, n, lengths,
                    task=task.name, beta=float(algo.beta), turns=max(1, turns),
                    obs_tokens=obs, trajectory=trajectory, source=lengths.source)


def from_data_file(path: str, chars_per_token: float, max_new: int) -> Lengths:
    """Completion lengths in tokens from a jsonl of problems: each reference solution
    (`answer`/`solution`) in characters over `chars_per_token`, capped at N. They are the
    dataset's references, not a policy's: the source says so."""
    lengths = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            lengths.append(len(d.get("solution") or d.get("answer") or "") / chars_per_token)
    src = (f"{path}: lengths in characters / {chars_per_token:g} characters per token "
           "(reference solutions)")
    return Lengths.from_samples(lengths, src, cap=max_new)


def from_rollout_dump(run_dir: str, max_new: int) -> Lengths:
    """Completion lengths of every row a run dumped (`--dump-rollouts`)."""
    files = sorted(glob.glob(str(Path(run_dir) / "rollouts" / "*.npz")))
    if not files:
        raise ValueError(f"no rollout dump in {run_dir}/rollouts (run with --dump-rollouts)")
    lengths = np.concatenate([np.load(f)["mask"].sum(axis=1) for f in files])
    return Lengths.from_samples(lengths, f"{run_dir}/rollouts ({len(files)} files, "
                                f"{lengths.size} rows)", cap=max_new)
