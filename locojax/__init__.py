"""locojax: RL post-training of small LMs in JAX, from one host to a pod.

Start with `train/loop.py`: one RL step, top to bottom. The packages, from the bottom up:

    model/       the decoder of every family as pytrees and one forward; HF I/O; sharding
    tokenizer/   the tokenizer interface, char-level and HF
    engine/      jitted prefill and decode over a donated KV cache; sampling; extend
    envs/        tasks, rewards, data, the sandbox
    rollout/     one host's rollout: prompts in, scored completions out
    rl/          advantages, losses, aggregation, the train step
    train/       the loop, the one builder, the config, the modes as wirings, the memory plan
    fleet/       the Ray modes: controller, disaggregated, async
    predict/     `locojax predict`: step time, memory and placement before launch
    commands/    one module per subcommand; cli.py dispatches to them

and the modules every layer may use:

    checkpoint.py    a run's checkpoints, for an exact continuation
    curate.py        offline pass-rate curation of a dataset (`locojax curate`)
    distributed.py   joining a multi-host run (`jax.distributed.initialize`)
    evaluate.py      k samples of each example, scored by the task's reward
    failure.py       a host's error, said once, last
    float_context.py what a process's float results depend on (CPU, threads, flags)
    gc_tuning.py     the garbage collector's threshold in locojax's own processes
    jsonfile.py      reading a user's JSON file, with an error that names it
    metrics.py       run logs as jsonl
    profiler.py      per-step phase timing, compile time apart
    sft.py           supervised fine-tuning on demonstrations (`locojax sft`)
    sums.py          records of sums that add field by field across hosts
    trackers.py      where metrics go besides the jsonl files
"""
