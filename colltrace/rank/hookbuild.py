"""colltrace's C++ module (_hooks.cpp): its c10d hooks (torch >= 2.14) and its readers of a group's
collective counter and of a plain tensor (every torch), built against this environment's torch by
`colltrace build-hooks`, found and loaded by the ranks.

The build cannot happen at `pip install` (pip's build isolation brings a torch of its own) nor inside
a rank (a compile at job start changes the job's timing), so it is a command of its own, run once
per environment (the Docker image runs it). A build is loaded only into the torch and Python it was
built for: its folder is named by a key of torch's version and git revision, its C++ ABI, the
interpreter's tag and the source's digest. Where there is none, the ranks register the same gates
as Python hooks (hooks.attach) and read counters and tensors through torch's Python bindings: the
same records, at c10d's Python-hook toll and the bindings' dispatch per collective.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

NAME = "colltrace_hooks"
SOURCE = Path(__file__).with_name("_hooks.cpp")
ROOT = Path(__file__).with_name("_hooks_build")   # beside the package: a build travels with its venv or image

def key() -> str:
    """What a build must match to be loaded here (torch must be importable)."""
    import torch

    parts = [torch.__version__, str(getattr(torch.version, "git_version", "")),
             f"cxx11abi={int(torch.compiled_with_cxx11_abi())}", sys.implementation.cache_tag,
             platform.machine(), hashlib.sha256(SOURCE.read_bytes()).hexdigest()]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return f"torch-{torch.__version__.replace('+', '_')}-{sys.implementation.cache_tag}-{digest}"


def library(folder: Path) -> Path:
    return folder / (NAME + (".pyd" if sys.platform == "win32" else ".so"))   # as cpp_extension names it


def built(root: Path = ROOT) -> Path | None:
    """The build for this torch and Python, if `colltrace build-hooks` made one."""
    path = library(root / key())
    return path if path.is_file() else None


def load():
    """The built module for this torch and Python, or None (none built). Raises what
    loading a build that exists raised. Called once per process (hooks._compiled_hooks keeps the
    answer, and says a failure once)."""
    path = built()
    if path is None:
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location(NAME, path)
    assert spec is not None and spec.loader is not None   # a path with the extension suffix: a loader's
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def available() -> bool:
    """Whether this torch has c10d to build against (the readers need it)."""
    import torch.distributed as dist

    return dist.is_available() and getattr(dist, "ProcessGroup", None) is not None


def supported() -> bool:
    """Whether this torch has c10d's collective hooks (2.14) for the build to register from C++."""
    import torch.distributed as dist

    return callable(getattr(getattr(dist, "ProcessGroup", None), "register_pre_hook", None))


def build(root: Path = ROOT, verbose: bool = False) -> Path:
    """Compile _hooks.cpp against this torch (torch.utils.cpp_extension: a C++ compiler and ninja),
    check the result in a process of its own, and only then put it where the ranks look. Raises
    RuntimeError with one line on failure; a build already there is replaced whole or not at all."""
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    if not verbose:   # its advice on CUDA and compilers, some of it said on import: --verbose shows it
        quiet.setLevel(logging.ERROR)
    try:
        return _build(root, verbose)
    finally:
        quiet.setLevel(level)


def _build(root: Path, verbose: bool) -> Path:
    from torch.utils import cpp_extension

    dest = root / key()
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    except OSError as exc:
        raise RuntimeError(f"{root} cannot be written ({exc.strerror or exc}); run build-hooks where colltrace "
                           "is installed writable (in the image or venv build)") from None
    try:
        ninja = _ninja_dir()
        env_path = os.environ.get("PATH", "")
        if ninja:
            os.environ["PATH"] = ninja + os.pathsep + env_path
        try:
            cpp_extension.verify_ninja_availability()
        except RuntimeError:
            raise RuntimeError("building needs ninja: pip install ninja") from None
        try:
            cpp_extension.load(NAME, sources=[str(SOURCE)], build_directory=str(work),
                               extra_cflags=["-O2"] + (["-DCOLLTRACE_C10D_HOOKS"] if supported() else []),
                               verbose=verbose)
        except Exception as exc:   # ninja's log is in exc: the compiler's first complaint is the line to show
            raise RuntimeError(f"the compile failed: {_cause(str(exc))} "
                               "(--verbose shows the compiler's output)") from None
        finally:
            os.environ["PATH"] = env_path
        lib = library(work)
        if not lib.is_file():
            raise RuntimeError(f"the compile left no {lib.name}")
        try:
            check = subprocess.run([sys.executable, "-c", _SELFTEST, str(lib)], capture_output=True, text=True,
                                   check=False, timeout=120, env={**os.environ, "COLLTRACE": "0"})
        except subprocess.TimeoutExpired:
            raise RuntimeError("the built module's check did not end within 120 s") from None
        if check.returncode != 0 or check.stdout.strip() != "ok":
            said = (check.stderr.strip().splitlines() or [check.stdout.strip() or f"exit {check.returncode}"])[-1]
            raise RuntimeError(f"the built module failed its check: {said}")
        staged = work / "ready"
        staged.mkdir()
        shutil.copy2(lib, library(staged))
        old = work / "replaced"
        try:
            if dest.exists():
                os.replace(dest, old)
            os.replace(staged, dest)
        except OSError as exc:   # another build-hooks published at the same moment: theirs stands
            if not library(dest).is_file():
                raise RuntimeError(f"{dest} cannot be written ({exc.strerror or exc})") from None
        stem = dest.name.rsplit("-", 1)[0] + "-"   # this torch and Python, an older source: never loaded again
        for stale in root.glob(stem + "*"):
            if stale != dest:
                shutil.rmtree(stale, ignore_errors=True)
        return library(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cause(log: str) -> str:
    """The line of a failed cpp_extension build that says why: the compiler's first error, or the
    shell's (no compiler), rather than ninja's command lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"error:|not found|no such file|cannot execute|fatal", line, re.IGNORECASE) \
                and not line.startswith(("Error building extension", "FAILED:")):
            return line
    return next((line for line in reversed(lines) if not line.startswith("ninja:")),
                lines[-1] if lines else "no output")


def _ninja_dir() -> str | None:
    """The pip-installed ninja's folder (an un-activated venv's bin is not on PATH)."""
    try:
        import ninja

        return getattr(ninja, "BIN_DIR", None)
    except ImportError:
        here = os.path.dirname(sys.executable)
        return here if os.path.exists(os.path.join(here, "ninja")) else None


# Run in a process of its own on a fresh build: a world of 1. The counter as read from C++ is the one
# pybind reads, before and after collectives; a plain tensor's key is its dims, dtype, device and sizes;
# other objects are left to Python. Where the build has
# hooks: one all_reduce issued where no wrapper records (both hooks fire, with c10d's arguments), then
# one with the depth set (neither fires).
_SELFTEST = textwrap.dedent("""
    import importlib.util, sys
    import torch, torch.distributed as dist
    from colltrace.rank import _fastpath
    spec = importlib.util.spec_from_file_location("colltrace_hooks", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pg, x = dist.group.WORLD, torch.ones(3)
    for n in range(3):
        assert mod.read_seq(pg) == pg._get_sequence_number_for_group(), (n, mod.read_seq(pg))
        dist.all_reduce(x)
    sub = dist.new_group([0])
    dist.barrier(group=sub)
    assert mod.read_seq(sub) == sub._get_sequence_number_for_group() != mod.read_seq(pg), mod.read_seq(sub)
    assert mod.read_seq(object()) is None and mod.read_seq(None) is None
    # the tensor key: dims, c10's ScalarType (Char 1, Float 6, Double 7), device type (CPU 0), sizes;
    # a subclass or a non-tensor is left to Python
    key = mod.read_tensor(torch.zeros(2, 3, dtype=torch.float64))
    assert key[:5] == [2, 7, 0, 2, 3] and sum(key[5:]) == 0, key
    assert mod.read_tensor(torch.ones(()))[:3] == [0, 6, 0] and mod.read_tensor(torch.ones(1, dtype=torch.int8))[1] == 1
    assert mod.read_tensor(torch.nn.Parameter(torch.ones(1))) is None and mod.read_tensor([1]) is None
    assert mod.read_tensor(torch.ones([1] * 9)) is None
    if hasattr(mod, "attach"):
        seen = []
        def pre(a): seen.append(("pre", str(a.name), len(a.input_tensors), a.op_id))
        def post(a): seen.append(("post", str(a.name), a.op_id))
        mod.attach(pg, 7, pre, post, lambda exc: seen.append(("error", repr(exc))))
        pg.allreduce([x]).wait()
        _fastpath.Local().depth = 1
        pg.allreduce([x]).wait()
        _fastpath.Local().depth = 0
        assert len(seen) == 2 and seen[0][0] == "pre" and "ALLREDUCE" in seen[0][1] and seen[0][2] == 1, seen
        assert seen[1][0] == "post" and seen[1][2] == seen[0][3], seen
        pg.unregister_pre_hook(7); pg.unregister_post_hook(7)
    dist.destroy_process_group()
    print("ok")
""")
