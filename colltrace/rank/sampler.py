"""Rank side of "where is it while the others wait": when the watchdog asks (a rank it judged a
straggler, colltrace/tracefile/samples.py), a thread of this rank samples the main thread's stack
SAMPLE_HZ times a second until the request's time runs out, and notes every garbage collection
meanwhile (gc.callbacks: a collection holds the interpreter, so no sample sees it). Nothing runs
and nothing is written while nobody asks; the traced calls are untouched. Bounded: a rate, a
depth, and a file size after which it stops.
"""
from __future__ import annotations

import gc
import json
import sys
import threading
import time
from typing import cast

from colltrace.tracefile import samples

DEPTH = 64                 # frames kept of a sample, innermost first


class Sampler:
    """`poll()` from the recorder's poller thread (every poll period): starts or extends a burst
    of sampling when a new request came."""

    def __init__(self, directory: str, rank: int):
        self.dir, self.rank = directory, rank
        self.path = samples.samples_path(directory, rank)
        self._asked: int | None = None   # the last request's mtime (ns)
        self._until = 0.0
        self._thread: threading.Thread | None = None
        self._ids: dict[tuple, int] = {}
        self._written = 0
        self._gc_start: float | None = None
        self._gc: list = []        # pauses seen by the callback, written by the sampler thread
        self.failed = False

    def poll(self) -> None:
        if self.failed:
            return
        got = samples.asked(self.dir, self.rank)
        if got is None or got[0] == self._asked:
            return
        self._asked = got[0]
        self._until = time.time() + got[1]
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="colltrace-sampler", daemon=True)
            self._thread.start()

    def stop(self, wait: bool = True) -> None:
        self._until = 0.0
        t = self._thread
        if wait and t is not None and t is not threading.current_thread():
            t.join(timeout=1.0)

    def _on_gc(self, phase: str, info: dict) -> None:
        # Runs in whichever thread collects, with the interpreter held: only note the times.
        if phase == "start":
            self._gc_start = time.time()
        elif self._gc_start is not None:
            self._gc.append((self._gc_start, time.time()))
            self._gc_start = None

    def _pauses(self) -> list[str]:
        out = []
        while self._gc:
            a, b = self._gc.pop(0)
            out.append(f'{{"gc":[{a:.4f},{b:.4f}]}}')
        return out

    def _run(self) -> None:
        main = cast(int, threading.main_thread().ident)   # the main thread has started: its ident is set
        period = 1.0 / samples.SAMPLE_HZ
        wall0, cpu0 = time.time(), time.thread_time()
        gc.callbacks.append(self._on_gc)
        try:
            with open(self.path, "a") as f:
                while time.time() < self._until and self._written < samples.MAX_FILE_BYTES:
                    time.sleep(period)
                    frame = sys._current_frames().get(main)
                    if frame is None:   # the main thread ended
                        break
                    lines = []
                    key: list[tuple[str, int, str]] = []
                    while frame is not None and len(key) < DEPTH:
                        code = frame.f_code
                        key.append((code.co_filename, frame.f_lineno, code.co_name))
                        frame = frame.f_back
                    key_t = tuple(key)
                    sid = self._ids.get(key_t)
                    if sid is None:
                        sid = self._ids[key_t] = len(self._ids) + 1
                        lines.append(json.dumps({"s": sid, "f": [list(k) for k in reversed(key)]}))
                    lines.append(f"[{time.time():.4f},{sid}]")
                    text = "\n".join(lines + self._pauses()) + "\n"
                    f.write(text)
                    f.flush()
                    self._written += len(text)
                # A collection that ended after the last sample is still one the others waited through.
                f.write("".join(p + "\n" for p in self._pauses()))
                f.write(json.dumps({"cpu": [round(time.time() - wall0, 4),
                                            round(time.thread_time() - cpu0, 4)]}) + "\n")
        except OSError:   # a full folder: sampling steps aside, tracing goes on
            self.failed = True
        finally:
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:
                pass
