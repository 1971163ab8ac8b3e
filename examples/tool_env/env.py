"""A multi-turn tool environment of your own: `--task.name examples/tool_env/env.py:make_env`.

    locojax eval --model tiny --task examples/tool_env/env.py:make_env \
        --data examples/tool_env/words.jsonl --max-new-tokens 16 --multi-turn.max-turns 2

`make_env` returns a `MultiTurnEnv`, so locojax calls it once per episode over the rows of
`--task.data`. Each model turn either calls the tool, `<tool>upper word</tool>` (answered
with `<result>WORD</result>`), or answers; the answer scores 1 if it is the row's `answer`.
"""

from locojax.envs.base import ToolEnv


def upper(args: str) -> str:
    return args.upper()


def exact(completion: str, example) -> float:
    return float(completion.strip() == example.answer)


def make_env() -> ToolEnv:
    return ToolEnv({"upper": upper}, reward=exact, max_tool_calls=2)
