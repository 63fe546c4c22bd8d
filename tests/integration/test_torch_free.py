"""The analysis side runs where torch is not installed: a laptop holding a folder copied from a
cluster. Every module of the packages that read, analyze and report imports with torch made
unimportable, and `colltrace analyze` / `export` give their findings there."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.paths import FIXTURES

TORCH_FREE = ["colltrace.analysis", "colltrace.reporters", "colltrace.model", "colltrace.tracefile",
              "colltrace.callsites", "colltrace.commands"]

PROBE = r"""
import importlib, importlib.abc, io, json, pkgutil, sys
from contextlib import redirect_stdout

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is not installed here ({name})")
        return None

sys.meta_path.insert(0, NoTorch())
packages, fixtures, out_file = json.loads(sys.argv[1])
imported = []
for pkg_name in packages:
    pkg = importlib.import_module(pkg_name)
    imported.append(pkg_name)
    for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
for name in ("colltrace.cli", "colltrace.errors", "colltrace.address", "colltrace.config", "colltrace.origins",
             "colltrace.words"):
    importlib.import_module(name)
    imported.append(name)
from colltrace import cli
results = {}
for name, folder in fixtures.items():
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["analyze", folder, "--json"])
    results[name] = (rc, json.loads(buf.getvalue()))
rc_export = cli.main(["export", fixtures["distill"], "--perfetto", out_file])
print(json.dumps({"imported": imported, "results": results, "export": rc_export,
                  "torch": any(m == "torch" or m.startswith("torch.") for m in sys.modules)}))
"""


def test_reading_analyzing_and_reporting_need_no_torch(tmp_path):
    fixtures = {"distill": os.path.join(FIXTURES, "distill-checkpoint-barrier"),
                "flight_recorder": os.path.join(FIXTURES, "fr-gloo", "mismatch")}
    out_file = str(tmp_path / "timeline.json")
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps([TORCH_FREE, fixtures, out_file])],
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["torch"] is False
    for module in ("colltrace.analysis.findings", "colltrace.reporters.text", "colltrace.model.build",
                   "colltrace.tracefile.reader", "colltrace.tracefile.frdump", "colltrace.commands.analyze"):
        assert module in got["imported"]
    rc, doc = got["results"]["distill"]
    # the barrier rank 3 never joins
    assert rc == 1 and [f["kind"] for f in doc["findings"]] == ["deadlock"] and doc["culprits"] == [0, 1, 2]
    rc, doc = got["results"]["flight_recorder"]
    assert rc == 1 and any(f["kind"] == "mismatch" for f in doc["findings"])
    assert got["export"] == 0
    with open(out_file) as fh:
        assert json.load(fh)["traceEvents"]
