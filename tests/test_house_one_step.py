"""One composition of the RL step: `Trainer.step` is the only function that calls a rollout
and the update (issue 60).

The step was composed in three places (`Trainer.step`, the split step's own `update` and
`predict_programs measure`'s child), so a change to the step had to be made three times.
Now the split step is programs that `train_step.update` runs, and the measure child takes
the run's own `Trainer.logged_step`s. This test keeps it so, read from the source with
`ast` over locojax/ and benchmarks/: a function that calls both

- a rollout: a method named as the engine's, the producer's or the rollout source's entry
  points (`generate`, `prefill`, `produce`, `take`: the receiver's type cannot be read
  from the source, so the name is what is matched), or `single_turn.rollout` /
  `multi_turn.rollout`, resolved through the module's imports;
- and the update: `train_step.update`, `train_step.train_step` or the loop's `update`,
  resolved through the module's imports (a dict's `.update` is not one),

composes the step, and must be `Trainer.step` or named in `ALLOWED` with its reason. Calls
in a lambda count for the function around it; a nested function is read on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ROLLOUT_METHODS = frozenset({"generate", "prefill", "produce", "take"})
ROLLOUT_FUNCTIONS = frozenset({"locojax.rollout.single_turn.rollout",
                               "locojax.rollout.multi_turn.rollout"})
UPDATES = frozenset({"locojax.rl.train_step.update", "locojax.rl.train_step.train_step",
                     "locojax.train.loop.update"})
NOT_A_ROLLOUT = ("numpy", "jax.numpy")
"""Receivers whose `take` is an array's, not a rollout source's."""
THE_STEP = "locojax/train/loop.py:Trainer.step"
ALLOWED = {
    "benchmarks/peers/locojax_worker.py:step_runner.one_step":
        "the peer comparison's locojax side: the peers' shared prompts (token ids), reward "
        "and model config, which no locojax task, tokenizer or preset makes; its docstring "
        "names the `Trainer.step` parts it runs, in order (issue 60: left as it is)",
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def aliases(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the dotted name it is bound to, from every import at any depth, and
    the module's own top-level functions."""
    out = {n.name: f"{module}.{n.name}" for n in tree.body
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return out


def dotted(expr: ast.expr, names: dict[str, str]) -> str | None:
    """`a.b.c` with `a` resolved through `names`; None if not a chain of names."""
    attrs = []
    while isinstance(expr, ast.Attribute):
        attrs.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return ".".join([names.get(expr.id, expr.id), *reversed(attrs)])


def calls(fn: ast.AST):
    """The calls in `fn`'s body, lambdas included, nested functions and classes not."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def composes(fn: ast.AST, names: dict[str, str]) -> bool:
    """Whether `fn` calls a rollout and the update (the module docstring)."""
    rollout = update = False
    for call in calls(fn):
        name = dotted(call.func, names)
        if isinstance(call.func, ast.Attribute) and call.func.attr in ROLLOUT_METHODS:
            receiver = dotted(call.func.value, names)
            rollout |= receiver not in NOT_A_ROLLOUT
        rollout |= name in ROLLOUT_FUNCTIONS
        update |= name in UPDATES
    return rollout and update


def composers(text: str, module: str) -> list[str]:
    """Qualified names of the functions in `text` (module `module`) that compose a step."""
    tree = ast.parse(text)
    names, out = aliases(tree, module), []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef) and composes(child, names):
                    out.append(name)
                visit(child, name + ".")

    visit(tree, "")
    return out


def scan(root: Path = ROOT) -> set[str]:
    """`path:function` of every function under root's locojax/ and benchmarks/ that
    composes a step."""
    return {f"{p.relative_to(root)}:{name}" for top in ("locojax", "benchmarks")
            for p in sorted((root / top).rglob("*.py"))
            for name in composers(p.read_text(), module_name(p, root))}


def test_only_the_trainer_composes_the_step():
    found = scan()
    assert THE_STEP in found, "the scan no longer sees Trainer.step: it reads nothing"
    extra = sorted(found - {THE_STEP, *ALLOWED})
    assert not extra, ("functions that call a rollout and the update (run `Trainer.step` "
                       "instead, or name them in ALLOWED with the reason):\n" +
                       "\n".join(extra))
    assert set(ALLOWED) <= found, f"stale ALLOWED entries: {sorted(set(ALLOWED) - found)}"


def test_the_scan_catches_a_planted_composition():
    """What the old measure child did (engine calls in lambdas, the update through a local
    import), caught; a dict's `update`, an array's `take` and a nested function's calls
    are not the step's."""
    src = (
        "import numpy as np\n"
        "def run(engine, state):\n"
        "    from locojax.rl import train_step as ts\n"
        "    pending = clock('prefill', lambda: engine.prefill(state))\n"
        "    return ts.update(state, pending)\n"
        "def metrics(engine, m):\n"
        "    m.update(engine.generate())\n"
        "    return np.take(m, 0)\n"
        "def outer(source, state):\n"
        "    def inner():\n"
        "        return source.take(0)\n"
        "    return ts.update(state)\n"
        "def update(state):\n"
        "    return state\n"
        "def by_name(state):\n"
        "    from locojax.rollout.single_turn import rollout\n"
        "    from locojax.rl.train_step import train_step\n"
        "    return train_step(rollout(state))\n")
    assert composers(src, "benchmarks.planted") == ["run", "by_name"]
    assert composers("import jax.numpy as jnp\nfrom locojax.train import loop\n"
                     "def f(x, s):\n    return loop.update(jnp.take(x, 0), s)\n",
                     "benchmarks.planted") == []
