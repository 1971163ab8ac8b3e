"""A TRL-style reward over custom columns: `total` (the gold answer) and `digits`.

The prompt column is conversational, so each completion is a list holding one assistant
message, as TRL gives it.
"""


def exact(prompts, completions, total, digits, **kwargs):
    """1 for the exact total; 0.1 for a number of the right length; else 0."""
    out = []
    for completion, gold, n in zip(completions, total, digits):
        text = completion[0]["content"].strip()
        out.append(1.0 if text == gold else 0.1 if text.isdigit() and len(text) == n else 0.0)
    return out
