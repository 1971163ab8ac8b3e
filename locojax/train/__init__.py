"""A run: the loop, the one builder of its parts, its config, and the modes as wirings.

Start at `loop.py`.

    loop.py               the RL loop, one step top to bottom (`Trainer`)
    config.py             `RunConfig`, one frozen dataclass per subsystem, and the presets
    placement_config.py   the Ray modes' settings (`PlacementConfig`)
    build.py              one builder for every role of a run
    wiring.py             the coordination modes as wirings of the same parts
    meshes.py             where the learner's and the rollout's weights live
    producer.py           one host's prompts become its share of the train batch
    record.py             what crosses from producer to learner (`RolloutRecord`)
    source.py             where a learner step's rollouts come from (the seam)
    early.py              device work dispatched before the rows are scored
    data.py               which examples a step trains on, from (seed, step)
    curation.py           pass-rate curation: admit the prompts that still teach
    dynamic_sampling.py   DAPO's rollout-side parts
    memory_plan.py        what each device holds at its peak, before the first step
    plan_fit.py           the plan's automatic settings, raised until a run fits
    plan_hints.py         the settings a refused plan suggests, for its biggest buffers
    out_of_memory.py      XLA's "out of device memory", read as an answer
    train_memory.py       a train step's memory beyond its state, from the shapes
    program_cost.py       one compiled program's FLOPs, bytes and memory, as XLA counts
    comm_probe.py         the gradient all-reduce timed on its own
    resume.py             resume checks what it resumes
    run_lock.py           one run per run directory
    progress.py           the live progress bar
"""
