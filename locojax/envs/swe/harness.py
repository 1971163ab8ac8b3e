"""The SWE test harness: the tests run in one process, the code under test in another, and
the verdict leaves on a channel only the first one holds.

Inside one sandbox run (`runner.run_tests` starts it; stdlib only, plus pytest for that
runner) there are two processes:

- the *tester* (`main`), which never executes repository code. It reads the trusted test
  tree (test files, helpers, data and hidden files) from a spec file and deletes it (so the
  code never sees it; the work dir holds blanks), imports its `.py` files from that copy,
  answers `open`, `stat` and directory listings of the tree from it (`treeview.py`), makes
  itself non-dumpable (the code, under the same uid, can neither trace it nor open its fds
  through /proc), runs the test functions (plain `test*` functions for "minitest", pytest
  in-process for "pytest") and writes one JSON line per result, then `{"done": n}`, on
  fd 3: the sandbox's private channel, which the parent reads. No file is read for the verdict.
- the *server* (`remote.serve`), started by the tester at the first import of a repository
  module, which imports and runs the code under test. Every module of the work dir that is
  not a trusted test file is, in the tester, a proxy (`remote.py`: plain values cross, other
  objects stay behind as handles that cannot be compared).

So the code can only answer calls. It cannot exit the tester, patch its test framework, read
its memory, write its channel or edit the tests it runs; exiting early or at import loses
the tests it had not answered. Only functions compiled from a trusted file run as tests.

Limits of the proxy (docs/security.md): callbacks from the tests into the code, `isinstance`
against the code's classes, arithmetic on its objects, monkeypatching a module of the code
(it changes the proxy only), conftest.py files (never loaded: they would run in the tester)
and a repository module named like a stdlib module (the stdlib one wins in the tester, as
with pytest's append import mode).

References: the SWE-bench harness (verdict from per-test results, not the exit code); the
reward-hacking reports of RL on code (tests edited or exited early, always-equal objects).
"""

import builtins
import importlib.machinery
import importlib.util
import json
import linecache
import os
import sys
import types

CHANNEL_FD = 3
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ours, before any code
from remote import Client  # noqa: E402 - the path first
from treeview import serve_tree  # noqa: E402

del sys.path[0]


class _ProxyModule(types.ModuleType):
    """A module of the code under test: its attributes are asked for (never cached)."""

    @property
    def __all__(self):
        # No star-import shortcut into the tests' namespace: `from code import *` binds no
        # builtin's name (the code's `all` would answer the test's asserts) and no name the
        # importing module already holds (a trusted helper, `pytest`). The importer is the
        # frame that asks: the star import runs in C, with no frame of its own.
        have = sys._getframe(1).f_globals
        return [n for n in self.__dict__["_locojax_all"]
                if n not in _BUILTIN_NAMES and n not in have]

    def __getattr__(self, name):
        # Dunders stay local (set at import, or absent): the import system reads some, and a
        # `__path__` chosen by the code would make a module a package searched natively.
        if name.startswith("__") and name.endswith("__") and name != "__version__":
            raise AttributeError(name)
        return self.__dict__["_locojax_remote"]._ask("getattr", name=name)


class _Finder:
    """Trusted test modules from their sources in memory (first in sys.meta_path); every other
    module found in the work dir as a proxy (last, so the stdlib and site-packages win)."""

    def __init__(self, client, work, dirs, trusted):
        self.client, self.work, self.dirs, self.trusted = client, work, dirs, trusted
        self.names = {module_name(work, p)[0]: p for p in trusted}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            origin = self.names[fullname]
            return importlib.util.spec_from_loader(
                fullname, self, origin=origin,
                is_package=os.path.basename(origin) == "__init__.py")
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        path = module.__spec__.origin
        module.__file__ = path
        if os.path.basename(path) == "__init__.py":  # a trusted package: its other modules
            module.__path__ = [_PROXY_PATH + os.path.dirname(path)]  # are the code's, proxied
        code = compile(self.trusted[path], path, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - the task's own tests, restored


_BUILTIN_NAMES = frozenset(dir(builtins))
_PROXY_PATH = "locojax-proxy:"
"""Prefixes the `__path__` entries of proxy packages: the stdlib's PathFinder, which comes
first, finds nothing there, so their submodules too reach `_RepoFinder`, never a native load."""


class _RepoFinder(_Finder):
    def find_spec(self, fullname, path=None, target=None):
        if path is None:
            search = self.dirs
        else:
            search = [p[len(_PROXY_PATH):] for p in path if str(p).startswith(_PROXY_PATH)]
        found = importlib.machinery.PathFinder.find_spec(fullname, search) if search else None
        if found is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=found.origin,
                                               is_package=bool(found.submodule_search_locations))

    def create_module(self, spec):
        info = self.client.request("import", name=spec.name)["ok"]
        module = _ProxyModule(spec.name)
        module.__dict__["_locojax_remote"] = self.client.resolve(info)
        module.__file__ = info.get("f")
        module.__dict__["_locojax_all"] = list(info.get("a", []))  # see `__all__`
        if info.get("p"):
            module.__path__ = [_PROXY_PATH + p for p in info["p"] if _inside(p, self.work)]
        return module

    def exec_module(self, module):
        pass


def _inside(path, root):
    return os.path.realpath(path).startswith(root + os.sep) or os.path.realpath(path) == root


def module_name(work, path):
    """(pytest's rootdir-based name, its sys.path dir): the path from the first ancestor
    directory without __init__.py."""
    parts = os.path.relpath(path, work)[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    base = len(parts) - 1
    while base > 0 and os.path.exists(os.path.join(work, *parts[:base], "__init__.py")):
        base -= 1
    return ".".join(parts[base:]), os.path.join(work, *parts[:base])


# -- the tester: runs the tests, reports on the channel ----------------------------------------


def _run_minitest(tests, report, names):
    for path in tests:
        rel = os.path.relpath(path)
        try:
            module = importlib.import_module(names[path])
        except BaseException as e:  # noqa: BLE001 - a broken test module fails its tests
            report(f"{rel}::<import>", "failed", e)
            continue
        for name, fn in list(vars(module).items()):
            # Only functions compiled from this trusted file (see _Reports).
            if not (name.startswith("test") and type(fn) is types.FunctionType
                    and fn.__code__.co_filename == path):
                continue
            try:
                _call_test(fn)
            except BaseException as e:  # noqa: BLE001 - SystemExit from a test fails it too
                report(f"{rel}::{name}", "failed", e)
            else:
                report(f"{rel}::{name}", "passed")


def _call_test(fn):
    """Run one minitest test to its end: an `async def` test under asyncio; a generator test
    (or one returning anything but None, e.g. an un-awaited coroutine) is refused, as its
    body would not have run."""
    flags = fn.__code__.co_flags
    if flags & 0x80:  # CO_COROUTINE
        import asyncio

        return asyncio.run(fn())
    if flags & (0x20 | 0x200):  # CO_GENERATOR, CO_ASYNC_GENERATOR
        raise TypeError("minitest does not run generator tests (their body would not run)")
    out = fn()
    if out is not None:
        raise TypeError(f"a minitest test must return None, got {type(out).__name__}")


def _run_pytest(tests, report, work, names):
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest
    from _pytest import python as pytest_python

    def importtestmodule(path, config):  # never import a file of the work dir natively
        path = os.path.abspath(str(path))  # a trusted file: its name from before any code ran
        return importlib.import_module(names.get(path) or module_name(work, path)[0])

    pytest_python.importtestmodule = importtestmodule
    ini = os.path.join(work, ".locojax_pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    pytest.main(["-q", "-s", "--tb=short", "-p", "no:cacheprovider", "--noconftest",
                 "--assert=plain", "-c", ini, f"--rootdir={work}",
                 *[os.path.relpath(t, work) for t in tests]],
                plugins=[_Reports(report, set(tests))])


def _trusted_function(fn, trusted):
    import inspect

    try:
        fn = inspect.unwrap(fn) if type(fn) is types.FunctionType else fn
    except ValueError:
        return False
    return type(fn) is types.FunctionType and fn.__code__.co_filename in trusted


class _Reports:
    """The pytest plugin that keeps only trusted tests and reports each outcome."""

    def __init__(self, report, trusted):
        self.report, self.trusted = report, trusted

    def pytest_collection_modifyitems(self, items):
        # Only functions compiled from a trusted file: a name the code put into a test module
        # (a star import of a `test_x`) must not run as a test.
        items[:] = [it for it in items if _trusted_function(getattr(it, "function", None),
                                                            self.trusted)]

    def pytest_collectreport(self, report):
        if report.failed:
            self.report(f"{report.nodeid.split('::')[0]}::<import>", "failed",
                        text=str(report.longrepr))

    def pytest_runtest_logreport(self, report):
        key = "::".join(p.split("[")[0] for p in report.nodeid.split("::"))
        if report.failed:
            self.report(key, "failed")
        elif report.skipped:
            self.report(key, "skipped")
        elif report.when == "call":
            self.report(key, "passed")


def main(spec_path):
    """The tester: see the module docstring."""
    with open(spec_path) as f:
        spec = json.load(f)
    os.unlink(spec_path)  # the code under test never sees the tests it is judged by
    import ctypes

    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
        raise SystemExit("harness: cannot make the tester non-dumpable")
    # Run with -S (site's .pth files cost ~0.1 s a start): the installed packages without them.
    site = spec["site"]
    sys.path.extend(site)
    work = os.getcwd()
    tests = [os.path.join(work, p) for p in spec["tests"]]
    tree = {os.path.join(work, p): src for p, src in spec["trusted"].items()}
    trusted = {p: src for p, src in tree.items() if p.endswith(".py")}
    serve_tree(tree, [os.path.join(work, d) for d in spec["owned"]], work)
    for path, src in trusted.items():  # tracebacks show the trusted source, not the file
        linecache.cache[path] = (len(src), None, src.splitlines(True), path)
    dirs = list(dict.fromkeys([module_name(work, t)[1] for t in tests] + [work]))
    client = Client(dirs, site, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "remote.py"))
    finder = _Finder(client, work, dirs, trusted)
    names = {path: name for name, path in finder.names.items()}
    sys.meta_path.insert(0, finder)
    sys.meta_path.append(_RepoFinder(client, work, dirs, trusted))
    channel, count = os.fdopen(CHANNEL_FD, "w"), [0]

    def report(key, status, exc=None, text=None):
        count[0] += 1
        channel.write(json.dumps({"test": key, "status": status}) + "\n")
        if status == "failed" and spec["runner"] == "minitest":
            import traceback

            detail = text or "".join(traceback.format_exception(exc)[-8:]).rstrip()
            print(f"FAILED {key}\n{detail}")
        elif spec["runner"] == "minitest":
            print(f"PASSED {key}")

    if spec["runner"] == "minitest":
        _run_minitest(tests, report, names)
    else:
        _run_pytest(tests, report, work, names)
    own = os.path.dirname(os.path.abspath(__file__))  # this file and remote.py
    native = [m for m in list(sys.modules.values()) if not isinstance(m, _ProxyModule)
              and _inside(str(getattr(m, "__file__", None) or "/"), work)
              and not _inside(m.__file__, own) and m.__file__ not in trusted]
    if native:  # fail closed: repository code ran in the tester
        raise SystemExit(f"harness: repository modules loaded in the tester: {native}")
    channel.write(json.dumps({"done": count[0]}) + "\n")
    channel.close()


if __name__ == "__main__":
    main(sys.argv[1])
