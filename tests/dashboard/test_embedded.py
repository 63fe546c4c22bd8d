"""The dashboard inside the watchdog (COLLTRACE_DASHBOARD): fed by its rounds, and never a
danger to it."""
from __future__ import annotations

import dataclasses
import io
import socket
import time

import httpx

from colltrace import config
from colltrace.commands.dashboard import watchdog_starter
from colltrace.host.watchdog import Watchdog


def watchdog(directory, bind) -> tuple[Watchdog, io.StringIO]:
    stream = io.StringIO()
    settings = dataclasses.replace(config.load({}), dashboard=bind, stall_s=2.0)
    return Watchdog(directory, job=None, host=None, settings=settings, once=True, stream=stream,
                    start_dashboard=watchdog_starter()), stream


def eventually(check, timeout=30.0):
    """The watchdog starts its dashboard from a thread (its imports take a second)."""
    deadline = time.time() + timeout
    while not check() and time.time() < deadline:
        time.sleep(0.05)
    return check()


def test_serves_the_watchdogs_own_rounds(copy_of):
    w, stream = watchdog(copy_of("deadlock"), ("127.0.0.1", 0))
    try:
        w.step()
        assert eventually(lambda: w.dashboard), stream.getvalue()
        url = w.dashboard.url
        assert f"colltrace: dashboard at {url}" in stream.getvalue()
        view = httpx.get(url + "api/view", timeout=10).json()
        assert view["source"]["kind"] == "watchdog"
        findings = w.view().findings
        assert [f["key"] for f in view["findings"]] == [f.key for f in findings] and findings
        assert sorted(r["ranks"] for r in view["ranks"]["classes"]) == ["0-2", "3"]
    finally:
        if w.dashboard:
            w.dashboard.stop()


def test_a_port_in_use_is_one_warning_and_the_watchdog_goes_on(copy_of):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        w, stream = watchdog(copy_of("deadlock"), ("127.0.0.1", busy.getsockname()[1]))
        assert w.run() == 1                       # it still found the deadlock
        assert eventually(lambda: "no dashboard" in stream.getvalue())
    warnings = [line for line in stream.getvalue().splitlines() if "dashboard" in line]
    assert len(warnings) == 1 and warnings[0].startswith("colltrace: warning: no dashboard: cannot listen on")
    assert w.dashboard is False and any(f.kind == "deadlock" for f in w.findings)


def test_without_a_token_it_does_not_serve_the_network(copy_of):
    w, stream = watchdog(copy_of("deadlock"), ("0.0.0.0", 0))
    assert w.run() == 1
    assert eventually(lambda: "no dashboard" in stream.getvalue())
    assert w.dashboard is False
    assert "colltrace: warning: no dashboard: serving on 0.0.0.0" in stream.getvalue() and "token" in stream.getvalue()


def test_subscribers_get_each_round_and_a_failing_one_never_stops_the_watchdog(copy_of):
    """What embedders use instead of the watchdog's internals: view(), subscribe(), processes()."""
    w, stream = watchdog(copy_of("deadlock"), None)
    rounds = []
    w.subscribe(lambda view, new: rounds.append((view, [f.key for f in new])))
    w.subscribe(lambda view, new: 1 / 0)
    assert w.view() is None
    w.step()
    w.step()
    assert len(rounds) == 2
    (first, new1), (second, new2) = rounds
    assert new1 and new1 == [f.key for f in first.reported]   # the deadlock, new in the first round
    assert any(f.kind == "deadlock" for f in first.findings) and first.snapshot["ranks"]
    assert new2 == [] and [f.key for f in second.reported] == new1   # reported once
    assert w.view() is second
    assert stream.getvalue().count("colltrace: watchdog subscriber failed (continuing): ZeroDivisionError") == 2
    assert sorted(p.rank for p in w.processes()) == [0, 1, 2, 3] and all(p.pid for p in w.processes())
