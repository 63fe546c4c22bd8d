"""The job scripts under tests/integration/jobs and how tests find their lines in a trace:
`# op: NAME` markers, the user's own frame of a record, file:line sets of a finding's rank."""
from __future__ import annotations

import json
import os
import re
import time

from helpers.paths import JOBS

SCENARIOS = "scenarios.py"


def native() -> bool:
    """torch >= 2.14: c10d's collective hooks record what no wrapper sees."""
    import torch.distributed as dist

    from colltrace.rank import hooks

    return hooks.supported(dist.ProcessGroup)


def fsdp2() -> bool:
    """FSDP2's `fully_shard` where torch has it public (2.6+; torch 2.4's private one wants CUDA)."""
    import torch.distributed.fsdp

    return hasattr(torch.distributed.fsdp, "fully_shard")


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


def wait_finding(job, kind: str, timeout: float = 60.0, shown_rank: int = 0) -> dict:
    """The job's first finding of `kind`; the job killed and `shown_rank`'s stderr shown if none
    comes before its ranks end or `timeout` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [f for f in findings(job.dir) if f["kind"] == kind]
        if found:
            return found[0]
        if all(p.poll() is not None for p in job.procs):
            break
        time.sleep(0.05)
    job.kill()
    job.wait(30)
    raise AssertionError(f"no {kind} finding; rank {shown_rank} stderr:\n{job.stderr(shown_rank)[-3000:]}")


def internal_errors_with_results_unchanged(traced, plain, ranks=(0, 1), timeout: float = 90) -> dict[int, list[str]]:
    """The same job run traced and untraced: both end cleanly and every rank prints the same RESULT
    lines (colltrace changed nothing). Returns each traced rank's "colltrace: internal error" lines."""
    assert (traced.wait(timeout) == [0] * len(ranks)
            and plain.wait(timeout) == [0] * len(ranks)), traced.stderr(0)[-3000:]
    errors = {}
    for r in ranks:
        result = [line for line in traced.stdout(r).splitlines() if line.startswith("RESULT")]
        assert result and result == [line for line in plain.stdout(r).splitlines() if line.startswith("RESULT")]
        errors[r] = [line for line in traced.stderr(r).splitlines() if line.startswith("colltrace: internal error")]
    return errors


# A record's fields a user compares between two runs: all but ids and times.
KEEP = ("group", "seq", "seq_end", "op", "backend_op", "p2p", "peer", "state", "async", "shapes", "dtypes",
        "reduce_op", "root", "count", "thread")


def records(directory: str, rank: int) -> list[dict]:
    """A rank's records as a user compares them: the KEEP fields, frames as file:line (func)."""
    from colltrace.tracefile import reader

    (tr,) = [t for t in reader.load_traces(directory) if t.rank == rank]
    out = []
    for r in tr.all_records():
        row = {k: r.get(k) for k in KEEP}
        row["frames"] = [f"{os.path.basename(f['file'])}:{f['line']} ({f['func']})" for f in r.get("frames") or []]
        out.append(row)
    return out
