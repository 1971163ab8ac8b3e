"""Built-in procedural tasks small enough for a character-level model trained on CPU.

    arith.py        multi-digit addition and subtraction, answered as `#### N`
    calc.py         a multi-turn tool task: a calculator, then `#### N`
    procedural.py   seeded, lazily generated splits that never overlap
"""
