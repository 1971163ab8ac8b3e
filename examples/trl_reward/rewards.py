"""Rewards written for TRL's GRPOTrainer, used by locojax unchanged.

    locojax train demo --model tiny --steps 2 --task.name data \
        --task.data examples/trl_reward/data.jsonl \
        --task.reward examples/trl_reward/rewards.py:reward_len \
                      examples/trl_reward/rewards.py:correct --task.reward-weights 0.1 1

`reward_len` is the example of TRL's GRPO docs; `correct` reads the dataset's `answer`
column, which arrives as a keyword argument, one value per completion.
"""


def reward_len(completions, **kwargs):
    """Prefer completions of about 20 characters (TRL docs)."""
    return [-abs(20 - len(completion)) / 20 for completion in completions]


def correct(prompts, completions, answer, **kwargs):
    """1 if the completion's last word is the gold answer; None for rows without one."""
    out = []
    for completion, gold in zip(completions, answer):
        words = completion.split()
        out.append(None if gold is None else float(bool(words) and words[-1] == str(gold)))
    return out
