"""The peers' sides of the benchmarks: one worker per framework, each in its own environment.

Every worker runs as `python -m benchmarks.peers.X` from the repository root; the Tunix and
TRL ones in their own venvs (install), where nothing but the standard library, numpy and the
peer is installed, so they import nothing of ours but common (and this package's and
benchmarks/' docstring-only `__init__`).

- common: bench_peers' shapes, prompts, reward and protocol, and `Driven`, the skeleton
  every bench_peers worker runs its steps in;
- locojax_worker, trl_worker, tunix_worker: bench_peers' sides;
- tunix_sampler: bench_engine's Tunix side;
- trl_real_worker, tunix_real_worker (over tunix_real_model, the checkpoint as Tunix's
  Llama3), trl_sample_worker, trl_update_worker: the real-model comparisons' peer sides,
  the TRL ones sharing trl_common (the `GRPOConfig`, the tensors compared), not each other;
- install: the peers' pinned venvs.
"""
