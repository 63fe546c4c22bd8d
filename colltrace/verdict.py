"""The one pipeline from a snapshot to what colltrace says of it: the findings (the analyzer's
facts with their paragraphs and the other call sites of the same kind), the culprits, the
warnings and the stragglers. `colltrace analyze` (text and --json), `colltrace export`, the
watchdog's stderr and report.txt, the dashboard and the pytest guard all come here, so they say
the same of the same folder.

    from colltrace import verdict
    v = verdict.of_snapshot(snap, stall_s=30.0, now=snap["taken_at"])
    print(v.text())            # what report.txt holds
    json.dumps(v.as_json())    # what `colltrace analyze --json` prints
"""
from __future__ import annotations

from dataclasses import dataclass

from colltrace.analysis import analyze, culprits, desync, stragglers
from colltrace.callsites import samekind
from colltrace.model import schema
from colltrace.model.finding import Finding
from colltrace.reporters.text import render_verdict, summarize
from colltrace.reporters.warnings import damage_json, warning_json


@dataclass(frozen=True)
class Verdict:
    findings: list[Finding]             # most important first, each with its summary and advice
    explanation: culprits.Explanation   # the ranks whose own state explains the others' waits, and why
    warnings: list[desync.Desync]       # problems that did not hang this run (desyncs)
    stragglers: list[dict]              # who made the others wait (never a finding)
    damage: tuple = ()                  # tracefile/damage.py: files of the folder that could not be read whole

    @property
    def culprits(self) -> list[int]:
        return self.explanation.culprits

    def as_json(self) -> dict:
        return {"findings": [f.to_json() for f in self.findings], "culprits": self.culprits,
                "warnings": [warning_json(w) for w in self.warnings] + [damage_json(d) for d in self.damage],
                "stragglers": self.stragglers}

    def text(self) -> str:
        return render_verdict(self.findings, self.explanation, self.warnings, self.stragglers)


def findings_of(snap: schema.Snapshot, stall_s: float, now: float) -> list[Finding]:
    """The analysis with each finding's words: what the watchdog and the dashboard judge each round
    (the same-kind call sites, which read the user's files, are added where a finding is reported)."""
    return summarize(analyze(snap, stall_s=stall_s, now=now))


def of_snapshot(snap: schema.Snapshot, stall_s: float = 30.0, now: float | None = None,
                findings: list[Finding] | None = None, damage=()) -> Verdict:
    """The whole verdict on `snap`. findings: those already judged and reported (the watchdog's,
    superseded ones included), else judged here at `now` (default: the snapshot's time).
    damage: the folder's files that could not be read whole (warnings)."""
    if findings is None:
        findings = findings_of(snap, stall_s, snap.get("taken_at", 0.0) if now is None else now)
    samekind.annotate(findings)   # reads the user's source files: after the (pure) analysis; once per finding
    return Verdict(findings, culprits.explain(findings), desync.of_snapshot(snap), _stragglers(snap), tuple(damage))


def _stragglers(snap: schema.Snapshot) -> list[dict]:
    """Never a reason for a verdict not to be said: a live view this did not expect has none."""
    try:
        return stragglers.find(snap)
    except Exception:   # a live view this did not expect: no stragglers, the verdict still said
        return []
