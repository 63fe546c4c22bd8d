"""The dashboard's HTTP side with FastAPI's TestClient, on trace folders recorded from real jobs,
on damaged and partial folders, and on a synthetic 1,024-rank snapshot."""
from __future__ import annotations

import html as html_mod
import json
import os
import re
import time

from fastapi.testclient import TestClient

from colltrace.cli import main as cli_main
from colltrace_dashboard.app import LOOPBACK_HOSTS, create_app
from colltrace_dashboard.sources import FolderSource, Reading
from helpers.dashboard import StaticSource, synthetic_snapshot


def client(source, **kw) -> TestClient:
    return TestClient(create_app(source, **kw))


def cli(capsys, *args) -> tuple[int, str]:
    rc = cli_main(list(args))
    return rc, capsys.readouterr().out


# -- a recorded post-mortem folder ------------------------------------------------------------------
def test_verdict_is_the_clis_paragraph_and_stack_classes(recorded, capsys):
    rc, text = cli(capsys, "analyze", recorded["deadlock"])
    assert rc == 1
    with client(FolderSource(recorded["deadlock"])) as c:
        view = c.get("/api/view").json()
    assert view["mode"] == "post-mortem" and view["verdict"]["problems"] == 1
    (f,) = view["findings"]
    assert f["kind"] == "deadlock"
    assert f["paragraph"] in text            # the same words `colltrace analyze` prints
    assert f["stacks"] and all(f"{s['ranks']}:" in text and s["stack"] in text for s in f["stacks"])
    assert [s["ranks"] for s in f["stacks"]] == ["ranks 0-2", "rank 3"]


def test_findings_api_gives_the_same_objects_as_analyze_json(recorded, capsys):
    rc, out = cli(capsys, "analyze", recorded["deadlock"], "--json")
    expected = json.loads(out)["findings"]
    with client(FolderSource(recorded["deadlock"])) as c:
        got = c.get("/api/findings").json()
    assert [(f["kind"], f["key"], f["summary"]) for f in got["findings"]] == \
           [(f["kind"], f["key"], f["summary"]) for f in expected]
    assert {f["kind"] for f in got["reported"]} >= {"deadlock"}    # findings.jsonl, as the watchdog wrote it


def test_rank_and_group_views_name_who_waits_where_and_who_is_behind(recorded):
    with client(FolderSource(recorded["deadlock"])) as c:
        view = c.get("/api/view").json()
    rows = {r["ranks"]: r for r in view["ranks"]["classes"]}
    assert set(rows) == {"0-2", "3"}
    assert (rows["0-2"]["op"], rows["0-2"]["group"], rows["0-2"]["seq"]) == ("barrier", "0", "3")
    assert rows["0-2"]["where"].startswith("scenarios.py:") and "save_checkpoint" in rows["0-2"]["where"]
    assert (rows["3"]["op"], rows["3"]["state"]) == ("gather", "waiting")
    assert all(r["alive"] is False for r in rows.values())     # ended by COLLTRACE_ON_HANG=abort
    world = next(g for g in view["groups"]["rows"] if g["name"] == "0")
    laggards = [m for m in world["members"] if m["behind"]]
    assert [(m["ranks"], m["entered"], m["behind"]) for m in laggards] == [("3", 2, 1)]
    (row_a, row_b) = view["timeline"]["rows"]
    assert [e["op"] for e in row_a["events"]][-1] == "barrier" and row_b["events"][-1]["op"] == "gather"


def test_a_group_members_states_read_as_separate_words(recorded):
    """Ranks ended by the abort while waiting in the barrier: "dead, waiting in #3" on the page and
    from the API the script renders, never "deadwaiting in #3"."""
    with client(FolderSource(recorded["deadlock"])) as c:
        page = html_mod.unescape(c.get("/").text)
        view = c.get("/api/view").json()
    world = next(g for g in view["groups"]["rows"] if g["name"] == "0")
    waiting = next(m for m in world["members"] if m["ranks"] == "0-2")
    assert waiting["note"] and waiting["says"] == f"{waiting['note']}, waiting in #3"
    cells = re.findall(r'<tr class="member[^"]*">(?:<td>.*?</td>){4}<td>(.*?)</td></tr>', page)
    says = [m["says"] for g in view["groups"]["rows"] for m in g["members"]]
    assert cells == says and not [t for t in cells if re.search(r"\w(waiting in|behind by)", t)], cells


def test_page_shows_the_verdict_first_and_is_locked_down(recorded):
    with client(FolderSource(recorded["deadlock"])) as c:
        r = c.get("/")
        view = c.get("/api/view").json()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    paragraph = view["findings"][0]["paragraph"]
    assert paragraph in html_mod.unescape(html)
    assert (html.index('id="verdict"') < html.index('id="ranks"') < html.index('id="groups"')
            < html.index('id="timeline"'))
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page must load nothing from elsewhere"


def test_healthy_folder_has_no_finding(recorded):
    with client(FolderSource(recorded["healthy"])) as c:
        view = c.get("/api/view").json()
        metrics = c.get("/metrics").text
    assert view["findings"] == [] and view["verdict"]["headline"] == "No findings in this trace"
    assert "colltrace_hang_suspected 0.0" in metrics


def test_one_rank_and_unknown_ranks(recorded):
    with client(FolderSource(recorded["deadlock"])) as c:
        r0 = c.get("/api/ranks/0")
        missing = c.get("/api/ranks/99")
        bad = c.get("/api/ranks/abc")
    assert r0.status_code == 200 and r0.json()["records"][-1]["op"] == "barrier"
    assert missing.status_code == 404 and missing.json() == {"error": "no rank 99 in this job"}
    assert bad.status_code == 422


def test_read_only_and_no_path_reaches_the_filesystem(recorded):
    with client(FolderSource(recorded["deadlock"])) as c:
        assert c.post("/api/view").status_code == 405
        assert c.put("/").status_code == 405
        assert c.delete("/api/ranks/0").status_code == 405
        assert c.get("/static/dashboard.js").status_code == 200
        for probe in ("/static/app.py", "/static/..%2fapp.py", "/static/%2e%2e%2f%2e%2e%2fsetup.py",
                      "/static/..%2F..%2Fcolltrace%2F__init__.py", "/api/ranks/..%2f..%2fetc%2fpasswd",
                      "/snapshot.json", "/findings.jsonl", "/rank-00000.ring"):
            r = c.get(probe)
            assert r.status_code in (404, 422), (probe, r.status_code)
            assert "import" not in r.text and "rank-0000" not in r.text
    methods = {m for route in create_app(FolderSource(recorded["deadlock"])).routes
               for m in getattr(route, "methods", ())}
    assert methods <= {"GET", "HEAD"}


def test_openapi_docs_are_served_from_the_package(recorded):
    with client(FolderSource(recorded["deadlock"])) as c:
        docs = c.get("/docs")
        schema = c.get("/openapi.json").json()
        js = c.get("/static/swagger-ui-bundle.js")
    assert docs.status_code == 200 and "static/swagger-ui-bundle.js" in docs.text
    assert not re.search(r"https?://(cdn|unpkg|fonts)", docs.text)
    assert js.status_code == 200 and len(js.content) > 100_000
    assert {"/api/view", "/api/findings", "/api/ranks/{rank}", "/api/status", "/metrics"} <= set(schema["paths"])
    assert set().union(*(set(p) for p in schema["paths"].values())) == {"get"}


# -- bad and partial folders --------------------------------------------------------------------------
def test_empty_folder_is_a_clear_error_then_shows_the_job_when_it_comes(tmp_path, recorded):
    import shutil

    with client(FolderSource(str(tmp_path)), period_s=0.1) as c:
        api = c.get("/api/view")
        page = c.get("/")
        assert api.status_code == 503 and "no colltrace trace files" in api.json()["error"]
        assert page.status_code == 503 and "no colltrace trace files" in page.text and "Traceback" not in page.text
        for name in os.listdir(recorded["deadlock"]):   # the job's files arrive
            shutil.copy(os.path.join(recorded["deadlock"], name), tmp_path / name)
        deadline = time.time() + 20
        while c.get("/api/view").status_code != 200 and time.time() < deadline:
            time.sleep(0.1)
        assert c.get("/api/view").json()["verdict"]["problems"] == 1


def test_missing_folder_and_corrupt_snapshot(tmp_path):
    (tmp_path / "snapshot.json").write_text("{not json")
    for d, words in ((tmp_path / "nope", "no such folder"), (tmp_path, "snapshot.json: not a readable snapshot")):
        with client(FolderSource(str(d))) as c:
            api, page = c.get("/api/view"), c.get("/")
            status = c.get("/api/status").json()
        assert api.status_code == 503 and words in api.json()["error"]
        assert page.status_code == 503 and words in page.text
        assert status["ok"] is False and words in status["error"]


def test_partial_folder_with_an_unreadable_rank(copy_of):
    d = copy_of("deadlock")
    with open(os.path.join(d, "rank-00002.ring"), "r+b") as f:
        f.write(b"\x00garbage" * 64)                      # its header is gone
    with open(os.path.join(d, "rank-00001.defs.jsonl"), "a") as f:
        f.write('{"k": "stack", "id": \n')               # a torn last line
    os.truncate(os.path.join(d, "rank-00003.ring"), 100)  # cut short
    os.remove(os.path.join(d, "snapshot.json"))            # the watchdog never wrote its view
    with client(FolderSource(d)) as c:
        api = c.get("/api/view")
        page = c.get("/")
        metrics = c.get("/metrics")
    assert api.status_code == 200 and page.status_code == 200 and metrics.status_code == 200
    rows = api.json()["ranks"]["classes"]
    unreadable = [r for r in rows if r["status"] == "unreadable"]
    assert [r["ranks"] for r in unreadable] == ["2", "3"]      # each with its own reason
    assert "not a colltrace ring" in unreadable[0]["where"] and "too short" in unreadable[1]["where"]
    assert "could not read ranks 2-3" in " ".join(f["paragraph"] for f in api.json()["findings"]).lower()


def test_a_folder_that_disappears_keeps_the_last_view_with_an_error(copy_of):
    import shutil

    d = copy_of("deadlock")
    with client(FolderSource(d), period_s=0.1) as c:
        assert c.get("/api/view").json()["verdict"]["problems"] == 1
        shutil.rmtree(d)
        deadline = time.time() + 10
        while not c.get("/api/view").json().get("error") and time.time() < deadline:
            time.sleep(0.1)
        view = c.get("/api/view").json()
    assert "no such folder" in view["error"] and view["verdict"]["problems"] == 1


# -- security ---------------------------------------------------------------------------------------
def test_token_is_required_on_every_request_and_traded_for_a_cookie(recorded):
    with client(FolderSource(recorded["deadlock"]), token="s3cret-token") as c:
        for path in ("/", "/api/view", "/metrics", "/docs", "/openapi.json", "/static/dashboard.js"):
            r = c.get(path)
            assert r.status_code == 401, path
            assert "token" in r.text and "s3cret" not in r.text
        assert c.get("/api/view", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/view", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        assert c.get("/metrics", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        assert c.get("/metrics?token=s3cret-token").status_code == 200   # a scraper's way: served as is
        assert "set-cookie" not in c.get("/metrics?token=s3cret-token").headers
        assert c.get("/api/view").status_code == 401
        r = c.get("/?token=s3cret-token&x=1", headers={"Accept": "text/html"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/?x=1"   # a browser's: a cookie instead
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert c.get("/").status_code == 200            # the cookie now
        assert c.get("/api/view").status_code == 200


def test_loopback_binds_refuse_other_host_names(recorded):
    with client(FolderSource(recorded["deadlock"]), allowed_hosts=LOOPBACK_HOSTS) as c:
        assert c.get("/api/view", headers={"Host": "attacker.example"}).status_code == 400
        assert c.get("/api/view", headers={"Host": "localhost:8765"}).status_code == 200
        assert c.get("/api/view", headers={"Host": "127.0.0.1:8765"}).status_code == 200


def test_trace_strings_are_escaped_in_the_page():
    snap = synthetic_snapshot(4)
    evil = "<script>window.__pwned=1</script>"
    for entry in snap["ranks"].values():
        for r in entry["records"]:
            r["frames"] = [{"file": "/job/<img src=x onerror=alert(1)>.py", "line": 3, "func": evil}]
    from colltrace.analysis import analyze

    reading = Reading(snap, analyze(snap, stall_s=30, now=snap["taken_at"]), snap["taken_at"], "post-mortem")
    assert reading.findings
    with client(StaticSource(reading)) as c:
        html = c.get("/").text
        view = c.get("/api/view").json()
    assert evil in view["findings"][0]["paragraph"]     # the API keeps the text as it is
    assert "<script>window" not in html and "<img src=x" not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html


# -- scale --------------------------------------------------------------------------------------------
def test_1024_ranks_stay_a_handful_of_rows(tmp_path):
    from colltrace.analysis import analyze

    snap = synthetic_snapshot(1024)
    culprit = 1024 // 2 + 3
    reading = Reading(snap, analyze(snap, stall_s=30, now=snap["taken_at"]), snap["taken_at"], "live")
    with client(StaticSource(reading)) as c:
        api = c.get("/api/view")
        page = c.get("/")
    view = api.json()
    assert view["ranks"]["total"] == 1024
    assert len(view["ranks"]["classes"]) <= 4
    waiting = next(r for r in view["ranks"]["classes"] if r["state"] == "waiting")
    assert waiting["count"] == 1023 and waiting["ranks"] == f"0-{culprit - 1},{culprit + 1}-1023"
    world = view["groups"]["rows"][0]
    assert world["name"] == "0"                                 # the group with the laggard comes first
    assert [m["ranks"] for m in world["members"] if m["behind"]] == [str(culprit)]
    assert view["groups"]["hidden"]["groups"] > 100            # the in-step groups are counted, not listed
    assert len(view["timeline"]["rows"]) <= 16
    assert page.text.count("<tr") < 80 and len(page.content) < 120_000
    assert len(api.content) < 120_000


def test_a_rank_dead_in_native_code_shows_every_native_frame():
    from colltrace import verdict
    from helpers.native import NATIVE, dead_in_native

    snap = dead_in_native(exception={"type": "std::runtime_error", "what": "bad shape"})
    reading = Reading(snap, verdict.findings_of(snap, 30.0, snap["taken_at"]), snap["taken_at"], "post-mortem")
    with client(StaticSource(reading)) as c:
        view = c.get("/api/view").json()
        page = c.get("/").text
    (f,) = [x for x in view["findings"] if x["kind"] == "dead_rank"]
    (n,) = f["native"]
    assert n["rank"] == "1" and n["caption"].endswith("; an uncaught std::runtime_error: bad shape")
    assert n["frames"][0] == "#0 libc.so.6 (memset+0x1c)  /usr/lib/libc.so.6" and len(n["frames"]) == len(NATIVE)
    assert "in libtorch_cpu.so (at::native::fill_" in f["paragraph"]
    rows = {r["ranks"]: r for r in view["ranks"]["classes"]}
    assert rows["1"]["ending"].startswith(
        "died of SIGSEGV (an uncaught std::runtime_error: bad shape) in libtorch_cpu.so")
    assert html_mod.escape("#1 libtorch_cpu.so (at::native::fill_(at::Tensor&, c10::Scalar const&)+0x2a0)") in page
