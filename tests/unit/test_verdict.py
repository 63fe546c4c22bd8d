"""One pipeline (colltrace/verdict.py): what the watchdog writes to report.txt is what `colltrace
analyze` prints of the same folder, and `--json` holds the same verdict's facts."""
from __future__ import annotations

import io
import json
import os
import shutil

from colltrace import verdict
from colltrace.host.outputs import Outputs
from colltrace.tracefile import postmortem
from helpers.cli import run_cli
from helpers.paths import FIXTURES


def test_report_txt_and_colltrace_analyze_say_the_same_of_one_folder(tmp_path):
    folder = tmp_path / "job"
    shutil.copytree(os.path.join(FIXTURES, "distill-checkpoint-barrier"), folder)
    snap = postmortem.load(str(folder))
    # the watchdog's side: the findings it judged and reported, then report.txt from them
    reported = verdict.findings_of(snap, 30.0, snap["taken_at"])
    assert reported, "the fixture holds a hang"
    Outputs(str(folder), io.StringIO()).report(reported, snap)
    live = (folder / "report.txt").read_text()
    out = run_cli("analyze", str(folder))
    assert out.returncode == 1 and out.stdout == live
    assert live.startswith("Culprits: ") and "The same kind elsewhere" not in live.split("\n", 1)[0]
    doc = json.loads(run_cli("analyze", str(folder), "--json").stdout)
    v = verdict.of_snapshot(snap, now=snap["taken_at"])
    assert doc["culprits"] == v.culprits and [f["key"] for f in doc["findings"]] == [f.key for f in v.findings]
    assert doc["findings"] == [f.to_json() for f in v.findings]
    assert doc["findings"][0]["summary"] == v.findings[0].summary and doc["stragglers"] == v.stragglers == []
