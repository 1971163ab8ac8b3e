"""The code under test in its own process: a server that runs it, and the tester's handles on
its objects (see `harness.py` for why).

Values cross as plain data (None, bool, int, float, complex, str, bytes, list, tuple, dict,
set of exactly these types: a subclass could redefine `==`); anything else stays in the
server and crosses as a handle, a `Remote` in the tester, whose attribute access, calls and
few protocol methods become requests. `==`, `!=`, ordering and `in` on a handle raise
TypeError in the tester: the code's `__eq__` must not decide a test. Exceptions cross by
class: builtins as themselves, the code's own classes as local subclasses of their nearest
builtin base (so `pytest.raises(mod.Error)` works); SystemExit, KeyboardInterrupt and the like
become `CodeUnderTestError`. List, dict, set and bytearray arguments are copied back after a
call, so in-place mutation is seen.

Protocol: 4-byte big-endian length, then a JSON object. Requests carry "op"; replies are
{"ok": value} (a call adds "back": the mutable arguments after it) or {"err": exception}.
Stdlib only: it runs inside the sandbox, copied there as `.locojax/remote.py`.
"""

import base64
import builtins
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import traceback
import types

_MAX_MESSAGE = 64 << 20
_MAX_DEPTH = 100
_NOT_RAISED_AS_IS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "StopIteration",
                     "StopAsyncIteration", "BaseException", "BaseExceptionGroup")


class CodeUnderTestError(Exception):
    """The code under test failed in a way that cannot cross as itself (it exited, raised
    SystemExit, broke the protocol, ...)."""


# -- framing and values ------------------------------------------------------------------------


def _send(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > _MAX_MESSAGE:
        raise CodeUnderTestError(f"message of {n} bytes from the other process")
    body = _read_exact(fd, n)
    if body is None:
        raise CodeUnderTestError("the other process closed its pipe mid-message")
    return json.loads(body)


def _read_exact(fd, n):
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def _encode(v, handle, depth=0):
    """Plain data by value (exact types only: a subclass may redefine ==), else handle(v)."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply to cross between processes")
    t = type(v)
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return v if math.isfinite(v) else {"$f": repr(v)}  # JSON has no nan or inf
    if t is list:
        return [_encode(x, handle, depth + 1) for x in v]
    tags = {tuple: "$t", set: "$s", frozenset: "$fs"}
    if t in tags:
        return {tags[t]: [_encode(x, handle, depth + 1) for x in v]}
    if t is dict:
        return {"$d": [[_encode(k, handle, depth + 1), _encode(x, handle, depth + 1)]
                       for k, x in v.items()]}
    if t in (bytes, bytearray):
        return {"$b" if t is bytes else "$ba": base64.b64encode(v).decode()}
    if t is complex:
        return {"$c": [v.real, v.imag]}
    return handle(v)


def _decode(v, resolve):
    if isinstance(v, list):
        return [_decode(x, resolve) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) != 1:
        return resolve(v)
    (tag, x), = v.items()
    if tag == "$f":
        return float(x)
    if tag in ("$t", "$s", "$fs"):
        return {"$t": tuple, "$s": set, "$fs": frozenset}[tag](_decode(i, resolve) for i in x)
    if tag == "$d":
        return {_decode(k, resolve): _decode(i, resolve) for k, i in x}
    if tag in ("$b", "$ba"):
        return (bytes if tag == "$b" else bytearray)(base64.b64decode(x))
    if tag == "$c":
        return complex(*x)
    return resolve(v)


_MUTABLE = (list, dict, set, bytearray)


# -- the server: runs the code under test --------------------------------------------------------


def _ops(objects, resolve):
    """The requests other than `call`, on the server's objects by handle."""
    return {
        "import": lambda m: importlib.import_module(m["name"]),
        "getattr": lambda m: getattr(objects[m["h"]], m["name"]),
        "setattr": lambda m: setattr(objects[m["h"]], m["name"], _decode(m["v"], resolve)),
        "delattr": lambda m: delattr(objects[m["h"]], m["name"]),
        "repr": lambda m: repr(objects[m["h"]]),
        "str": lambda m: str(objects[m["h"]]),
        "bool": lambda m: bool(objects[m["h"]]),
        "len": lambda m: len(objects[m["h"]]),
        "list": lambda m: list(objects[m["h"]]),
        "dir": lambda m: sorted(dir(objects[m["h"]])),
        "int": lambda m: int(objects[m["h"]]),
        "float": lambda m: float(objects[m["h"]]),
        "index": lambda m: objects[m["h"]].__index__(),
        "getitem": lambda m: objects[m["h"]][_decode(m["k"], resolve)],
        "setitem": lambda m: objects[m["h"]].__setitem__(_decode(m["k"], resolve),
                                                         _decode(m["v"], resolve)),
        "delitem": lambda m: objects[m["h"]].__delitem__(_decode(m["k"], resolve)),
    }


def serve(rfd, wfd, paths, site):
    """Answer the tester's requests until it closes the pipe."""
    sys.path[:0] = paths  # the repository first, as when its tests run alone
    sys.path.extend(site)
    objects, handles = {}, {}

    def handle(o):
        if isinstance(o, type) and issubclass(o, BaseException) and o.__module__ == "builtins":
            return {"$x": o.__name__}  # the tester has these itself
        h = handles.get(id(o))
        if h is None:
            h = handles[id(o)] = len(objects) + 1
            objects[h] = o
        out = {"$h": h, "k": "o", "n": getattr(o, "__qualname__", type(o).__name__)}
        if isinstance(o, type) and issubclass(o, BaseException):
            out.update(k="e", m=str(getattr(o, "__module__", "")), b=[
                {"$x": b.__name__} if b.__module__ == "builtins" else handle(b)
                for b in o.__bases__])
        elif isinstance(o, type):
            out["k"] = "c"
        elif isinstance(o, types.ModuleType):
            out.update(k="m", f=getattr(o, "__file__", None), p=list(getattr(o, "__path__", [])),
                       a=list(getattr(o, "__all__", None) or
                              [n for n in vars(o) if not n.startswith("_")]))
        elif callable(o):
            out["k"] = "f"
        return out

    def resolve(v):
        if "$h" in v:
            return objects[v["$h"]]
        raise ValueError(f"unknown value tag {sorted(v)}")

    def enc(v):
        if type(v).__module__ == "numpy" and getattr(v, "shape", None) == ():
            v = v.item()  # numpy scalars cross as Python scalars
        return _encode(v, handle)

    ops = _ops(objects, resolve)
    while True:
        try:
            msg = _recv(rfd)
        except (CodeUnderTestError, ValueError):
            return
        if msg is None:
            return
        try:
            if msg["op"] == "call":
                args = [_decode(a, resolve) for a in msg["a"]]
                kwargs = {k: _decode(a, resolve) for k, a in msg["kw"].items()}
                value = objects[msg["h"]](*args, **kwargs)
                back = {str(i): enc(a) for i, a in enumerate(args) if type(a) in _MUTABLE}
                back.update({k: enc(a) for k, a in kwargs.items() if type(a) in _MUTABLE})
                reply = {"ok": enc(value), "back": back}
            else:
                reply = {"ok": enc(ops[msg["op"]](msg))}
        except BaseException as e:  # noqa: BLE001 - every failure of the code is an answer
            try:
                text, tb = str(e)[:4000], "".join(traceback.format_exception(e)[-12:])[-4000:]
            except BaseException:  # noqa: BLE001 - a __str__ of the code's that fails
                text, tb = "", ""
            reply = {"err": {"c": handle(type(e)), "n": type(e).__name__, "a": text, "tb": tb}}
        try:
            _send(wfd, reply)
        except (ValueError, TypeError, OSError) as e:
            _send(wfd, {"err": {"c": {"$x": "TypeError"}, "a": f"cannot send the reply: {e}",
                                "tb": ""}})


# -- the tester's side: the client and handles ------------------------------------------------


class Client:
    """The tester's connection to the server, started at the first request."""

    def __init__(self, paths, site, server_path):
        self.paths, self.site, self.server = paths, site, server_path
        self.proc = self.dead = None
        self.remotes, self.exc_classes = {}, {}

    def request(self, op, **kw):
        if self.dead:
            raise CodeUnderTestError(self.dead)
        if self.proc is None:
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            self.proc = subprocess.Popen(  # close_fds: the channel (fd 3) stays behind
                [sys.executable, "-I", "-S", "-B", "-u", self.server, "--serve", str(req_r),
                 str(rep_w), json.dumps([self.paths, self.site])], pass_fds=(req_r, rep_w),
                close_fds=True, stdin=subprocess.DEVNULL)
            os.close(req_r)
            os.close(rep_w)
            self.w, self.r = req_w, rep_r
        try:
            _send(self.w, {"op": op, **kw})
            reply = _recv(self.r)
        except (OSError, ValueError, RecursionError) as e:
            reply, why = None, f"broke the protocol ({type(e).__name__}: {e})"
        else:
            why = None
        if not (isinstance(reply, dict) and ("ok" in reply or "err" in reply)):
            try:
                code = self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:  # alive, but the protocol is broken
                self.proc.kill()
                code = self.proc.wait()
                why = why or "sent a malformed reply"
            during = f"during {op} {kw.get('name', '')}".rstrip()
            self.dead = (f"the code under test {why} {during}" if why else
                         f"the code under test ended its process (exit status {code}) {during}")
            raise CodeUnderTestError(self.dead)
        if "err" in reply:
            raise self._exception(reply["err"])
        return reply

    def value(self, op, **kw):
        return _decode(self.request(op, **kw)["ok"], self.resolve)

    def encode(self, v):
        def handle(o):
            h = getattr(o, "_locojax_handle", None) if isinstance(o, (Remote, type)) else None
            if h is None:
                raise TypeError(f"cannot pass {type(o).__name__} {o!r:.60} to the code under "
                                "test: only plain values and its own objects cross")
            return {"$h": h}
        return _encode(v, handle)

    def resolve(self, v):
        if "$x" in v:
            c = getattr(builtins, v["$x"], None)
            ok = isinstance(c, type) and issubclass(c, Exception) and v["$x"] not in \
                _NOT_RAISED_AS_IS
            return c if ok else CodeUnderTestError
        h = v["$h"]
        if v["k"] == "e":
            if h not in self.exc_classes:
                bases = tuple(b for b in map(self.resolve, v["b"])  # mixins stay behind
                              if isinstance(b, type) and issubclass(b, BaseException))
                bases = bases or (Exception,)
                ns = {"__module__": v["m"], "_locojax_handle": h}
                try:
                    self.exc_classes[h] = type(v["n"], bases, ns)
                except TypeError:  # e.g. a layout conflict between builtin bases
                    self.exc_classes[h] = type(v["n"], bases[:1], ns)
            return self.exc_classes[h]
        if h not in self.remotes:
            self.remotes[h] = Remote(self, h, v["k"], v["n"])
        return self.remotes[h]

    def _exception(self, err):
        cls = self.resolve(err["c"])
        try:
            exc = CodeUnderTestError(f"{err['n']}: {err['a']}") if cls is CodeUnderTestError \
                else cls(err["a"])
        except Exception:  # noqa: BLE001 - a constructor that wants other arguments
            exc = CodeUnderTestError(f"{err['n']}: {err['a']}")
        if err.get("tb"):
            exc.add_note("in the code under test:\n" + err["tb"].rstrip())
        return exc


class Remote:
    """An object of the code under test, seen from the tester."""

    __slots__ = ("_locojax_client", "_locojax_handle", "_locojax_kind", "_locojax_name")

    def __init__(self, client, handle, kind, name):
        for k, v in (("client", client), ("handle", handle), ("kind", kind), ("name", name)):
            object.__setattr__(self, f"_locojax_{k}", v)

    def _ask(self, op, **kw):
        return self._locojax_client.value(op, h=self._locojax_handle, **kw)

    def __getattr__(self, name):
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, v=self._locojax_client.encode(value))

    def __delattr__(self, name):
        self._ask("delattr", name=name)

    def __call__(self, *args, **kwargs):
        c = self._locojax_client
        reply = c.request("call", h=self._locojax_handle, a=[c.encode(a) for a in args],
                          kw={k: c.encode(a) for k, a in kwargs.items()})
        for key, new in reply.get("back", {}).items():  # in-place changes to the arguments
            arg = kwargs.get(key) if key in kwargs else args[int(key)]
            new = _decode(new, c.resolve)
            if isinstance(arg, (dict, set)):
                arg.clear()
                arg.update(new)
            else:
                arg[:] = new
        return _decode(reply["ok"], c.resolve)

    def __repr__(self):
        try:
            return self._ask("repr")
        except Exception:  # noqa: BLE001 - repr is for messages; it must not raise
            return f"<{self._locojax_name} of the code under test>"

    def __str__(self):
        return self._ask("str")

    def __bool__(self):
        return bool(self._ask("bool"))

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return iter(self._ask("list"))

    def __contains__(self, item):
        return any(item is x or _plain_equal(item, x) for x in self._ask("list"))

    def __getitem__(self, key):
        return self._ask("getitem", k=self._locojax_client.encode(key))

    def __setitem__(self, key, value):
        c = self._locojax_client
        self._ask("setitem", k=c.encode(key), v=c.encode(value))

    def __delitem__(self, key):
        self._ask("delitem", k=self._locojax_client.encode(key))

    def __int__(self):
        return int(self._ask("int"))

    def __float__(self):
        return float(self._ask("float"))

    def __index__(self):
        return int(self._ask("index"))

    def __dir__(self):
        return self._ask("dir")

    def __hash__(self):
        return object.__hash__(self)

    def _refuse(self, other):
        raise TypeError(f"the SWE test harness does not compare {self._locojax_name} objects of "
                        "the code under test (their __eq__ is the code's to choose): compare "
                        "plain values such as int, str, list or dict")

    def __eq__(self, other):
        return True if other is self else self._refuse(other)

    def __ne__(self, other):
        return False if other is self else self._refuse(other)

    __lt__ = __le__ = __gt__ = __ge__ = _refuse


def _plain_equal(a, b):
    if isinstance(a, Remote) or isinstance(b, Remote):
        Remote._refuse(a if isinstance(a, Remote) else b, None)
    return a == b


if __name__ == "__main__":  # the server: python -I -S -B remote.py --serve RFD WFD [PATHS, SITE]
    serve(int(sys.argv[2]), int(sys.argv[3]), *json.loads(sys.argv[4]))
