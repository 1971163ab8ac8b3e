"""The benchmarks: scripts that print the exact command, machine and load they ran with.

Each runs as a module from the repository root, the only way (no module edits sys.path):

    .venv/bin/python -m benchmarks.bench_engine --shapes tiny

`tests/test_benchmarks_smoke.py` runs every script at a toy size. A script imports no other
script: what several share lives in a leaf module (tests/test_import_layers.py).

Scripts, by what they measure:
- generation: bench_engine (locojax against HF and Tunix; engine_sweeps: the engine's
  constants), bench_extend (multi-turn continuation), profile_generate (per program);
- the train step: profile_train (per op), train_step_memory (against the memory plan),
  real_step_seconds (a real config's wall and CPU s per step and peak RSS),
  ab_train_step (A/B of arms, interleaved), bench_invariant (the batch-invariant kernels'
  cost, learner and generate);
- modes and placement: bench_modes (its tables: modes_report), bench_inflight (async with and
  without in-flight updates), bench_placement, ab_runs
  (A/B of whole runs across code trees);
- against the peers: bench_peers (TINY/SMALL, each side a worker in `peers/`),
  bench_real_trl and bench_real_tunix (the real SmolLM2), ab_sample_trl and ab_update_trl
  (sampling and one update), paired_seeds (the learning claim's paired test);
- learning: bench_learning; real sizes: bench_real_size, plan_real_size;
- the step's host work: host_overlap (hidden behind device work or exposed, checkouts
  interleaved; each child runs this file with its checkout's locojax first on the path);
- the roofline: chip_rates (the probes against a chip's published figures);
- one accelerator chip: tpu/ (whole experiments for a borrowed chip, each in one process);
- `locojax predict`: calibrate_predict, predict_probes, validate_predict, validate_heldout,
  predict_programs (a run's programs timed, or priced by kernel, beside the cost model:
  measure with its child measure_child; priced with its child price_child, kernel_model,
  kernel_tables, hlo_kernels, kernel_programs, calibrate_kernels, calibrate_lockstep and
  calibrate_joined), kernel_profile and kernel_rates; studies of the cost model:
  predict_sweep (over model sizes or chip counts) and paper_report (the LoCoJAX paper's
  three studies: paper; their sensitivity: paper_sensitivity), drawn by predict_plots;
  carried_profile (a chip's calibration carried to another chip by spec ratios);
  memory_vs_plan (predict's memory against the compiled plans of validate_heldout's runs).

Leaves they share: harness (header, interleaving, ratios, tables), workloads (the train
command lines), engine_work (the engine benchmarks' shapes, FLOPs and bytes),
engine_runners (each side's generate), real_runs (the real-model comparisons' settings and
runs), kernel_traces (a program's kernels and their trace), probe_walls (probe workers
started together, predict_probes' oversub), heldout_points (a pre-registered point's
train arguments and model: validate_heldout's and memory_vs_plan's). Data:
predict_validation_points_v5.json, _v9.json and the chip's _v10-_v14_tpu.json (set 14 with its
committed profile and predictions, predict_validation_v14_tpu_*.json)
(validate_heldout's current pre-registered sets), data/ (kept result tables).
"""
