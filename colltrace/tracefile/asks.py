"""Questions from the watchdog to a rank through the trace folder, answered off the hot path.

The watchdog touches a request file; the rank's poller thread (which wakes every poll period
anyway) sees its mtime change and replaces the answer file atomically. Nothing here imports torch.
"""
from __future__ import annotations

import json
import os


class Responder:
    """Rank side: `poll()` from the recorder's poller thread; subclasses say what to answer."""

    def __init__(self, request_path: str, answer_path: str):
        self.req = request_path
        self.out = answer_path
        self.answered = 0

    def answer(self) -> dict:
        raise NotImplementedError

    def poll(self) -> None:
        try:
            asked = os.stat(self.req).st_mtime_ns
        except FileNotFoundError:
            return
        if asked == self.answered:
            return
        self.answered = asked
        data = self.answer()
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.out)
