"""The job scripts under tests/integration/jobs and how tests find their lines in a trace:
`# op: NAME` markers, the user's own frame of a record, file:line sets of a finding's rank."""
from __future__ import annotations

import json
import os
import re

JOBS = os.path.join(os.path.dirname(__file__), "..", "integration", "jobs")
SCENARIOS = "scenarios.py"


def native() -> bool:
    """torch >= 2.14: c10d's collective hooks record what no wrapper sees."""
    import torch.distributed as dist

    from colltrace.rank import hooks

    return hooks.supported(dist.ProcessGroup)


def markers(script: str) -> dict[str, int]:
    """`# op: NAME` comments in a job script -> line number."""
    out = {}
    with open(os.path.join(JOBS, script)) as f:
        for i, line in enumerate(f, 1):
            m = re.search(r"# op: (\S+)", line)
            if m:
                out[m.group(1)] = i
    return out


def loc(marker: str, script: str = SCENARIOS) -> str:
    return f"{script}:{markers(script)[marker]}"


def user_line(record, script):
    """The innermost frame in the job script (the user's own call)."""
    for f in reversed(record["frames"]):
        if f["file"].endswith(script):
            return f["line"]
    return None


def frames_line(rank_info) -> set[str]:
    return {f"{os.path.basename(f['file'])}:{f['line']}" for f in rank_info.get("frames") or []}


def findings(directory: str) -> list[dict]:
    """The findings a watchdog wrote to `directory` (findings.jsonl), [] before any."""
    path = os.path.join(directory, "findings.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
