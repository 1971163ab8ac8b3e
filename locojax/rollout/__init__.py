"""Host-local rollout: prompts in, scored completions out (docs/design.md, "the step").

    single_turn.py   tokenize, `engine.generate`, detokenize, score
    multi_turn.py    model turns in the KV cache, environment turns on the host
    limits.py        a trajectory's limits, and the check that they fit the cache
    lengths.py       long-tailed per-row length caps (a benchmark's workload)
"""
