"""Procedural bug-fix tasks: small repositories with one injected bug, reproducible from a seed.

Each template writes a correct function (with a docstring stating what it should do), a bugged
variant and test checks. Three kinds of bug: `off_by_one` (slice/range bounds, inclusive
ranges), `wrong_operator` (+ for *, < for >, any for all, ...) and `missing_case` (a dropped
branch: zero, empty input, the top grade, the combined FizzBuzz case). Function names and
constants are drawn from the seed.

Levels:
  1. one module holding only the bugged function, one test file;
  2. the bugged function among two correct ones in the same module, tests for all three;
  3. a package with two modules and a `tests/` directory (four functions, one bugged).

Splits: a task is held out ("test") iff `procedural.is_held_out` of the hash of its files, the
same seed-independent rule as the other procedural tasks, so "train" and "test" can never share
a task, whatever the seeds. The oracle edit is the smallest block of changed lines,
grown upwards until it is unique in the file.

Reference: the bug kinds are the common single-statement bugs of ManySStuBs4J / PyTraceBugs.
"""

from __future__ import annotations

import difflib
import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from locojax.envs.base import Example
from locojax.envs.swe.tasks import Edit, SWETask, to_example
from locojax.envs.tasks.procedural import is_held_out

KINDS = ("off_by_one", "wrong_operator", "missing_case")
SPLITS = ("train", "test")
LEVELS = (1, 2, 3)


class Bug(NamedTuple):
    kind: str
    """One of KINDS."""
    name: str
    """The function name."""
    good: str
    """The correct function source."""
    bad: str
    """The bugged function source."""
    checks: tuple[tuple[str, Any], ...]
    """(call expression, expected value); the first one fails on the bugged version."""


def _fn(name: str, args: str, doc: str, body: str) -> str:
    return f'def {name}({args}):\n    """{doc}"""\n{body}'


def _bug(kind, name, args, doc, body, good_snip, bad_snip, checks) -> Bug:
    good = _fn(name, args, doc, body)
    if good.count(good_snip) != 1:
        raise ValueError(f"template {name}: bug site {good_snip!r} must occur exactly once")
    return Bug(kind, name, good, good.replace(good_snip, bad_snip), tuple(checks))


# -- off by one ---------------------------------------------------------------------------------

def _prefix_sum(r: random.Random) -> Bug:
    f = r.choice(["sum_first", "head_total", "prefix_sum"])
    xs = [r.randint(1, 9) for _ in range(r.randint(5, 7))]
    n = r.randint(2, len(xs) - 1)
    return _bug("off_by_one", f, "xs, n", "Sum of the first n items of xs.",
                "    return sum(xs[:n])\n", "xs[:n]", "xs[:n - 1]",
                [(f"{f}({xs}, {n})", sum(xs[:n])), (f"{f}({xs}, 1)", xs[0])])


def _up_to(r: random.Random) -> Bug:
    f = r.choice(["numbers_up_to", "count_to", "one_to_n"])
    n = r.randint(3, 9)
    return _bug("off_by_one", f, "n", "The list [1, 2, ..., n].",
                "    return list(range(1, n + 1))\n", "range(1, n + 1)", "range(1, n)",
                [(f"{f}({n})", list(range(1, n + 1))), (f"{f}(1)", [1])])


def _factorial(r: random.Random) -> Bug:
    f = r.choice(["factorial", "product_to"])
    n = r.randint(4, 8)
    body = "    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result\n"
    fact = 1
    for k in range(2, n + 1):
        fact *= k
    return _bug("off_by_one", f, "n", "n! = 1 * 2 * ... * n.", body, "range(2, n + 1)",
                "range(2, n)", [(f"{f}({n})", fact), (f"{f}(1)", 1)])


def _last_n(r: random.Random) -> Bug:
    f = r.choice(["last_items", "tail_of"])
    xs = r.sample(range(10, 60), 6)
    n = r.randint(2, 4)
    return _bug("off_by_one", f, "xs, n", "The last n items of xs (1 <= n <= len(xs)).",
                "    return xs[len(xs) - n:]\n", "len(xs) - n:", "len(xs) - n + 1:",
                [(f"{f}({xs}, {n})", xs[-n:]), (f"{f}({xs}, {len(xs)})", xs)])


def _count_between(r: random.Random) -> Bug:
    f = r.choice(["count_between", "how_many_in"])
    lo = r.randint(1, 5)
    hi = lo + r.randint(3, 6)
    xs = [r.randint(0, 15) for _ in range(5)] + [hi, lo]
    r.shuffle(xs)
    return _bug("off_by_one", f, "xs, lo, hi", "How many items of xs lie between lo and hi, both included.",
                "    return sum(1 for x in xs if lo <= x <= hi)\n", "lo <= x <= hi",
                "lo <= x < hi",
                [(f"{f}({xs}, {lo}, {hi})", sum(1 for x in xs if lo <= x <= hi))])


# -- wrong operator ------------------------------------------------------------------------------

def _perimeter(r: random.Random) -> Bug:
    f = r.choice(["perimeter", "rect_perimeter"])
    w, h = r.randint(3, 12), r.randint(3, 12)
    return _bug("wrong_operator", f, "w, h", "Perimeter of a w-by-h rectangle.",
                "    return 2 * (w + h)\n", "(w + h)", "(w * h)",
                [(f"{f}({w}, {h})", 2 * (w + h)), (f"{f}({h}, 1)", 2 * (h + 1))])


def _average(r: random.Random) -> Bug:
    f = r.choice(["average", "mean_of"])
    xs = [r.randint(1, 20) for _ in range(r.randint(3, 5))]
    xs[-1] += -sum(xs) % len(xs)  # an exact mean, so the expected value prints cleanly
    return _bug("wrong_operator", f, "xs", "The arithmetic mean of a non-empty list.",
                "    return sum(xs) / len(xs)\n", "sum(xs) / len(xs)", "sum(xs) * len(xs)",
                [(f"{f}({xs})", sum(xs) / len(xs))])


def _is_multiple(r: random.Random) -> Bug:
    f = r.choice(["is_multiple", "divides_evenly"])
    k = r.randint(3, 7)
    n = k * r.randint(2, 9)
    return _bug("wrong_operator", f, "n, k", "True when n is a multiple of k.",
                "    return n % k == 0\n", "n % k == 0", "n % k != 0",
                [(f"{f}({n}, {k})", True), (f"{f}({n + 1}, {k})", False)])


def _larger(r: random.Random) -> Bug:
    f = r.choice(["larger", "max_of_two"])
    a, b = sorted(r.sample(range(-20, 50), 2), reverse=True)
    return _bug("wrong_operator", f, "a, b", "The larger of a and b.",
                "    return a if a > b else b\n", "a > b", "a < b",
                [(f"{f}({a}, {b})", a), (f"{f}({b}, {a})", a)])


def _discount(r: random.Random) -> Bug:
    f = r.choice(["apply_discount", "sale_price"])
    price, pct = 100 * r.randint(1, 9), r.choice([10, 20, 25, 50])
    return _bug("wrong_operator", f, "price, pct", "price reduced by pct percent.",
                "    return price - price * pct // 100\n", "price - price", "price + price",
                [(f"{f}({price}, {pct})", price - price * pct // 100), (f"{f}({price}, 0)", price)])


def _fahrenheit(r: random.Random) -> Bug:
    f = r.choice(["to_fahrenheit", "c_to_f"])
    c = 5 * r.randint(0, 20)
    return _bug("wrong_operator", f, "c", "Degrees Celsius (a multiple of 5) to Fahrenheit.",
                "    return c * 9 // 5 + 32\n", "+ 32", "- 32",
                [(f"{f}({c})", c * 9 // 5 + 32), (f"{f}(100)", 212)])


def _all_positive(r: random.Random) -> Bug:
    f = r.choice(["all_positive", "every_positive"])
    mixed = [r.randint(1, 9) for _ in range(4)] + [-r.randint(0, 9)]
    r.shuffle(mixed)
    pos = [r.randint(1, 9) for _ in range(3)]
    return _bug("wrong_operator", f, "xs", "True when every item of xs is > 0.",
                "    return all(x > 0 for x in xs)\n", "all(", "any(",
                [(f"{f}({mixed})", False), (f"{f}({pos})", True)])


# -- missing case --------------------------------------------------------------------------------

def _sign(r: random.Random) -> Bug:
    f = r.choice(["sign", "sign_of"])
    p, n = r.randint(1, 99), -r.randint(1, 99)
    body = ("    if x > 0:\n        return 1\n    if x == 0:\n        return 0\n"
            "    return -1\n")
    return _bug("missing_case", f, "x", "1 for positive x, -1 for negative x, 0 for zero.", body,
                "    if x == 0:\n        return 0\n", "",
                [(f"{f}(0)", 0), (f"{f}({p})", 1), (f"{f}({n})", -1)])


def _fizzbuzz(r: random.Random) -> Bug:
    f = r.choice(["fizzbuzz", "label_for"])
    a, b = r.choice([(3, 5), (2, 7), (3, 7), (2, 5), (5, 7)])
    w1, w2 = r.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong")])
    body = (f'    if n % {a * b} == 0:\n        return "{w1}{w2}"\n'
            f'    if n % {a} == 0:\n        return "{w1}"\n'
            f'    if n % {b} == 0:\n        return "{w2}"\n    return str(n)\n')
    doc = (f"{w1}{w2} for multiples of both {a} and {b}, {w1} for other multiples of {a}, "
           f"{w2} for other multiples of {b}, else str(n).")
    k = r.randint(1, 3)
    return _bug("missing_case", f, "n", doc, body,
                f'    if n % {a * b} == 0:\n        return "{w1}{w2}"\n', "",
                [(f"{f}({a * b * k})", w1 + w2), (f"{f}({a})", w1), (f"{f}({b})", w2),
                 (f"{f}(1)", "1")])


def _safe_divide(r: random.Random) -> Bug:
    f = r.choice(["safe_divide", "divide_or"])
    d, k, q = r.choice([0, -1, 99]), r.randint(2, 9), r.randint(2, 9)
    body = "    if b == 0:\n        return default\n    return a / b\n"
    return _bug("missing_case", f, f"a, b, default={d}", "a / b, or default when b is 0.", body,
                "    if b == 0:\n        return default\n", "",
                [(f"{f}({q}, 0)", d), (f"{f}({q * k}, {k})", float(q))])


def _grade(r: random.Random) -> Bug:
    f = r.choice(["grade", "letter_grade"])
    t1 = r.randint(85, 95)
    t2, t3 = t1 - 10, t1 - 20
    body = (f'    if score >= {t1}:\n        return "A"\n    if score >= {t2}:\n        return "B"\n'
            f'    if score >= {t3}:\n        return "C"\n    return "F"\n')
    doc = f"A for score >= {t1}, B for >= {t2}, C for >= {t3}, else F."
    return _bug("missing_case", f, "score", doc, body, f'    if score >= {t1}:\n        return "A"\n',
                "", [(f"{f}({t1 + 3})", "A"), (f"{f}({t2})", "B"), (f"{f}({t3 + 1})", "C"),
                     (f"{f}({t3 - 5})", "F")])


def _first_or(r: random.Random) -> Bug:
    f = r.choice(["first_or", "head_or_default"])
    xs, d = r.sample(range(1, 50), 3), r.randint(-9, -1)
    body = "    if not xs:\n        return default\n    return xs[0]\n"
    return _bug("missing_case", f, "xs, default", "The first item of xs, or default if xs is empty.",
                body, "    if not xs:\n        return default\n", "",
                [(f"{f}([], {d})", d), (f"{f}({xs}, {d})", xs[0])])


def _absolute(r: random.Random) -> Bug:
    f = r.choice(["absolute", "magnitude"])
    m = r.randint(1, 99)
    body = "    if x < 0:\n        return -x\n    return x\n"
    return _bug("missing_case", f, "x", "The absolute value of x.", body,
                "    if x < 0:\n        return -x\n", "", [(f"{f}({-m})", m), (f"{f}({m})", m)])


TEMPLATES: dict[str, Callable[[random.Random], Bug]] = {
    "prefix_sum": _prefix_sum, "up_to": _up_to, "factorial": _factorial, "last_n": _last_n,
    "count_between": _count_between, "perimeter": _perimeter, "average": _average,
    "is_multiple": _is_multiple, "larger": _larger, "discount": _discount,
    "fahrenheit": _fahrenheit, "all_positive": _all_positive, "sign": _sign,
    "fizzbuzz": _fizzbuzz, "safe_divide": _safe_divide, "grade": _grade,
    "first_or": _first_or, "absolute": _absolute,
}
"""Template name -> generator. Function-name pools are disjoint across templates."""
_KIND_OF = {n: t(random.Random(0)).kind for n, t in TEMPLATES.items()}

_MODULES = ["mathutil", "helpers", "calc", "numtools", "listops", "shoputil", "grader", "convert"]
_PACKAGES = ["mylib", "toolkit", "project", "core_lib"]

# -- assembling a repository ---------------------------------------------------------------------


def _module(title: str, sources: Sequence[str]) -> str:
    return f'"""{title}"""\n\n\n' + "\n\n".join(sources)


def _test_file(import_from: str, bugs: Sequence[Bug]) -> str:
    names = ", ".join(b.name for b in bugs)
    out = [f"from {import_from} import {names}\n"]
    for b in bugs:
        lines = [f"\n\ndef test_{b.name}():"]
        for call, want in b.checks:
            lines += [f"    result = {call}",
                      f"    assert result == {want!r}, \"{call} returned \" + repr(result)"]
        out.append("\n".join(lines) + "\n")
    return "".join(out)


def _minimal_edit(path: str, buggy: str, fixed: str) -> Edit:
    """The changed lines (plus lines above until unique in the file) as old -> new."""
    a, b = buggy.splitlines(keepends=True), fixed.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
    if i1 == i2:  # pure insertion: anchor on the line before
        i1, j1 = i1 - 1, j1 - 1
    while i1 > 0:
        old, new = "".join(a[i1:i2]).rstrip("\n"), "".join(b[j1:j2]).rstrip("\n")
        if old and buggy.count(old) == 1:  # the replace tool's own uniqueness rule
            return Edit(path, old, new)
        i1, j1 = i1 - 1, j1 - 1
    return Edit(path, buggy, fixed)


def make_task(rng: random.Random, level: int = 1, kinds: Sequence[str] = KINDS) -> SWETask:
    """One random task drawn from `rng` (its split is decided by its content hash)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    pool = [n for n, t in TEMPLATES.items() if _KIND_OF[n] in kinds]
    if not pool:
        raise ValueError(f"no templates for kinds {list(kinds)}; choose from {KINDS}")
    target_name = rng.choice(pool)
    target = TEMPLATES[target_name](rng)
    others = [TEMPLATES[n](rng) for n in rng.sample(
        [n for n in TEMPLATES if n != target_name], {1: 0, 2: 2, 3: 3}[level])]
    mod = rng.choice(_MODULES)
    if level < 3:
        group = others + [target]
        rng.shuffle(group)
        src = [b.bad if b is target else b.good for b in group]
        bug_path, test_path = f"{mod}.py", f"test_{mod}.py"
        files = {bug_path: _module(f"Functions of the {mod} module.", src),
                 test_path: _test_file(mod, group)}
        tests = (test_path,)
    else:
        pkg, mod2 = rng.choice(_PACKAGES), rng.choice([m for m in _MODULES if m != mod])
        group, rest = [others[0], target], others[1:]
        rng.shuffle(group)
        bug_path = f"{pkg}/{mod}.py"
        files = {f"{pkg}/__init__.py": f'"""The {pkg} package."""\n',
                 bug_path: _module(f"Functions of the {mod} module.",
                                   [b.bad if b is target else b.good for b in group]),
                 f"{pkg}/{mod2}.py": _module(f"Functions of the {mod2} module.",
                                             [b.good for b in rest]),
                 f"tests/test_{mod}.py": _test_file(f"{pkg}.{mod}", group),
                 f"tests/test_{mod2}.py": _test_file(f"{pkg}.{mod2}", rest)}
        tests = (f"tests/test_{mod}.py", f"tests/test_{mod2}.py")
    fixed = files[bug_path].replace(target.bad, target.good)
    fix = (_minimal_edit(bug_path, files[bug_path], fixed),)
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()
    task_split = "test" if is_held_out(digest) else "train"
    call, want = target.checks[0]
    test_of = next(t for t in tests if target.name in files[t])
    desc = (f"`{call}` should return {want!r}, but the tests in {test_of} fail. "
            f"Fix the code (changing the tests does not count).")
    return SWETask(id=f"swe-{task_split}-L{level}-{digest[:10]}", description=desc, files=files,
                   tests=tests, runner="minitest", fix=fix,
                   meta={"kind": target.kind, "template": target_name, "level": level,
                         "split": task_split, "key": digest})


def generate_tasks(n: int, seed: int = 0, split: str = "train", level: int = 1,
                   kinds: Sequence[str] = KINDS) -> list[SWETask]:
    """`n` distinct tasks of `split`, reproducible from `seed` (same args -> same tasks)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"locojax-swe:{seed}:{level}:{','.join(sorted(kinds))}")
    out: dict[str, SWETask] = {}
    for _ in range(200 * n + 100):
        if len(out) == n:
            return list(out.values())
        t = make_task(rng, level, kinds)
        if t.meta["split"] == split:
            out.setdefault(t.id, t)
    raise RuntimeError(f"could only generate {len(out)} distinct {split} tasks of {n} asked")


def generate_examples(n: int, seed: int = 0, split: str = "train", level: int = 1,
                      kinds: Sequence[str] = KINDS) -> list[Example]:
    """`generate_tasks` wrapped as protocol `Example`s for `SWEEnv`."""
    return [to_example(t) for t in generate_tasks(n, seed, split, level, kinds)]
