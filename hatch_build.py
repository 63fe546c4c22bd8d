"""Builds colltrace's optional compiled hot path (colltrace/rank/_fastpath.c) when the package
is installed, with the compiler Python itself was built with. It never fails the install: with
no compiler one warning says so and the Python wrappers are used (the same records, at about 6x
colltrace's cost per collective).

From a checkout, with no install and no network (hatchling not needed):
`python hatch_build.py` builds it in place, next to its source, for the Python that runs it
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
        out, why = build(self.root)
        if out is None:
            self.app.display_warning(f"colltrace: the compiled hot path was not built ({why}); using the Python wrappers")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":   # an editable install imports it from the checkout, where it was built
            build_data["force_include"][out] = f"colltrace/rank/{os.path.basename(out)}"


if __name__ == "__main__":
    path, why = build(os.path.dirname(os.path.abspath(__file__)))
    if path is None:
        sys.stderr.write(f"colltrace: the compiled hot path was not built ({why}); the Python wrappers will be used\n")
        sys.exit(1)
    sys.stderr.write(f"colltrace: built {path}\n")
