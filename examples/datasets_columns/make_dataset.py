"""Write a `datasets` directory with train and test splits and columns of your own naming.

    python examples/datasets_columns/make_dataset.py /tmp/sums
    locojax train demo --model tiny --steps 2 --task.name data --task.data /tmp/sums \
        --task.prompt-field question --task.answer-field total \
        --task.reward examples/datasets_columns/rewards.py:exact

`question` is conversational (a list of chat messages, as TRL's `prompt` column may be), so
the checkpoint's chat template renders it; `total` is the gold answer; `digits` is an extra
column the reward receives by name.
"""

import random
import sys

import datasets


def rows(n: int, seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    out = {"question": [], "total": [], "digits": []}
    for _ in range(n):
        a, b = rng.randint(1, 49), rng.randint(1, 49)
        out["question"].append([{"role": "user", "content": f"{a}+{b}"}])
        out["total"].append(str(a + b))
        out["digits"].append(len(str(a + b)))
    return out


def main(out: str) -> None:
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict(rows(32, seed=0)),
        "test": datasets.Dataset.from_dict(rows(8, seed=1)),
    }).save_to_disk(out)


if __name__ == "__main__":
    main(sys.argv[1])
