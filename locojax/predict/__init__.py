"""`locojax predict`: step time, memory and staleness at pod scale, from a cost model.

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
validation on this machine and the paper's tables reproduced.
"""
