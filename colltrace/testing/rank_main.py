"""One rank of a @pytest.mark.distributed test:

    python .../colltrace/testing/rank_main.py SPEC RANK

(run by path, not with -m, so that no runpy frames stand above the test in the rank's stacks)

Joins the job (rank 0 hosts its TCPStore), imports the test's module from its file (with
pytest's assertion rewriting, so a failed assert says what the values were), calls the test
function with the rank's fixtures, and writes its outcome for the parent to read. A failure
ends the rank with code 1; it is recorded in the rank's trace as its exception, but not printed
again on stderr (the parent shows it in pytest's format).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

STORE_WAIT_S = 300.0   # how long ranks wait for rank 0 to publish the store's port


class Groups:
    """The `groups` fixture: process groups for the test. Creating a group is collective, as in
    torch: every rank calls it, in the same order, even ranks that are not members."""

    def __init__(self, dist, timeout=None):
        self._dist = dist
        self._timeout = timeout

    @property
    def world(self):
        return self._dist.group.WORLD

    def new(self, ranks=None, **kwargs):
        """dist.new_group(ranks, ...), with the marker's timeout when it gives one."""
        if self._timeout is not None:
            kwargs.setdefault("timeout", self._timeout)
        return self._dist.new_group(ranks, **kwargs)

    def mesh(self, *shape, names=None):
        """A CPU DeviceMesh over all ranks, e.g. groups.mesh(2, 2, names=("dp", "tp"))."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh("cpu", tuple(shape), mesh_dim_names=names)


def _die_with_parent(parent: int) -> None:
    """Linux: this rank gets SIGKILL if pytest dies (even os._exit, even SIGKILL)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the line above
            os._exit(1)
    except Exception:  # no libc prctl (not Linux): the rank may then outlive pytest
        pass


def _write(spec: dict, rank: int, outcome: dict) -> None:
    path = os.path.join(spec["dir"], f"rank-{rank}.outcome.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(outcome, rank=rank, t=time.time()), f)
    os.replace(tmp, path)


def _note_exception(exc: BaseException, error: str) -> None:
    """What an uncaught exception would leave in the rank's trace (colltrace's excepthook)."""
    rec = getattr(sys.modules.get("colltrace.rank.shim"), "recorder", None)
    if rec is None:
        return
    try:
        import traceback

        frames = [{"file": f.filename, "line": f.lineno, "func": f.name}
                  for f in traceback.extract_tb(exc.__traceback__)]
        rec.defs.write({"k": "exception", "t": time.time(), "type": type(exc).__name__,
                        "message": error.split(": ", 1)[-1] if error.startswith(type(exc).__name__) else error,
                        "frames": frames})
    except Exception:  # a trace file gone or full: the outcome file still says it
        pass


def _load_module(name: str, path: str):
    mod = sys.modules.get(name)
    if mod is not None and os.path.realpath(getattr(mod, "__file__", "") or "") == os.path.realpath(path):
        return mod
    import importlib
    import importlib.util

    if "." in name:
        try:  # the test's package first, for its relative imports
            importlib.import_module(name.rsplit(".", 1)[0])
        except Exception:  # a package that fails to import: the module's own import says why, below
            pass
    code = None
    try:  # pytest's assertion rewriting, as in the pytest process
        import ast

        from _pytest.assertion.rewrite import rewrite_asserts

        with open(path, "rb") as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path, None)
        code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:  # a pytest without this rewrite API, a source it cannot rewrite: plain asserts
        code = None  # plain asserts then
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None   # a test module's .py file: a source loader's
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    if code is not None:
        exec(code, mod.__dict__)
    else:
        spec.loader.exec_module(mod)
    return mod


def _load_function(spec: dict):
    obj = _load_module(spec["module_name"], spec["module_path"])
    if spec["cls"]:
        for part in spec["cls"].split("."):
            obj = getattr(obj, part)
        obj = obj()  # a fresh instance, as pytest makes one per test
    return getattr(obj, spec["func"])


def _store(spec: dict, rank: int, timeout):
    from torch.distributed import TCPStore

    n = spec["world_size"]
    port_file = os.path.join(spec["dir"], "store.port")
    kw = {"timeout": timeout} if timeout is not None else {}
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, n, is_master=True, wait_for_workers=False, **kw)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(store.port))
        os.replace(port_file + ".tmp", port_file)
        return store
    deadline = time.time() + STORE_WAIT_S
    while not os.path.exists(port_file):
        if time.time() > deadline:
            raise RuntimeError(f"rank 0 did not start the job's store within {STORE_WAIT_S:.0f} s")
        time.sleep(0.02)
    with open(port_file) as f:
        port = int(f.read())
    return TCPStore("127.0.0.1", port, n, is_master=False, **kw)


def _format(exc: BaseException, spec: dict) -> str:
    """pytest's own rendering, from the test file on; Python's if that fails."""
    try:
        from _pytest._code import ExceptionInfo

        info = ExceptionInfo.from_exception(exc)
        tb = info.traceback
        cut = tb.cut(path=spec["module_path"])
        info.traceback = (cut if len(cut) else tb).filter(info)
        return str(info.getrepr(style=spec.get("tbstyle", "long"), funcargs=False, truncate_locals=True, chain=True))
    except Exception:  # a pytest whose rendering fails: Python's traceback instead
        import traceback

        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, rank = argv[0], int(argv[1])
    import pickle

    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    _die_with_parent(spec["parent"])
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    phase = "setup"
    try:
        fn = _load_function(spec)
        from datetime import timedelta

        import torch.distributed as dist

        timeout = timedelta(seconds=spec["timeout"]) if spec["timeout"] else None
        store = _store(spec, rank, timeout)
        kw: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        dist.init_process_group(spec["backend"], store=store, rank=rank, world_size=spec["world_size"], **kw)
        own = {"rank": rank, "world_size": spec["world_size"], "groups": Groups(dist, timeout)}
        kwargs = dict(spec["args"], **{k: own[k] for k in spec["runner_args"]})
        phase = "call"
        fn(**kwargs)
    except BaseException as exc:  # the test's failure, whatever it is (SystemExit, KeyboardInterrupt too): its outcome
        skipped = getattr(sys.modules.get("pytest"), "skip", None)
        if skipped is not None and isinstance(exc, skipped.Exception):
            _write(spec, rank, {"outcome": "skipped", "reason": str(getattr(exc, "msg", exc))})
            return 0
        try:
            from _pytest._code import ExceptionInfo

            error = ExceptionInfo.from_exception(exc).exconly().splitlines()[0]
        except Exception:  # a pytest without ExceptionInfo (or failing on it): Python's one line
            error = f"{type(exc).__name__}: {exc}"
        _write(spec, rank, {"outcome": "failed", "phase": phase, "error": error, "traceback": _format(exc, spec)})
        _note_exception(exc, error)
        return 1
    _write(spec, rank, {"outcome": "passed"})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run by path: this folder must not shadow top-level modules
    sys.exit(main())
