"""The learner: advantages, the policy objective, global loss aggregation and the train step.

Start at `train_step.py`; the objective is `losses.py` + `aggregation.py`; algorithms are
registry entries in `algorithms.py`; docs/objectives.md has the equations.
"""
