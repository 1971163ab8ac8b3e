"""`locojax predict`: step time, memory and staleness at pod scale, from a cost model,
before launch and without the target machine (docs/predict.md: how a prediction is made).

Three inputs, each in its own module:
- the model (`spec.py` reads a config; `flops.py` counts FLOPs and bytes of locojax's
  prefill, decode step and train step, checked against XLA's cost analysis);
- the workload (`workload.py`: prompts, group, length distributions, host work);
- the cluster (`hardware.py` and `hardware/*.json`: profiles with a source for every
  number; `collectives.py`: ring/tree formulas over ICI and DCN).
`phases.py` holds the per-phase equations, `devices.py` the roofline and this machine's
fitted program times, `modes.py` the synchronous modes, `simulate.py` the discrete-event
simulation of the buffered ones and `placement.py` the DA/async predictions and advice.
Every constant carries its origin (`origin.py`). docs/pod_scale.md has the equations, the
validation on this machine and the paper's tables reproduced. What times or prices a run's
own programs on this machine (the former `--measure` and `--compiled`) is a benchmark,
benchmarks/predict_programs.py: it needs the machine the run runs on.

The rest, by what it serves:
- the run being predicted: `from_train.py` (the context of a `locojax train` command line),
  `train_fields.py` (which of its fields predict reads), `layout.py` (tp, FSDP, remat, ...),
  `memory.py`, `presets.py` (workloads by name, `workloads.json`), `compaction.py` (the
  decode loop's waves), `uncertainty.py` (what the uncertain constants move);
- this machine: `calibrate.py` (`locojax predict calibrate`) with `calibrate_host.py`,
  `calibrate_oversub.py` and `calibration_step.py`; `calibrated.py` (the program times it
  measured) and `shared_machine.py` (hosts sharing one machine's cores);
- the reports: `report.py`, `sweep.py` (`--sweep`), `paper.py` with `paper_report.py` and
  `paper_sensitivity.py` (the paper's studies).
"""
