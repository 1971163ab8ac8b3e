"""The engine benchmarks' roofline (`benchmarks/engine_work.py`) counts each row's own
decode steps (issue 40's roofline column).

A long-tail shape's rows end at their own lengths; counting every row to N made
small-4096's FLOPs 21x its work and its printed roofline share 124%."""

import numpy as np

from benchmarks import engine_work
from locojax.model import config


def _by_hand(cfg, s, lengths) -> float:
    """Prefill (each prompt once, the LM head at its last position) plus, row by row, the
    decode tokens at contexts P + 1 .. P + L_r - 1: the docstring's sum, summed naively."""
    head = 2 * cfg.hidden_size * cfg.vocab_size
    prefill = s.prompts * (sum(cfg.flops_per_token(t + 1) - head
                               for t in range(s.prompt_tokens)) + head)
    decode = sum(cfg.flops_per_token(s.prompt_tokens + i + 1)
                 for length in lengths for i in range(int(length) - 1))
    return float(prefill + decode)


def test_long_tail_rows_are_counted_to_their_own_ends():
    s = engine_work.SHAPES["small-512"]
    cfg = config.PRESETS[s.model]()
    lengths = s.lengths()
    assert len(set(lengths.tolist())) > 1  # a real long tail, or the test proves nothing
    got = engine_work.generate_flops(cfg, s)
    # Integers below 2^53 summed in f64 in different orders: the relative difference is a
    # few ulps of ~1e12, far under 1e-9.
    np.testing.assert_allclose(got, _by_hand(cfg, s, lengths), rtol=1e-9)
    everyone_to_n = engine_work.generate_flops(cfg, s, lengths=np.full(s.rows, s.new_tokens))
    assert got < 0.6 * everyone_to_n  # the old count, which this shape's tail halves


def test_exact_length_shape_counts_n_tokens_per_row():
    s = engine_work.SHAPES["tiny"]
    cfg = config.PRESETS[s.model]()
    np.testing.assert_allclose(engine_work.generate_flops(cfg, s),
                               _by_hand(cfg, s, [s.new_tokens] * s.rows), rtol=1e-9)


def test_one_turn_trajectory_is_one_generate():
    """bench_extend's roofline work of a one-turn trajectory is a generate's (engine_work):
    their decode counts, written apart, agree where the workloads are the same (the prefill
    is `engine_work.prefill_flops` in both, checked by hand above)."""
    import dataclasses

    from benchmarks import bench_extend

    s = dataclasses.replace(bench_extend.SHAPES["tiny"], turns=1)
    cfg = config.PRESETS[s.arch]()
    flops, _ = bench_extend.trajectory_work(cfg, s, [s.prompts * s.group], weight_bytes=0)
    exact = engine_work.Shape("t", s.arch, s.prompts, s.group, s.prompt_tokens,
                               s.new_tokens, False)
    np.testing.assert_allclose(flops, engine_work.generate_flops(cfg, exact), rtol=1e-9)
