"""Builds colltrace's optional compiled hot path (colltrace/rank/_fastpath.c) when the package
is installed, with the compiler Python itself was built with. It never fails the install: with
no compiler, or Python < 3.11, one warning says so and the Python wrappers are used (the same
records, at about 6x colltrace's cost per collective)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("colltrace", "rank", "_fastpath.c")


class FastPathHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        if sys.version_info < (3, 11):
            self.app.display_warning("colltrace: the compiled hot path needs Python >= 3.11; using the Python wrappers")
            return
        src = os.path.join(self.root, SOURCE)
        name = "_fastpath" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
        out = os.path.join(self.root, "colltrace", "rank", name)
        ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
        ccshared = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
        cmd = [*ldshared, *ccshared, "-O2", f"-I{sysconfig.get_paths()['include']}", src, "-o", out]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.app.display_warning(f"colltrace: the compiled hot path was not built ({exc}); using the Python wrappers")
            return
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            self.app.display_warning(f"colltrace: the compiled hot path was not built ({last}); using the Python wrappers")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":   # an editable install imports it from the checkout, where it was built
            build_data["force_include"][out] = f"colltrace/rank/{name}"
