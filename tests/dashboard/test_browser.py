"""A real browser (Debian's headless chromium, driven by Playwright) on the dashboard of a job
that hangs while the page is open."""
from __future__ import annotations

import os
import sys

import pytest

from helpers.dashboard import clean_env, colltrace_cmd
from helpers.paths import JOBS

pytestmark = pytest.mark.slow
APPEAR_S = 90     # the finding must show up within this, without a reload


def track_documents(page) -> list[str]:
    """Every document the page loads: one, unless something reloads it."""
    docs: list[str] = []
    page.on("request", lambda req: docs.append(req.url) if req.resource_type == "document" else None)
    return docs


def test_the_finding_appears_without_a_reload(spawn, browser, tmp_path):
    """`colltrace run --dashboard` on the cross-group deadlock: the page is open before the
    ranks start; the verdict arrives by itself."""
    trace_dir = str(tmp_path / "trace")
    cmd = colltrace_cmd("run", "--dir", trace_dir, "--dashboard", "127.0.0.1:0", "--on-hang", "warn", "--",
                        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        os.path.join(JOBS, "scenarios.py"), "deadlock")
    run = spawn(cmd, watch_dir=trace_dir)
    url = run.wait_for(r"colltrace: dashboard at (http://127\.0\.0\.1:\d+/)", timeout=60).group(1)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    docs = track_documents(page)
    page.goto(url)
    assert page.locator("#findings article").count() == 0               # nothing found yet
    finding = page.locator("#findings article.kind-deadlock")
    finding.wait_for(timeout=APPEAR_S * 1000)
    text = finding.inner_text()
    assert "Deadlock across groups 0 and 2" in text
    assert "scenarios.py" in text and "save_checkpoint" in text and "teacher_gather" in text
    assert page.locator("#headline").inner_text() == "1 finding"
    assert page.locator("#rank-rows tr").count() == 2                   # ranks 0-2 | rank 3
    assert page.locator("tr.laggard").count() >= 1
    assert docs == [url], f"the page was reloaded: {docs}"
    page.locator("#timeline-rows .ev.st-waiting").first.wait_for(timeout=10_000)
    shot = os.environ.get("COLLTRACE_SCREENSHOT") or str(tmp_path / "dashboard.png")
    page.screenshot(path=shot, full_page=True)
    assert os.path.getsize(shot) > 10_000


def test_trace_strings_show_as_text(spawn, gloo_job, browser):
    """A collective called from a function named <script>…</script> in a file named <img …>.py:
    the names show as text, in the page as served and as updated by its script; nothing runs."""
    job = gloo_job("evil_names.py", 2, env={"COLLTRACE_ON_HANG": "warn", "COLLTRACE_STALL_S": "2"})
    os.makedirs(job.dir, exist_ok=True)                 # the ranks may not have made it yet
    dash = spawn(colltrace_cmd("dashboard", job.dir, "--port", "0"), env=clean_env())
    url = dash.wait_for(r"at (http://127\.0\.0\.1:\d+/)", timeout=60).group(1)
    page = browser.new_page()
    docs = track_documents(page)
    page.goto(url)
    page.locator("#findings article.kind-stall").wait_for(timeout=APPEAR_S * 1000)   # arrives by the script
    assert docs == [url]
    for how in ("updated", "served"):
        paragraph = page.locator("#findings article.kind-stall .paragraph").inner_text()
        assert "<script>window.__pwned=1</script>" in paragraph, how
        assert "<img src=x onerror=window.__pwned=2>.py" in paragraph, how
        assert "<script>window.__pwned=1</script>" in page.locator("#rank-rows").inner_text(), how
        assert page.evaluate("() => window.__pwned") is None, how
        assert page.locator("main script, main img").count() == 0, how
        page.reload()                                    # now as rendered by the server's template
        page.locator("#findings article.kind-stall").wait_for(timeout=10_000)


def test_a_group_members_states_read_as_words_as_the_script_renders_them(spawn, recorded, browser):
    """The Groups table as the page's script redraws it (not only as served): "dead, waiting in
    #3", the API's words, never two states run together."""
    import re

    import httpx

    dash = spawn(colltrace_cmd("dashboard", recorded["deadlock"], "--port", "0"), env=clean_env())
    url = dash.wait_for(r"at (http://127\.0\.0\.1:\d+/)", timeout=60).group(1)
    view = httpx.get(url + "api/view", timeout=10).json()
    says = [m["says"] for g in view["groups"]["rows"] for m in g["members"]]
    page = browser.new_page()
    page.goto(url)
    page.wait_for_function("() => Number(document.body.dataset.renders || 0) >= 1", timeout=30_000)
    cells = page.locator("table.groups tr.member td:last-child").all_inner_texts()
    assert cells == says and any(", waiting in #" in c for c in cells), cells
    assert not [c for c in cells if re.search(r"\w(waiting in|behind by)", c)], cells
