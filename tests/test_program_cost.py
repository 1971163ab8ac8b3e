"""The one account of a compiled program's cost (`locojax/train/program_cost.py`): what the
memory plan keeps of each program is XLA's own analyses, and the analytic cost model that
`locojax predict` uses where nothing can be compiled agrees with it where both exist.
Compiled from abstract shapes only: nothing runs."""

import jax

from locojax.model import config
from locojax.model.sharding import make_mesh
from locojax.predict.flops import ModelCosts
from locojax.rl import batch as batch_lib
from locojax.rl import train_state, train_step
from locojax.rl.config import AlgoConfig, LearnerConfig, OptimConfig
from locojax.train import memory_plan
from locojax.train.program_cost import ProgramCost, xla_costs


def _compiled_train_step(cfg, b, g, p, n):
    mesh = make_mesh({"data": 1}, jax.devices()[:1])
    learner = LearnerConfig(algo=AlgoConfig(group_size=g, max_response_len=n),
                            optim=OptimConfig(), grad_accum=1)
    state = train_state.abstract(cfg, learner.optim, mesh)
    batch = batch_lib.abstract(b * g, p + n, mesh,
                               shared_prefix=batch_lib.SharedPrefix(p, g))
    return train_step.compile_update(state, batch, cfg, learner, None, mesh)


def test_a_program_cost_is_xlas_analyses_and_the_memory_plan_keeps_it():
    compiled = _compiled_train_step(config.tiny(), 8, 4, 16, 32)
    cost = ProgramCost.of("train_step", "train", compiled, held_arguments=0, compile_s=0.0)
    m = compiled.memory_analysis()
    assert (cost.arguments, cost.outputs, cost.aliased, cost.temporaries) == (
        m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes,
        m.temp_size_in_bytes)
    assert (cost.flops, cost.bytes_accessed) == xla_costs(compiled)
    assert cost.flops > 0 and cost.bytes_accessed > 0
    assert memory_plan.Program is ProgramCost  # the plan's programs are this record


def test_the_analytic_train_step_flops_agree_with_the_compiled_account():
    """TINY's canonical shape: XLA counts the matmuls the model counts plus one FLOP per
    element of every elementwise op and reduction, which tests/test_predict_flops.py bounds
    at under a quarter of the matmuls at this shape; so the compiled count lies in
    [1, 1.25] x the model's. A missing layer (half of TINY's body) or the backward's factor
    2 falls outside."""
    cfg, (b, g, p, n) = config.tiny(), (8, 4, 16, 32)
    flops, _ = xla_costs(_compiled_train_step(cfg, b, g, p, n))
    model = ModelCosts(cfg, "float32").train_step(b * g, g, p, n).flops
    assert model <= flops <= 1.25 * model, (flops, model)
