"""Generation on local devices: token ids in, tokens and their logprobs out (no strings).

    engine.py     `Engine.generate` = prefill + decode; start here
    generation.py what a generate hands back: Generation, and Pending between its halves
    decode.py     the programs: prefill, the one decode loop, compaction of finished rows
    sampling.py   how the next token is drawn: greedy, temperature, top-k, top-p
    extend.py     multi-turn: a row goes on in its own KV cache after an environment turn
    refill.py     finished rows refilled from the waiting ones
    waves.py      a generate as several smaller ones, one after another (less KV cache)
"""
