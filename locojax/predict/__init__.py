"""`locojax predict`: step time, memory and staleness at pod scale, from a cost model,
before launch and without the target machine (docs/predict.md: how a prediction is made).

The cost model, in the order a prediction runs through it:
- inputs: the model (`spec.py`), the workload (`workload.py`; `presets.py`: workloads by
  name, `workloads.json`), the cluster (`hardware.py`, `hardware/*.json`: a source for
  every number), each constant with its origin (`origin.py`);
- work: `flops.py`, FLOPs and bytes of prefill, decode step and train step;
- rates: `devices.py` (the roofline), `calibrated.py` (a calibrated machine's program
  times: this machine's, or the shipped example's, `cpu-here`);
- phases: `phases.py`, with `collectives.py` (ring/tree over ICI and DCN) and
  `compaction.py` (the decode loop's waves);
- modes: `modes.py` (synchronous), `simulate.py` (the buffered ones' discrete events),
  `placement.py` (DA/async, the advice), `layout.py` (tp, FSDP, remat, micro-batches: the
  fastest that fits) with `memory.py`;
- the range: `uncertainty.py` (over the uncertain constants, and the verdicts that flip);
  locojax/commands/predict_report.py prints it all.
The run predicted is read from its `locojax train` command line (locojax/commands/
predict_train.py). This machine: `calibrate.py` (`locojax predict calibrate`) with
`calibrate_host.py`, `calibration_step.py` and, on TPUs or GPUs, `calibrate_device.py`.
docs/pod_scale.md: the equations, the validation and the paper's tables. What is not a
prediction of the run asked for is a benchmark (docs/benchmarks.md: `predict_sweep`,
`paper_report`, `predict_programs`, the profiles' probes and validations).
"""
