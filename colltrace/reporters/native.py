"""Native frames in words (a rank's `native_frames`, innermost first: colltrace/tracefile/native.py):
the frame a verdict names, a frame as text, and every frame listed for report.txt and `dump`.

The frame named is the user's innermost library frame: the innermost one that is not the C
library, the C++ runtime, the foreign-function machinery, the interpreter or colltrace's own
handler, as long as it lies below the interpreter (a library the Python line called into);
else the innermost frame itself (a crash in libc's memset called through ctypes is memset's).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from colltrace.model.finding import Finding
from colltrace.model.parts import RankPart

# objects (by the start of their file name) that are the machinery around a library's own code
RUNTIME = ("libc.so", "libc-", "libm.so", "libpthread", "libdl.so", "librt.so", "ld-linux", "ld-musl", "ld64.so",
           "libgcc_s", "libstdc++", "libc++", "libc++abi", "libunwind", "libffi", "_ctypes")
INTERPRETER = ("python", "libpython")
OWN = os.path.join("colltrace", "rank", "_crash")   # colltrace's own handler (signal machinery)


def _object(fr: dict) -> str:
    return str(fr.get("object") or "?")


def is_interpreter(fr: dict) -> bool:
    return _object(fr).startswith(INTERPRETER)


def is_machinery(fr: dict) -> bool:
    obj = _object(fr)
    return (obj.startswith(RUNTIME) or obj.startswith("[") or is_interpreter(fr)
            or OWN in str(fr.get("path") or ""))


def valid(frames) -> list[dict]:
    return [f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else []


def named(frames) -> dict | None:
    """The frame that says where: the user's innermost library frame, else the innermost."""
    frames = valid(frames)
    for fr in frames:
        if is_interpreter(fr):
            break
        if not is_machinery(fr):
            return fr
    return frames[0] if frames else None


def frame_text(fr: dict, offset: bool = False) -> str:
    """"libc.so.6 (memset)"; with offset "libc.so.6 (memset+0x1c)"; unnamed "libc.so.6+0x9c8dc"."""
    sym = fr.get("symbol")
    if not sym:
        return f"{_object(fr)}+{fr.get('offset') or '?'}"
    return f"{_object(fr)} ({sym}{'+' + str(fr.get('offset')) if offset and fr.get('offset') else ''})"


def exception_text(exc) -> str | None:
    """"an uncaught std::runtime_error: bad shape" (the C++ exception behind an abort)."""
    if not isinstance(exc, dict) or not exc.get("type"):
        return None
    what = exc.get("what")
    return f"an uncaught {exc['type']}" + (f": {_one_line(what)}" if what else "")


def _one_line(text, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 1] + "…"


def place(e: Mapping[str, Any]) -> str:
    """" (an uncaught std::runtime_error: boom) in libx.so (f), at libc.so.6 (raise)": where a
    dead rank's native frames say it died; "" without them."""
    text = ""
    exc = exception_text(e.get("native_exception"))
    if exc:
        text += f" ({exc})"
    frames = valid(e.get("native_frames"))
    fr = named(frames)
    if fr is not None:
        text += f" in {frame_text(fr)}"
        ex = e.get("exit")
        # an abort's innermost frames are abort()'s
        if fr is not frames[0] and not (isinstance(ex, dict) and ex.get("signal") == "SIGABRT"):
            text += f" (innermost: {frame_text(frames[0])})"
    return text


def live_clause(e: RankPart) -> str:
    """" (in native code: libgloo.so (wait))": where a live rank's main thread is below Python."""
    fr = named(e.get("native_frames"))
    return f" (in native code: {frame_text(fr)})" if fr is not None else ""


def lines(frames, indent: str = "  ") -> list[str]:
    """Every frame, numbered, innermost first: "#0 libc.so.6 (memset+0x1c)  /usr/lib/.../libc.so.6"
    (an object's full path the first time it appears)."""
    out = []
    seen = set()
    for i, fr in enumerate(valid(frames)):
        path = fr.get("path")
        where = f"  {path}" if path and path not in seen else ""
        seen.add(path)
        out.append(f"{indent}#{i} {frame_text(fr, offset=True)}{where}")
    return out


def render_native_frames(f: Finding) -> str:
    """Every native frame of the finding's ranks, for report.txt ("" where none has any)."""
    blocks = []
    for rank, e in sorted(f.ranks.items(), key=lambda kv: int(kv[0]) if str(kv[0]).lstrip("-").isdigit() else 0):
        if not isinstance(e, dict):
            continue
        frames = valid(e.get("native_frames"))
        if not frames:
            continue
        when = "when it died" if e.get("state") in ("dead", "exited") or e.get("exit") else "in its live stack"
        head = f"Native frames of rank {rank} {when} (innermost first)"
        exc = exception_text(e.get("native_exception"))
        blocks.append("\n".join([head + (f"; {exc}" if exc else "") + ":"] + lines(frames)))
    return "\n".join(blocks)
