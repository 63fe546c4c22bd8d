"""The analyzer: a snapshot (plain data, docs/design.md) in, findings (docs/findings.md) out.

Pure and deterministic: no I/O, no torch, everything sorted. Used live by the watchdog and
post-mortem by `colltrace analyze`. It says facts: each finding's paragraph ("summary") and
"advice" are left empty for the reporter, which the callers that show findings ask themselves.

    from colltrace.reporters import text
    findings = text.summarize(analyze(snapshot, stall_s=30.0, now=time.time()))
    print(text.render_report(findings))

Kinds: mismatch, dead_rank, deadlock, stall (stage "arrival", "completion" or, for p2p,
"unverified"), unmatched_p2p (HANG_KINDS), and duplicate_data (ranks of a data-parallel group
fed their model identical batches, or with COLLTRACE_DIGEST sent identical bytes where each should
send its own; not a hang). Modules: view (validated view of the input; where a frame's code
comes from is colltrace/origins.py's), matching (do the ranks' calls agree), waitgraph (who waits
for whom, cycles), findings (the verdicts), evidence (what a finding says of each rank: entries,
frames, who to look at first), culprits (root causes), desync, duplicates and batches (on
healthy runs), stragglers (who made the others wait). The text of findings is
colltrace.reporters.text's job; this package never imports it (docs/design.md, "Dependency
order").
"""
from __future__ import annotations

from colltrace.analysis.findings import HANG_KINDS, Analysis
from colltrace.analysis.view import JobView, without_gc
from colltrace.model import schema
from colltrace.model.finding import Finding

__all__ = ["analyze", "HANG_KINDS"]


def analyze(snap: schema.Snapshot, stall_s: float, now: float) -> list[Finding]:
    """Every confirmed problem in the snapshot, as typed findings (colltrace/model/finding.py),
    most important first: the facts, with `summary` and `advice` empty
    (colltrace.reporters.text.summarize writes them).

    `stall_s`: how long a collective may wait for ranks that have not arrived before it is a
    stall (deadlocks, mismatches and dead ranks need no threshold). `now`: the time the
    snapshot describes (time.time() live; the snapshot's taken_at post-mortem)."""
    try:
        stall_s = max(0.0, float(stall_s))
    except (TypeError, ValueError):
        stall_s = 30.0
    try:
        now = float(now)
    except (TypeError, ValueError):
        now = float((snap or {}).get("taken_at") or 0.0) if isinstance(snap, dict) else 0.0
    with without_gc():
        return Analysis(JobView(snap), stall_s, now).run()
