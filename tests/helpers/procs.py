"""What a test prints about processes it is about to kill as hung."""
from __future__ import annotations

import subprocess


def stacks_of(pids, limit: int = 6000) -> str:
    """Every Python thread's stack in these processes and their children (py-spy dump), for the
    message of a test that kills them as hung: where each one was, not only that it hung. A
    process py-spy cannot read (ptrace refused) says so in one line."""
    import psutil

    procs = []
    for pid in pids:
        try:
            top = psutil.Process(pid)
            procs += [top] + top.children(recursive=True)
        except psutil.Error:
            continue
    out = []
    for p in procs:
        try:
            r = subprocess.run(["py-spy", "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=10)
            text = (r.stdout or r.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"(no stack: {exc})"
        out.append(f"--- pid {p.pid}: {text[-1500:]}")
    return ("stacks before the kill:\n" + "\n".join(out))[:limit] if out else ""


def kill_all(pid, directory):
    """The inner session, its ranks, and the watchdogs (in sessions of their own) of `directory`."""
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"])
             if "colltrace.host" in (p.info.get("cmdline") or []) and directory in (p.info.get("cmdline") or [])]
    try:
        parent = psutil.Process(pid)
        procs += parent.children(recursive=True) + [parent]
    except psutil.Error:
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
