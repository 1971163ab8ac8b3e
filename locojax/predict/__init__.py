"""`locojax predict`: step time, memory and staleness at pod scale, from a cost model,
before launch and without the target machine (docs/predict.md: how a prediction is made).

The cost model, in the order a prediction runs through it:
- the inputs: the model (`spec.py` reads a config), the workload (`workload.py`: prompts,
  group, length distributions, host work; `presets.py`: workloads by name,
  `workloads.json`), the cluster (`hardware.py` and `hardware/*.json`: profiles with a
  source for every number), each constant with its origin (`origin.py`);
- work: `flops.py` counts FLOPs and bytes of locojax's prefill, decode step and train step,
  checked against XLA's cost analysis;
- rates: `devices.py` (the roofline) and `calibrated.py` (a calibrated machine's program
  times: this machine's, or the shipped example's, `cpu-here`);
- phases: `phases.py` holds the per-phase equations (and the env work of hosts that are
  processes sharing one machine's cores), with `collectives.py` (ring/tree formulas over
  ICI and DCN) and `compaction.py` (the decode loop's waves);
- modes and placement: `modes.py` (the synchronous modes), `simulate.py` (the discrete-event
  simulation of the buffered ones), `placement.py` (DA/async and the advice), `layout.py`
  (tp, FSDP, remat, micro-batches: the fastest that fits) with `memory.py`;
- the range: `uncertainty.py` (the range over the uncertain constants, and the verdicts
  that flip in it); the command prints it all (locojax/commands/predict_report.py: the
  tables, throughput and chip-hours, `--constants`).

The run being predicted is read from its `locojax train` command line by the command
(locojax/commands/predict_train.py; predict_fields.py: which train fields predict reads).
This machine: `calibrate.py` (`locojax predict calibrate`) with `calibrate_host.py`,
`calibration_step.py` and, where its devices are TPUs or GPUs, `calibrate_device.py`.
docs/pod_scale.md has the equations, the validation and the paper's tables reproduced.

What is not a prediction of the run asked for is a benchmark (docs/benchmarks.md): sweeps
(`predict_sweep`), the paper's studies (`paper_report`), the run's own programs timed or
priced by kernel on its machine (`predict_programs`), the profiles' probes and validations.
"""
