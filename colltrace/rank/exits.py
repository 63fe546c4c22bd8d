"""How this rank ends: the exit calls its program makes, each with the line it was made at, and
the code its process ends with.

Python tells nobody the code of a SystemExit: sys.excepthook is not called for it, and atexit
handlers run after it was handled, without its code. So:
- sys.exit, the builtins exit() and quit() and os._exit are wrapped: each notes its code, where
  it was called from and how, then calls the original as it was called. Nothing runs until the
  program makes an exit call; no collective ever sees it.
- os._exit runs no atexit handler: its wrapper has the rank write its ending first.
- where the compiled module is built (glibc), `arm_status` registers an on_exit() handler
  (colltrace/rank/_fastpath.c) that writes the status the process passes to exit(), after
  Python's finalization: the truth where Python saw no call (`raise SystemExit(n)`, exit(n) in
  native code, a finalization that failed) and where a noted call was caught and the program
  went on.

The recorder (colltrace/rank/recorder.py) writes the ending: `ending()` says what the notes and its
own hooks know; the reader (colltrace/tracefile/reader.py) puts it together with the status line.
"""
from __future__ import annotations

import os
import sys
import threading

from colltrace.rank import patches

STACK_FRAMES = 16   # frames kept of an exit call's stack (innermost last)
MAX_NOTES = 4       # a launcher passing the code on adds a note or two

# No lock: a signal handler may call sys.exit while the main thread is inside a note (list
# operations are atomic under the GIL).
_notes: list[dict] = []        # the exit calls made on the main thread, oldest first
_patches = patches.Patches()   # sys.exit, os._exit, exit()/quit()
_writer = None                 # writer(note): the recorder's, for os._exit
_fork_hook = False


def code_of(arg) -> tuple[int, str | None]:
    """What the process ends with when SystemExit carries `arg` (Python's own rule): None is 0, an
    integer its low byte as the parent sees it, anything else 1 (printed: the message)."""
    if arg is None:
        return 0, None
    if isinstance(arg, int):
        return int(arg) & 0xFF, None
    return 1, str(arg)[:500]


def frames_of(frame, depth: int = STACK_FRAMES) -> list[dict]:
    """The stack from `frame` outwards as {"file", "line", "func"}, innermost last."""
    out: list[dict] = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append({"file": code.co_filename, "line": frame.f_lineno, "func": code.co_name})
        frame = frame.f_back
    out.reverse()
    return out


def _note(how: str, arg, frame) -> dict:
    code, message = code_of(arg)
    note = {"how": how, "code": code, "frames": frames_of(frame)}
    if message is not None:
        note["message"] = message
    _notes.append(note)
    del _notes[:-MAX_NOTES]
    return note


def last_call() -> dict | None:
    """The exit call the process is ending by: the newest one noted, taken back to the first of
    the calls just before it that passed the same code on (a launcher that catches SystemExit and
    calls sys.exit or os._exit with its code: multiprocessing's, torch's spawn), where the
    program itself decided."""
    notes = list(_notes)
    if not notes:
        return None
    chosen = notes[-1]
    for note in reversed(notes[:-1]):
        if note["code"] != chosen["code"]:
            break
        chosen = note
    return dict(chosen)


def forget() -> None:
    _notes.clear()


def _on_main_thread() -> bool:
    # SystemExit on another thread ends that thread only (threading ignores it)
    return threading.current_thread() is threading.main_thread()


def _wrap_exit(orig):
    def exit(*args, **kwargs):
        if len(args) <= 1 and not kwargs and _on_main_thread():
            try:
                _note("sys.exit", args[0] if args else None, sys._getframe(1))
            except Exception:   # a note is a nicety: the user's sys.exit runs regardless
                pass
        return orig(*args, **kwargs)

    exit.__doc__, exit.__qualname__ = orig.__doc__, orig.__name__
    patches.mark(exit, orig)
    return exit


def _wrap_quitter(orig):
    def __call__(self, *args, **kwargs):
        if len(args) <= 1 and not kwargs and _on_main_thread():
            try:
                _note(str(getattr(self, "name", "exit")) + "()", args[0] if args else None, sys._getframe(1))
            except Exception:   # a note is a nicety: the user's exit() runs regardless
                pass
        return orig(self, *args, **kwargs)

    patches.mark(__call__, orig)
    return __call__


def _wrap_os_exit(orig):
    def _exit(*args, **kwargs):
        # the process goes now, without atexit: the rank writes its ending first
        if len(args) == 1 and not kwargs and isinstance(args[0], int):
            try:
                _note("os._exit", args[0], sys._getframe(1))
                writer = _writer
                if writer is not None:
                    writer(last_call())
            except BaseException:   # a KeyboardInterrupt here too: the user's os._exit must still run
                pass
        return orig(*args, **kwargs)

    _exit.__doc__, _exit.__qualname__ = orig.__doc__, orig.__name__
    patches.mark(_exit, orig)
    return _exit


def install() -> None:
    """Wrap the exit calls (idempotent). Each wrapper calls the original as it was called."""
    global _fork_hook
    # exit() and quit() first: site defines them after the .pth files run, so a recorder started
    # at the interpreter's start (rank/early.py) finds none, and they are wrapped at the next call
    quitter = type(getattr(__import__("builtins"), "exit", None))
    if quitter.__module__ == "_sitebuiltins":   # absent under python -S
        _patches.patch(quitter, "__call__", _wrap_quitter)
    if _patches.original(sys, "exit") is not None:
        return
    _patches.patch(sys, "exit", _wrap_exit)
    _patches.patch(os, "_exit", _wrap_os_exit)
    if not _fork_hook:   # a forked child (a DataLoader worker) made none of its parent's calls
        _fork_hook = True
        os.register_at_fork(after_in_child=forget)


def uninstall() -> None:
    _patches.restore()
    detach()
    forget()


def attach(writer) -> None:
    """writer(note): writes the rank's ending as os._exit is called (the recorder's)."""
    global _writer
    _writer = writer


def detach(writer=None) -> None:
    """No writer any more (None), or not this one."""
    global _writer
    if writer is None or _writer == writer:
        _writer = None


def arm_status(fd: int) -> bool:
    """Have the process's exit status written to `fd` (its definitions file) as it ends, after
    Python's finalization: True where the compiled module could (glibc). fd -1: no more."""
    from colltrace.rank import fastpath

    hook = getattr(fastpath._fastpath, "status_hook", None)
    if hook is None:
        return False
    try:
        return bool(hook(fd))
    except OSError:
        return False
