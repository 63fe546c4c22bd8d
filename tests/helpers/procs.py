"""Processes a test started: what it prints about those it is about to kill as hung, and the kill
(a tree, a process group, the watchdogs of a trace folder)."""
from __future__ import annotations

import os
import signal
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


def kill_tree(pid: int, *, walk: bool = True, group: bool = False) -> None:
    """SIGKILL for a process and what it started; one already gone is no error. walk: the process
    and all its descendants found now (psutil); group: its process group (the pid of a process
    started with start_new_session), which also reaches descendants no longer below it."""
    if walk:
        import psutil

        try:
            parent = psutil.Process(pid)
            procs = parent.children(recursive=True) + [parent]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
    if group:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_mentioning(text: str) -> None:
    """SIGKILL for every process whose command line contains `text` (a folder of the run: in every
    command line of its tree, wherever its processes were reparented)."""
    _kill_where(lambda cmd: text in " ".join(cmd))


def kill_watchdogs(directory: str) -> None:
    """Watchdogs run in their own session: end any still running for this folder."""
    _kill_where(lambda cmd: "colltrace.host" in cmd and directory in cmd)


def _kill_where(match) -> None:
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        try:
            if match(p.info.get("cmdline") or []):
                p.kill()
        except psutil.Error:
            continue


def kill_all(pid: int, directory: str) -> None:
    """The inner session, its ranks, and the watchdogs (in sessions of their own) of `directory`."""
    kill_watchdogs(directory)
    kill_tree(pid)
