"""bench_real_trl's reward-per-block table and held-out summary, on made-up results: the
numbers a pre-registered claim on the side-by-side is judged by."""

from __future__ import annotations

from benchmarks import bench_real_trl, real_runs


def _run(seed: int, side: str, rewards: list[float], acc: float) -> dict:
    return dict(seed=seed, side=side, rewards=rewards, final={"accuracy": acc})


def test_block_means_are_whole_blocks_only():
    rewards = [0.0] * 10 + [1.0] * 10 + [0.5] * 5  # the 5-step tail is no block
    assert real_runs.block_means(rewards) == [0.0, 1.0]
    assert real_runs.block_means([1.0] * 9) == []


def test_report_prints_each_run_each_sides_mean_and_held_out_range(capsys):
    results = [_run(0, "locojax", [0.2] * 10 + [0.6] * 10, 0.70),
               _run(1, "locojax", [0.4] * 10 + [0.8] * 10, 0.80),
               _run(0, "trl", [0.3] * 20, 0.75)]
    bench_real_trl.report_blocks(results)
    out = capsys.readouterr().out
    assert "| mean | locojax | 0.300 | 0.700 |" in out  # (0.2 + 0.4) / 2, (0.6 + 0.8) / 2
    assert "| 0 | trl | 0.300 | 0.300 |" in out
    assert "locojax: held-out after, 2 seeds: mean 0.750, range 0.700-0.800" in out
    assert "trl: held-out after, 1 seeds: mean 0.750, range 0.750-0.750" in out


def test_runs_shorter_than_a_block_or_without_rewards_print_nothing(capsys):
    bench_real_trl.report_blocks([_run(0, "locojax", [0.5] * 3, 0.5),
                                  dict(seed=1, side="trl", final={"accuracy": 0.5})])
    assert capsys.readouterr().out == ""
