"""The dashboard on a job that is hanging right now (4 gloo ranks, default timeouts,
COLLTRACE_ON_HANG=warn so it keeps hanging): through the job's store, from the watchdog it runs
in (COLLTRACE_DASHBOARD), and from the live trace folder."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from colltrace_dashboard.app import create_app
from colltrace_dashboard.sources import FolderSource, StoreSource

pytestmark = pytest.mark.slow
FIND_WITHIN_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hung(module_gloo_job):
    """scenarios.py stall: ranks 0-2 wait in a barrier rank 3 never enters (it sleeps)."""
    port = free_port()
    job = module_gloo_job("scenarios.py", 4, args=["stall"],
                          env={"COLLTRACE_ON_HANG": "warn", "COLLTRACE_STALL_S": "2",
                               "COLLTRACE_DASHBOARD": f"127.0.0.1:{port}",
                               "COLLTRACE_STORE": "{store}"})   # one host: published only when asked
    job.dashboard = f"http://127.0.0.1:{port}/"
    return job


def until(get, check, timeout=FIND_WITHIN_S):
    """get() until check(result) holds; the last result."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = get()
            if check(last):
                return last
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s; last: {str(last)[:2000]}")


def stall_found(view) -> bool:
    return any(f["kind"] == "stall" for f in (view or {}).get("findings", []))


def check_stall_view(view):
    (f,) = [f for f in view["findings"] if f["kind"] == "stall"]
    assert f["missing_ranks"] == "3" and "scenarios.py" in f["paragraph"]
    rows = {r["ranks"]: r for r in view["ranks"]["classes"]}
    assert (rows["0-2"]["state"], rows["0-2"]["op"], rows["0-2"]["group"]) == ("waiting", "barrier", "0")
    assert rows["0-2"]["waiting_s"][0] >= 2.0 and rows["0-2"]["alive"] is True
    assert rows["3"]["state"] == "idle" and rows["3"]["alive"] is True
    world = next(g for g in view["groups"]["rows"] if g["name"] == "0")
    assert [m["ranks"] for m in world["members"] if m["behind"]] == ["3"]


def test_through_the_jobs_store(hung):
    with TestClient(create_app(StoreSource(f"127.0.0.1:{hung.store.port}"), period_s=0.25)) as c:
        view = until(lambda: c.get("/api/view").json(), stall_found)
        assert view["source"]["kind"] == "store" and view["mode"] == "live"
        check_stall_view(view)
        # where rank 3 is instead: its live stack (py-spy, fetched by the watchdogs), in its own words
        assert "evaluate_forever" in view["findings"][0]["paragraph"]


def test_served_by_the_watchdog_itself(hung):
    url = hung.dashboard
    view = until(lambda: httpx.get(url + "api/view", timeout=5).json(), stall_found)
    assert view["source"]["kind"] == "watchdog"
    check_stall_view(view)
    metrics = {s.name: s for fam in text_string_to_metric_families(httpx.get(url + "metrics", timeout=5).text)
               for s in fam.samples if not s.labels}
    assert metrics["colltrace_hang_suspected"].value == 1.0
    page = httpx.get(url, timeout=5)
    assert page.status_code == 200 and "Stall" in page.text
    assert httpx.post(url + "api/view", timeout=5).status_code == 405
    # loopback only, and no other Host names (DNS rebinding)
    assert httpx.get(url + "api/view", headers={"Host": "evil.example"}, timeout=5).status_code == 400


def test_from_the_live_folder(hung):
    with TestClient(create_app(FolderSource(hung.dir), period_s=0.25)) as c:
        first = until(lambda: c.get("/api/view").json(), stall_found)
        assert first["mode"] == "live"
        check_stall_view(first)
        time.sleep(1.5)
        later = c.get("/api/view").json()

    def waited(v):
        return next(r for r in v["ranks"]["classes"] if r["ranks"] == "0-2")["waiting_s"][0]

    assert waited(later) >= waited(first) + 1.0          # live: the wait keeps growing
    beat = next(r for r in later["ranks"]["classes"] if r["ranks"] == "0-2")["heartbeat_age_s"][1]
    assert beat < 5.0                                     # the hung ranks' recorders still beat
