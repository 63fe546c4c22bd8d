"""Where a frame's code comes from: torch, colltrace or the standard library (internal), another
installed package (a framework: lightning, accelerate, transformers, ...) or the user's own code.

Decided by the path's place under roots (real directories, never substrings of a path: a clone
of this repository lives in a folder named `colltrace`, and users keep projects in folders named
`torch` or `lib`). Each rank records its roots in its trace (`local_roots()`, in the meta record),
so an analysis on another machine classifies its frames as the rank did. No torch import, and
nothing of colltrace's: every layer that reads frames (the ranks' recorder, the trace reader, the
model, the analyzer, the reporters, the call-site scan) takes it from here.
"""
from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from typing import TypeGuard

INTERNAL, FRAMEWORK, USER = "internal", "framework", "user"
_CO_STAR_ARGS = 0x04 | 0x08   # CO_VARARGS | CO_VARKEYWORDS (inspect's, without importing it)
# Frames known only by name (py-spy's, a traceback's): a wrapper's usual names.
WRAPPER_NAMES = frozenset(("wrapper", "_wrapper", "wrapped", "wrapped_fn", "wrapper_func", "decorate_context", "_fn"))
# Installed packages that are torch itself, whatever folder they sit in.
TORCH_PACKAGES = frozenset(("torch", "torchgen", "functorch", "colltrace"))


def _forms(path) -> list[str]:
    """A directory as given and as resolved: frame paths may use either."""
    if not path:
        return []
    p = os.path.abspath(str(path))
    return sorted({p, os.path.realpath(p)})


def _package_dir(name: str) -> str | None:
    """The installed location of a package, without importing it (torch is imported by the
    rank already; the analyzing machine may have none)."""
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if path is None:
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
            path = spec.origin if spec is not None else None
        except (ImportError, ValueError):
            path = None
    return os.path.dirname(path) if path else None


def local_roots(user_packages=()) -> dict:
    """This interpreter's roots: {"stdlib", "site", "torch", "colltrace": [dirs], "user_packages": [names]}."""
    paths = sysconfig.get_paths()
    stdlib = {d for k in ("stdlib", "platstdlib") for d in _forms(paths.get(k))}
    sites = {d for k in ("purelib", "platlib") for d in _forms(paths.get(k))}
    try:
        for d in site.getsitepackages() + [site.getusersitepackages()]:
            sites.update(_forms(d))
    except AttributeError:   # some virtualenv builds have no site.getsitepackages
        pass
    return {"stdlib": sorted(stdlib), "site": sorted(sites),
            "torch": _forms(_package_dir("torch")),
            "colltrace": _forms(os.path.dirname(os.path.abspath(__file__))),
            "user_packages": sorted({str(p).strip() for p in user_packages if str(p).strip()})}


@functools.lru_cache(maxsize=1)
def _here() -> dict:
    return local_roots()


def valid_roots(roots) -> TypeGuard[dict]:
    return isinstance(roots, dict) and any(isinstance(roots.get(k), list) for k in ("stdlib", "site", "torch"))


class Origins:
    """Classifies frame paths against one rank's roots; cached per path (a job has few files)."""

    def __init__(self, roots: dict | None):
        if not valid_roots(roots):
            roots = _here()   # a trace from before roots were recorded: this machine's are the best guess
        self.roots = roots
        table = []   # (prefix with a trailing "/", kind); the longest prefix decides
        for kind in ("stdlib", "site", "torch", "colltrace"):
            for d in roots.get(kind) or ():
                if isinstance(d, str) and d:
                    table.append((d.replace("\\", "/").rstrip("/") + "/", kind))
        table.sort(key=lambda x: -len(x[0]))
        self._table = table
        self.user_packages = frozenset(str(p) for p in roots.get("user_packages") or () if p)
        self._cache: dict = {}

    def classify(self, path) -> tuple[str, str | None]:
        """(origin, package): ("internal", "torch"), ("framework", "lightning"), ("user", None)."""
        try:
            hit = self._cache.get(path)
        except TypeError:   # an unhashable value in a malformed frame
            path = str(path)
            hit = self._cache.get(path)
        if hit is None:
            hit = self._cache[path] = self._classify(str(path or ""))
        return hit

    def _classify(self, path: str) -> tuple[str, str | None]:
        p = path.replace("\\", "/")
        if p.startswith("<frozen "):   # the interpreter's frozen stdlib modules
            return INTERNAL, "python"
        for prefix, kind in self._table:
            if p.startswith(prefix):
                if kind == "stdlib":
                    return INTERNAL, "python"
                if kind in ("torch", "colltrace"):
                    return INTERNAL, kind
                top = p[len(prefix):].split("/", 1)[0]
                name = top[:-3] if top.endswith(".py") else top
                if name in self.user_packages:
                    return USER, None
                if name in TORCH_PACKAGES:
                    return INTERNAL, name
                return FRAMEWORK, name or None
        return USER, None

    def annotate(self, frames) -> list:
        """Copies of the frames with "origin" (and "package" for other than the user's code)."""
        out = []
        for f in frames if isinstance(frames, list) else ():
            if not isinstance(f, dict):
                continue
            origin, pkg = self.classify(f.get("file", ""))
            g = dict(f)
            g["origin"] = origin
            if pkg and origin != USER:
                g["package"] = pkg
            out.append(g)
        return out

    def user_frames(self, frames) -> list[dict]:
        if not isinstance(frames, list):
            return []
        return [f for f in frames if isinstance(f, dict) and self.classify(f.get("file", ""))[0] == USER]


@functools.lru_cache(maxsize=1)
def _call_star() -> int:
    import opcode

    return opcode.opmap["CALL_FUNCTION_EX"]


def code_traits(code) -> dict:
    """What a frame's code object says beyond its file and name, worked out once per code object
    (the rank's recorder interns them): "qualname", a method with its class
    (`DeepSpeedEngine.save_checkpoint`; Python 3.11+, else the name), and "wraps": true for a
    wrapper that only passes its call on: a closure taking *args/**kwargs that calls with them
    (a functools.wraps-style decorator's, an nvtx or profiling decorator's, torch._dynamo's
    eval frame), which never stands for the call its caller made."""
    out: dict[str, str | bool] = {"qualname": str(getattr(code, "co_qualname", code.co_name))}
    try:
        if code.co_freevars and code.co_flags & _CO_STAR_ARGS and _call_star() in code.co_code[::2]:
            out["wraps"] = True
    except Exception:   # a code-like object of another implementation: no claim
        pass
    return out


def is_wrapper(f) -> bool:
    """Whether a frame only passes its call on (code_traits' "wraps"); a frame recorded without
    its code object (no "qualname": py-spy's, a traceback's) by its name alone."""
    if type(f) is not dict:
        return False
    if "qualname" in f:
        return f.get("wraps") is True
    return f.get("func") in WRAPPER_NAMES


def called(frames: list, i: int) -> int | None:
    """The index of the frame that frame i called, past wrappers (the function they pass the
    call on to); None if i is the innermost."""
    j = i + 1
    while j < len(frames) - 1 and is_wrapper(frames[j]):
        j += 1
    return j if j < len(frames) else None


def callable_name(f: dict) -> str:
    """A frame's function as its caller named it: "DeepSpeedEngine.save_checkpoint", "barrier"
    (a nested function without its enclosing ones' "<locals>")."""
    q = f.get("qualname")
    name = q if isinstance(q, str) and q else f.get("func")
    return str(name or "?").rsplit("<locals>.", 1)[-1]


_BY_ROOTS: dict = {}


def for_roots(roots) -> Origins:
    """One Origins per distinct roots (16k ranks of one job share theirs)."""
    try:
        key = repr(sorted(roots.items())) if isinstance(roots, dict) else None
    except TypeError:
        key = None
    o = _BY_ROOTS.get(key)
    if o is None:
        if len(_BY_ROOTS) > 64:
            _BY_ROOTS.clear()
        o = _BY_ROOTS[key] = Origins(roots)
    return o


def origin_of(frame) -> str:
    """A frame's recorded origin; a frame without one (another tool's, an older finding) is the user's."""
    o = frame.get("origin") if isinstance(frame, dict) else None
    return o if o in (INTERNAL, FRAMEWORK, USER) else USER


def user_frames(frames) -> list[dict]:
    """The user's own frames by their recorded origin (a frame without one is the user's), innermost last."""
    if not isinstance(frames, list):
        return []
    return [f for f in frames if type(f) is dict and origin_of(f) == USER]


def innermost_user(frames) -> int | None:
    """The index of the user's innermost own frame that is not a wrapper (a decorator of the
    user's own passes the call on: the frame that called it is the user's call)."""
    if not isinstance(frames, list):
        return None
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        if type(f) is dict and origin_of(f) == USER and not is_wrapper(f):
            return i
    return None
