"""Builds colltrace's optional compiled parts when the package is installed, with the compilers
Python itself was built with. Neither ever fails the install: without one, a warning says so.
  - the hot path (colltrace/rank/_fastpath.c): with no C compiler the Python wrappers are used
    (the same records, at about 6x colltrace's cost per collective);
  - a crash's native frames (colltrace/rank/_crash.c, with _terminate.cpp where a C++ compiler
    links it: the uncaught C++ exception behind an abort): without it a dead rank is told by its
    signal and Python frames only.

From a checkout, with no install and no network (hatchling not needed):
`python hatch_build.py` builds both in place, next to their sources, for the Python that runs it
(CONTRIBUTING.md, "From a checkout"). Python 3.10 to 3.13 and newer."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:   # `python hatch_build.py` in a checkout: build() alone is used
    BuildHookInterface = object

SOURCE = os.path.join("colltrace", "rank", "_fastpath.c")
CRASH = os.path.join("colltrace", "rank", "_crash.c")
TERMINATE = os.path.join("colltrace", "rank", "_terminate.cpp")


def _run(cmd: list[str]) -> str | None:
    """None if the command succeeded, else its last line of error."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["?"])[-1]
    return None


def build_crash(root: str, out_dir: str, tmp: str) -> tuple[str | None, str | None]:
    """colltrace/rank/_crash*.so -> (its path or None, a warning or None). The C++ terminate
    handler is linked in where a C++ compiler builds it; the C part alone otherwise."""
    inc = f"-I{sysconfig.get_paths()['include']}"
    ccshared = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    cxx = shlex.split(sysconfig.get_config_var("CXX") or "c++")
    ldcxx = shlex.split(sysconfig.get_config_var("LDCXXSHARED") or f"{cxx[0]} -shared")
    ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
    out = os.path.join(out_dir, "_crash" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    c_obj, cxx_obj = os.path.join(tmp, "_crash.o"), os.path.join(tmp, "_terminate.o")
    err = _run([*cc, *ccshared, "-O2", inc, "-c", os.path.join(root, CRASH), "-o", c_obj])
    if err is None:
        err = _run([*cxx, *ccshared, "-O2", "-c", os.path.join(root, TERMINATE), "-o", cxx_obj])
        if err is None:
            err = _run([*ldcxx, c_obj, cxx_obj, "-o", out])
            if err is None:
                return out, None
    # no C++: the C part alone (no uncaught exception's message)
    err2 = _run([*ldshared, *ccshared, "-O2", "-DCOLLTRACE_NO_CXX", inc, os.path.join(root, CRASH), "-o", out])
    if err2 is None:
        return out, f"colltrace: a crash's C++ exception will not be read ({err})"
    return None, f"colltrace: a crash's native frames will not be kept ({err2})"


def build(root: str) -> tuple[str | None, str]:
    """Compile the hot path into colltrace/rank/ under `root`: (the module's path, "") or (None, why not)."""
    if sys.version_info < (3, 10):
        return None, "it needs Python >= 3.10"
    src = os.path.join(root, SOURCE)
    name = "_fastpath" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    out = os.path.join(root, "colltrace", "rank", name)
    ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
    ccshared = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    cmd = [*ldshared, *ccshared, "-O2", f"-I{sysconfig.get_paths()['include']}", src, "-o", out]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or ["?"])[-1]
    return out, ""


class FastPathHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        self._crash(version, build_data)
        out, why = build(self.root)
        if out is None:
            self.app.display_warning(f"colltrace: the compiled hot path was not built ({why}); using the Python wrappers")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":   # an editable install imports it from the checkout, where it was built
            build_data["force_include"][out] = f"colltrace/rank/{os.path.basename(out)}"

    def _crash(self, version, build_data):
        import tempfile

        out_dir = os.path.join(self.root, "colltrace", "rank")
        with tempfile.TemporaryDirectory() as tmp:
            out, warning = build_crash(self.root, out_dir, tmp)
        if warning:
            self.app.display_warning(warning)
        if out is None:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][out] = f"colltrace/rank/{os.path.basename(out)}"


if __name__ == "__main__":
    import tempfile

    root = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        crash, warning = build_crash(root, os.path.join(root, "colltrace", "rank"), tmp)
    if warning:
        sys.stderr.write(warning + "\n")
    if crash:
        sys.stderr.write(f"colltrace: built {crash}\n")
    path, why = build(root)
    if path is None:
        sys.stderr.write(f"colltrace: the compiled hot path was not built ({why}); the Python wrappers will be used\n")
        sys.exit(1)
    sys.stderr.write(f"colltrace: built {path}\n")
