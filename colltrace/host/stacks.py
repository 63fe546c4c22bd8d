"""Live stacks of another process, from outside, with py-spy (needs no GIL and no cooperation
from the target, so it works on a rank hung in native code)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys


def py_spy() -> str | None:
    """py-spy on PATH, else beside this Python (a venv's bin not on PATH). COLLTRACE_PY_SPY names
    the binary, or "off" never to use it (where ptrace attempts are unwelcome)."""
    import os

    from colltrace import config

    chosen = config.value("py_spy")
    if chosen == "off":
        return None
    if chosen:
        return chosen if os.path.exists(chosen) else None
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return candidate if os.path.exists(candidate) else None


def dump(pid: int, native: bool = False, timeout: float = 10.0) -> dict:
    """{thread name: frames (innermost last)} plus "_main" for the main thread, or {"_error": why}."""
    exe = py_spy()
    if exe is None:
        return {"_error": "py-spy is not installed"}
    cmd = [exe, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"_error": f"py-spy timed out after {timeout:.0f} s"}
    except OSError as exc:
        return {"_error": f"py-spy failed: {exc}"}
    if out.returncode != 0:
        line = (out.stderr.strip().splitlines() or ["py-spy failed"])[-1]
        if "ptrace" in out.stderr.lower() or "permission" in out.stderr.lower():
            line += (" (py-spy needs ptrace: run as the same user with ptrace allowed, "
                     "or grant SYS_PTRACE in containers)")
        return {"_error": line}
    try:
        threads = json.loads(out.stdout)
    except ValueError:
        return {"_error": "py-spy printed something that is not JSON"}
    result = {}
    for th in threads:
        frames = [{"file": f.get("filename") or "?", "line": f.get("line") or 0, "func": f.get("name") or "?"}
                  for f in reversed(th.get("frames") or [])]
        name = th.get("thread_name") or str(th.get("thread_id"))
        result[name] = frames
        if th.get("os_thread_id") == pid or name == "MainThread":
            result["_main"] = frames
    return result


def format_text(threads: dict) -> str:
    lines = []
    for name, frames in threads.items():
        if name.startswith("_"):
            continue
        lines.append(f"Thread {name} (most recent call last):")
        lines.extend(f'  File "{f["file"]}", line {f["line"]}, in {f["func"]}' for f in frames)
    if "_error" in threads:
        lines.append(f"(no stacks: {threads['_error']})")
    return "\n".join(lines) + "\n"
