"""A rank's native frames, as colltrace/rank/_crash.c writes them: `rank-N.native.txt` when the
rank takes a fatal signal (and, before an abort, the uncaught C++ exception's type and what()),
`rank-N.native-stack.txt` on colltrace's stack signal (the watchdog's question). Read here, named
by colltrace/tracefile/symbols.py, outside the process that wrote them.

The file, one line each:
  exception pid=123 type=<mangled type name>  (from std::terminate, before its abort)
  what <the exception's what(), \\n escaped>
  begin crash sig=11 code=1 addr=0x0 from=0 pid=123 tid=124 thread=0x7f.. t=1732278000.123456
  f <address> <p: the pc itself | r: a return address> <offset in the file> <dev> <inode> <path>
  end
  returned t=...                               (the program's own handler let it go on)
"""
from __future__ import annotations

import os
import re

from colltrace.tracefile import layout, symbols

# Linux's numbers (the file is written on Linux; the reader may run elsewhere)
SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}
NAMES = {v: k for k, v in SIGNALS.items()}
_FIELD = re.compile(r"(\w+)=(\S+)")


def native_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "native.txt")


def native_stack_path(directory: str, rank: int) -> str:
    return layout.rank_file(directory, rank, "native-stack.txt")


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), s)


def parse(text: str) -> list[dict]:
    """The blocks of a native file, oldest first: {"what": "crash" | "stack", "sig", "code",
    "pid", "tid", "t", "frames": [raw frame], "complete", "returned", "exception"}."""
    blocks: list[dict] = []
    exception: dict | None = None
    cur: dict | None = None
    for line in text.splitlines():
        if line.startswith("exception "):
            fields = dict(_FIELD.findall(line))
            pid = fields.get("pid", "0")
            exception = {"type": _unescape(fields.get("type", "?")), "what": None,
                         "pid": int(pid) if pid.isdigit() else 0}
        elif line.startswith("what ") and exception is not None:
            exception["what"] = _unescape(line[5:])
        elif line.startswith("begin "):
            fields = dict(_FIELD.findall(line))
            try:
                cur = {"what": line.split()[1], "sig": int(fields.get("sig", 0)), "code": int(fields.get("code", 0)),
                       "sender": int(fields.get("from", 0)), "pid": int(fields.get("pid", 0)),
                       "tid": int(fields.get("tid", 0)), "thread": int(fields.get("thread", "0"), 16),
                       "t": float(fields.get("t", 0)), "frames": [],
                       "complete": False, "returned": None, "exception": None}
            except ValueError:
                cur = None
                continue
            if cur["what"] == "crash" and exception is not None and exception["pid"] in (cur["pid"], 0):
                cur["exception"], exception = exception, None
            blocks.append(cur)
        elif line.startswith("f ") and cur is not None:
            parts = line.split(" ", 6)
            if len(parts) < 7:
                continue
            try:
                fr = {"address": int(parts[1], 16), "pc": parts[2] == "p",
                      "offset": int(parts[3], 16) if parts[3] != "?" else None,
                      "inode": int(parts[5]) if parts[5].isdigit() else None,
                      "path": parts[6] if parts[6] not in ("?", "") else None}
            except ValueError:
                continue
            cur["frames"].append(fr)
        elif line == "end" and cur is not None:
            cur["complete"] = True
        elif line.startswith("returned") and blocks:
            fields = dict(_FIELD.findall(line))
            try:
                blocks[-1]["returned"] = float(fields.get("t", 0))
            except ValueError:
                blocks[-1]["returned"] = 0.0
    if exception is not None and not any(b["exception"] for b in blocks):
        # std::terminate wrote it, and its abort did not reach a handler of colltrace's
        blocks.append({"what": "exception", "sig": 0, "code": 0, "sender": 0, "pid": exception["pid"], "tid": 0,
                       "thread": 0, "t": 0.0,
                       "frames": [], "complete": False, "returned": None, "exception": exception})
    return blocks


def frames(raw: list[dict]) -> list[dict]:
    """Raw frames -> the contract's native frames, innermost first: {"object", "symbol" (None
    where nothing names it), "offset" (hex: from the symbol's start, else from the object's)},
    with "path" (the object's full path) beside."""
    out = []
    for fr in symbols.resolve(raw):
        path = fr.get("path")
        obj = os.path.basename(path) if path and not path.startswith("[") else (path or "?")
        if fr.get("symbol") is not None:
            off = fr["symbol_offset"]
        elif fr.get("vaddr") is not None:
            off = fr["vaddr"]
        else:
            off = fr["offset"] if fr.get("offset") is not None and path else fr["address"]
        item = {"object": obj, "symbol": fr.get("symbol"), "offset": hex(off or 0)}
        if path:
            item["path"] = path
        out.append(item)
    return out


def exception_of(exc: dict | None) -> dict | None:
    """The uncaught C++ exception as read: its type demangled."""
    if not exc:
        return None
    t = str(exc.get("type") or "?")
    return {"type": symbols.demangle([t], types=True).get(t, t), "what": exc.get("what")}


def crash(text: str, pid: int | None = None) -> dict | None:
    """The rank's last fatal signal in its native file (of its own process: a forked child's is
    not the rank's): {"signal", "code", "t", "thread" (the thread that took it, as faulthandler
    names threads), "native_frames", "native_exception", "returned", "complete"}; None if none."""
    blocks = [b for b in parse(text) if b["what"] in ("crash", "exception") and (pid is None or b["pid"] in (pid, 0))]
    if not blocks:
        return None
    b = blocks[-1]
    if b["what"] == "exception":
        return {"signal": None, "code": None, "t": None, "thread": None, "native_frames": [],
                "native_exception": exception_of(b["exception"]), "returned": None, "complete": False}
    name = SIGNALS.get(b["sig"])
    return {"signal": name, "code": -b["sig"] if b["sig"] else None, "t": b["t"], "thread": b["thread"] or None,
            "native_frames": frames(b["frames"]), "native_exception": exception_of(b["exception"]),
            "returned": b["returned"], "complete": b["complete"]}


def _answers(text: str) -> list[dict]:
    """The complete answers to the stack signal, oldest first."""
    return [b for b in parse(text) if b["what"] == "stack" and b["complete"]]


def stack_written(text: str) -> bool:
    """Whether a complete answer to the stack signal is there (its frames not yet named)."""
    return bool(_answers(text))


def stack(text: str) -> list[dict] | None:
    """The native frames of the last complete answer to the stack signal, None if none yet."""
    done = _answers(text)
    return frames(done[-1]["frames"]) if done else None
