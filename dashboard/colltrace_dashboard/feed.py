"""The dashboard's current state: a thread reads the source every `period_s` and keeps the
latest view and metrics. Requests only ever read what the last round finished, so a hung job, a
store that stopped answering or a slow read never blocks a page or a scrape."""
from __future__ import annotations

import sys
import threading
import time

from colltrace.host.latecomers import Latecomers
from colltrace_dashboard import views
from colltrace_dashboard.metrics import Metrics
from colltrace_dashboard.sources import SourceError

PERIOD_S = 0.5


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


class Feed:
    def __init__(self, source, period_s: float = PERIOD_S, stream=None):
        self.source = source
        self.period_s = period_s
        self.metrics = Metrics()
        self.late = Latecomers()   # the stragglers panel and metrics (the watchdog keeps its own for its line)
        self.stream = stream or sys.stderr
        self.view: dict | None = None       # the latest good view (kept while the source fails)
        self.reading = None
        self.error: str | None = None       # why the latest round failed, if it did
        self.updated_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    def refresh(self) -> None:
        """One round: read, analyze, build the view, update the metrics. Never raises."""
        error = reading = view = None
        try:
            reading = self.source.read()
            if reading is self.reading and self.error is None:
                self.updated_at = time.time()
                return   # unchanged (a post-mortem folder): the view and metrics stand
            self.late.update(reading.snap, reading.now)
            view = views.build(reading, self.source, self.late)
            self.metrics.update(reading, self.late.new)
        except SourceError as exc:
            error = str(exc)
        except Exception as exc:  # a bug or a malformed input must not take the dashboard down
            error = f"could not read the job's state ({_one_line(exc)})"
            if error not in self._warned:
                self._warned.add(error)
                self.stream.write(f"colltrace: dashboard: {error}\n")
                self.stream.flush()
        if error is None:
            self.metrics.source_ok()
        else:
            self.metrics.source_failed()
        with self._lock:
            self.error = error
            if view is not None:
                self.view, self.reading = view, reading
            self.updated_at = time.time()

    def current(self) -> tuple[dict | None, str | None]:
        with self._lock:
            return self.view, self.error

    def start(self) -> None:
        if self._thread is not None:
            return
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="colltrace-dashboard-feed", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
