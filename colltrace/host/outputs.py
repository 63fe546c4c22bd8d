"""What the watchdog writes: findings.jsonl, report.txt, snapshot.json and stack files in the
trace folder, and the paragraphs on the job's stderr. A folder that cannot be written costs one
warning; the findings still reach the stream."""
from __future__ import annotations

import json
import os
from typing import cast

from colltrace import verdict
from colltrace.model.finding import Finding
from colltrace.model.schema import Snapshot, empty
from colltrace.reporters import stacks
from colltrace.reporters import text as report
from colltrace.tracefile import layout, storage


class Outputs:
    def __init__(self, directory: str, stream):
        self.dir = directory
        self.stream = stream
        self._write_warned = False

    def say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def _write_failed(self, exc: OSError) -> None:
        # A full or read-only folder: the findings still reach stderr (and the store); say so once.
        if not self._write_warned:
            self._write_warned = True
            self.say(f"colltrace: warning: cannot write to {self.dir}: {storage.describe(exc)}; "
                     "findings go to this output only")

    def findings(self, new: list[Finding], reported: list[Finding], snap: Snapshot) -> None:
        """New findings: each finding's paragraph and stack classes on the stream first (on a
        large job the files take a second more), then appended to findings.jsonl, the snapshot
        and report rewritten."""
        for finding in new:
            classes = stacks.render_stack_classes(finding)
            self.stream.write("\n" + report.paragraph(finding) + "\n" + (classes + "\n" if classes else ""))
            if finding.supersedes:
                self.stream.write(report.supersedes_line(finding) + "\n")
        self.stream.flush()
        try:
            with open(os.path.join(self.dir, layout.FINDINGS), "a") as f:
                for finding in new:
                    f.write(json.dumps(finding.to_json(), default=str) + "\n")
            self.json(layout.SNAPSHOT, snap)
            self.report(reported, snap)
        except OSError as exc:
            self._write_failed(exc)
        self.say(f"colltrace: details in {self.dir}/report.txt; run: colltrace analyze {self.dir}")

    def report(self, reported: list[Finding], snap: Snapshot | None = None) -> None:
        """report.txt: the verdict in the words `colltrace analyze` uses (culprits first)."""
        text = verdict.of_snapshot(snap or cast(Snapshot, dict(empty())), findings=reported).text()
        with open(os.path.join(self.dir, "report.txt"), "w") as f:
            f.write(text + "\n")

    def json(self, name: str, obj, warn: bool = True) -> None:
        """Replaced whole (written aside, then renamed): a reader never sees half a file."""
        tmp = os.path.join(self.dir, f".{name}.tmp")
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps(obj, default=str))   # json.dump streams through the pure-Python encoder: 5x slower
            os.replace(tmp, os.path.join(self.dir, name))
        except OSError as exc:   # the previous version stays whole
            if warn:
                self._write_failed(exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def stacks(self, rank: int, text: str) -> None:
        try:
            with open(layout.rank_file(self.dir, rank, "stacks.txt"), "w") as f:
                f.write(text)
        except OSError as exc:
            self._write_failed(exc)

