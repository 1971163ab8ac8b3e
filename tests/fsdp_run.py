"""The FSDP reference run: the demo from the shipped `embedded` checkpoint (loose format: its
rewards vary within groups from the first step, so the params move and a comparison is not
vacuous), 2 steps of 8 prompts x 4 samples, with `--train.mesh data=1,fsdp=2`, as 2
colocated hosts x 1 device: the fsdp axis spans the hosts. Single (tests/test_train_mesh.py),
the controller mode and async with k = 0 (tests/test_ray_modes.py) must reproduce it."""

import os

import numpy as np

FSDP_STEPS = 2
FSDP_ARGS = ("--model", "embedded", "--rollout.prompts-per-step", "8", "--algo.group-size", "4",
             "--eval.every", "0", "--optim.lr", "3e-4", "--optim.warmup-steps", "0",
             "--no-progress", "--no-tensorboard", "--dump-rollouts", "--checkpoint.every", "1",
             "--train.mesh", "data=1,fsdp=2", "--steps", str(FSDP_STEPS))


def run_colocated(run_dir):
    from test_train_loop import locojax

    # Unpinned, as single's one process and the Ray modes' actors run: each compared process
    # then has XLA:CPU's intra-op pool of the machine's cores (locojax/float_context.py).
    locojax("launch", "--hosts", "2", "--devices-per-host", "1", "--heartbeat-s", "10",
            "--no-pin-cpus", "--", "train", "demo", "--mode", "colocated", "--run-dir",
            str(run_dir), *FSDP_ARGS)
    return run_dir


def tokens_by_step(run_dir):
    """Every step's sampled tokens, rows in group-id order, whichever process dumped them
    (one dump per host and step, or the controller's one per step)."""
    by_step = {}
    for name in sorted(os.listdir(os.path.join(run_dir, "rollouts"))):
        d = np.load(os.path.join(run_dir, "rollouts", name))
        by_step.setdefault(name.split(".")[0], []).append((d["group_ids"], d["tokens"]))
    out = {}
    for step, parts in by_step.items():
        ids = np.concatenate([p[0] for p in parts])
        out[step] = np.concatenate([p[1] for p in parts])[np.argsort(ids, kind="stable")]
    return out
