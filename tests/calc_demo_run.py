"""The multi-turn reference run: calc-demo from the shipped tiny-calc checkpoint, 2 steps, as
2 colocated hosts x 1 device. Its trajectories call the calculator (about a quarter of the
answers) and its params move, so a run that reproduces it is not vacuously equal."""

CALC_DEMO_ARGS = ("--rollout.prompts-per-step", "8", "--algo.group-size", "4", "--steps", "2",
                  "--eval.every", "0", "--no-progress", "--no-tensorboard", "--dump-rollouts")


def run_colocated(run_dir):
    from test_train_loop import locojax

    # Unpinned, as single's one process and the Ray modes' actors run: each compared process
    # then has XLA:CPU's intra-op pool of the machine's cores (locojax/float_context.py).
    # Pinned to one core each (launch's default), this checkpoint's train step rounds some
    # sums in another order on one thread, and its params differ in the last bits.
    locojax("launch", "--hosts", "2", "--devices-per-host", "1", "--heartbeat-s", "10",
            "--no-pin-cpus", "--", "train", "calc-demo", "--mode", "colocated",
            "--run-dir", str(run_dir), *CALC_DEMO_ARGS)
    return run_dir
