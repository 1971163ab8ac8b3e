"""The memory plan's automatic settings: what it raises, in which order, until a run fits.

`memory_plan.plan` compiles a run's programs once at the settings given; when they do not fit
(or XLA refuses to compile one for want of memory: `out_of_memory.py`), `fit` tries the
automatic settings in order, each a `LearnerConfig` the train step is compiled for again, on
every backend alike: remat when `--remat auto`, then more micro-batches when `--grad-accum 0`
(auto). `locojax predict` escalates in the same order (`locojax/predict/memory.py`).
"""

from __future__ import annotations

import dataclasses

from locojax.rl.config import AUTO_ACCUM
from locojax.train.program_cost import size


def fit(first, with_learner, estimate, auto_remat: bool):
    """The plan of the first escalation of the automatic settings that fits, saying what it
    chose and why; else the last one tried, saying what was tried (`check` refuses it).

    Remat first: it keeps only each layer's input whatever the batch, for about one more
    forward, and keeps the matmuls whole; then more micro-batches (divisors of a device's
    rows, fewest first), which divide what is left of the activations and the logits. The
    logits are already chunked automatically (`--logprob-chunk -1`) once they are large.
    Only the train step is compiled again: from the first escalation that `estimate` (no
    compile) says fits, or the last, on until one does."""
    learner, st = first.learner, first.settings
    steps = []
    if auto_remat and not learner.remat:
        learner = dataclasses.replace(learner, remat=True)
        steps.append((learner, "remat on"))
    if first.learner.grad_accum == AUTO_ACCUM:
        rows = st["rows_per_device"]
        for k in range(st["grad_accum"] + 1, rows + 1):
            if rows % k == 0:
                steps.append((dataclasses.replace(learner, grad_accum=k),
                              ("remat on and " if learner.remat and not first.learner.remat
                               else "") + f"{k} micro-batches of {rows // k} rows per device"))
    refused = [p for p in first.programs if p.refused]
    available = (f"the {size(first.device_memory)} available" if first.device_memory else
                 "the device's memory")
    why = (f"without it XLA refused to compile {refused[0].name} ({refused[0].refused})"
           if refused else f"without it the peak is {size(first.peak)} "
           f"({first.peak_program.name}), more than {available}")
    if not steps:
        return first
    room = first.device_memory or float("inf")  # unknown size: try every step in order
    start = next((i for i, (c, _) in enumerate(steps) if estimate(c) <= room), len(steps) - 1)
    skipped = f" ({', '.join(w for _, w in steps[:start])}: estimated not to)" if start else ""
    for candidate, what in steps[start:]:
        tried = with_learner(candidate)
        if tried.fits:
            tried.chosen = [f"{what}: {why}; with it {size(tried.peak)}"]
            return tried
    tried.chosen = [f"tried {', then '.join(w for _, w in steps[start:])}{skipped}: none fits, "
                    f"the last needs {size(tried.peak)}"]
    return tried
