"""The dashboard's web app: the page, its JSON API under /api, /metrics, and offline API docs.

Read-only (GET only) and safe to leave running next to a job:
- with a token, every request must carry it (`Authorization: Bearer TOKEN`, or `?token=TOKEN`
  once, which is exchanged for an HttpOnly cookie and dropped from the address);
- without one (loopback binds), only loopback Host names are served (no DNS rebinding);
- strings from traces reach the page only through Jinja2 autoescaping and the script's
  textContent, and a Content-Security-Policy allows no inline script on the page;
- no route takes a path: static assets are read into memory at start-up and served by name.
"""
from __future__ import annotations

import asyncio
import hmac
import importlib.resources
import time
from contextlib import asynccontextmanager
from html import escape
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader
from prometheus_client import CONTENT_TYPE_LATEST

from colltrace import __version__
from colltrace_dashboard.feed import Feed

COOKIE = "colltrace_token"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
POLL_MS = 1000
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# Swagger UI starts itself with an inline script; that page shows the API schema, no trace data.
DOCS_CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'")
MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png",
         ".svg": "image/svg+xml"}


def _assets() -> dict[str, tuple[bytes, str]]:
    """Every asset the page and the docs need, by name, read once from the installed packages."""
    out = {}
    folders = [importlib.resources.files("colltrace_dashboard") / "static"]
    try:
        folders.append(importlib.resources.files("fastapi_offline") / "static")   # Swagger UI, no CDN
    except ModuleNotFoundError:
        pass
    for folder in folders:
        for item in folder.iterdir():
            suffix = "." + item.name.rsplit(".", 1)[-1]
            if item.is_file() and suffix in MEDIA and item.name not in out:
                out[item.name] = (item.read_bytes(), MEDIA[suffix])
    return out


def _host_name(header: str) -> str:
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def create_app(source, token: str | None = None, allowed_hosts=None, period_s: float | None = None) -> FastAPI:
    """source: one of colltrace_dashboard.sources. token: required on every request if set.
    allowed_hosts: Host names served (None: any; the server passes LOOPBACK_HOSTS when it
    binds loopback without a token)."""
    feed = Feed(source, **({"period_s": period_s} if period_s else {}))
    assets = _assets()
    templates = Jinja2Templates(env=Environment(loader=PackageLoader("colltrace_dashboard", "templates"),
                                                autoescape=True))
    templates.env.filters["clock"] = _clock

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(feed.start)   # the first read may wait on a store: off the event loop
        yield
        await asyncio.to_thread(feed.stop)

    app = FastAPI(title="colltrace dashboard", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None, description="Live view of a PyTorch distributed job traced by colltrace: "
                  "findings first, then ranks, groups and recent collectives. Read-only.")
    app.state.feed = feed

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if allowed_hosts is not None and _host_name(request.headers.get("host", "")) not in allowed_hosts:
            return _refuse(request, 400, "this dashboard answers only to loopback names (127.0.0.1, localhost); "
                                         "to serve other names, bind with a token")
        if token:
            header = request.headers.get("authorization", "")
            given = header[7:].strip() if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
            if not _same(given, token):
                query = request.query_params.get("token")
                if query is not None and _same(query, token):
                    if "text/html" not in request.headers.get("accept", ""):
                        return _harden(await call_next(request), request)   # a scraper's ?token=: serve it
                    # A browser's link with ?token= works once: trade it for a cookie, drop it from the address.
                    response = RedirectResponse(_without_token(request), status_code=303)
                    response.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                                        secure=request.url.scheme == "https", path="/")
                    return _harden(response, request)
                return _refuse(request, 401, "this dashboard needs its token: open the address with ?token=TOKEN "
                                             "once, or send the header Authorization: Bearer TOKEN",
                               {"WWW-Authenticate": "Bearer"})
        response = await call_next(request)
        return _harden(response, request)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        # A bug must not show a traceback to the page; uvicorn logs it on the server's side.
        return _refuse(request, 500, f"internal error ({type(exc).__name__}); the server's log has the details")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request):
        view, error = feed.current()
        return templates.TemplateResponse(request, "index.html", {
            "view": view, "error": error, "poll_ms": POLL_MS, "label": source.label, "version": __version__},
            status_code=200 if view is not None else 503)

    @app.get("/api/view", summary="Everything the page shows",
             description="Findings (the CLI's paragraphs and stack classes), rank classes with rank ranges, "
                         "groups' members by last entered/completed number, recent collectives. The page polls "
                         "this every second. 503 with {\"error\"} while there is nothing to show yet.")
    def api_view():
        view, error = feed.current()
        if view is None:
            return JSONResponse({"error": error or "starting"}, status_code=503)
        return {**view, "error": error}

    @app.get("/api/findings", summary="Findings as JSON (the same objects as `colltrace analyze --json`)",
             description="`findings`: the analysis of the current state; `reported`: what the job's watchdog "
                         "has reported so far (findings.jsonl, or the store).")
    def api_findings():
        _, error = feed.current()
        reading = feed.reading
        if reading is None:
            return JSONResponse({"error": error or "starting"}, status_code=503)
        return {"findings": [f.to_json() for f in reading.findings],
                "reported": [f.to_json() for f in reading.reported], "mode": reading.mode,
                "taken_at": reading.now, "error": error}

    @app.get("/api/ranks/{rank}", summary="One rank's entry in the snapshot",
             description="Its status, progress per group, recent records (oldest first) and live stack, as in "
                         "docs/design.md. 404 for a rank the job does not have.")
    def api_rank(rank: int):
        reading = feed.reading
        if reading is None:
            return JSONResponse({"error": feed.current()[1] or "starting"}, status_code=503)
        entry = (reading.snap.get("ranks") or {}).get(str(rank))
        if entry is None:
            return JSONResponse({"error": f"no rank {rank} in this job"}, status_code=404)
        return entry

    @app.get("/api/status", summary="Is the source readable, and how fresh is the view")
    def api_status():
        view, error = feed.current()
        return {"ok": error is None and view is not None, "error": error, "source": source.label,
                "kind": source.kind, "mode": view["mode"] if view else None,
                "taken_at": view["taken_at"] if view else None, "updated_at": feed.updated_at}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             description="colltrace_collectives_total{group,op}, colltrace_collective_duration_seconds, "
                         "colltrace_collectives_in_flight{group}, colltrace_rank_last_progress_timestamp_seconds"
                         "{rank}, colltrace_rank_alive{rank}, colltrace_findings_total{kind}, "
                         "colltrace_hang_suspected and more, in the text exposition format.")
    def metrics():
        return Response(feed.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        asset = assets.get(name)   # a name, never a path: only what was loaded at start-up
        if asset is None:
            return JSONResponse({"error": "no such asset"}, status_code=404)
        return Response(asset[0], media_type=asset[1], headers={"Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url="openapi.json", title="colltrace dashboard API",
                                   swagger_js_url="static/swagger-ui-bundle.js",
                                   swagger_css_url="static/swagger-ui.css", swagger_favicon_url="static/favicon.svg")

    return app


def _same(given: str | None, token: str) -> bool:
    if not given:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def _without_token(request: Request) -> str:
    kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    return request.url.path + (f"?{urlencode(kept)}" if kept else "")


def _wants_json(request: Request) -> bool:
    path = request.url.path
    return path.startswith("/api") or path == "/metrics" or "application/json" in request.headers.get("accept", "")


def _refuse(request: Request, status: int, message: str, headers=None) -> Response:
    response: Response
    if _wants_json(request):
        response = JSONResponse({"error": message}, status_code=status, headers=headers)
    else:
        body = (f"<!doctype html><meta charset=utf-8><title>colltrace dashboard</title>"
                f"<p>colltrace dashboard: {escape(message)}</p>")
        response = HTMLResponse(body, status_code=status, headers=headers)
    return _harden(response, request)


def _harden(response: Response, request: Request) -> Response:
    h = response.headers
    h.setdefault("Content-Security-Policy", DOCS_CSP if request.url.path == "/docs" else PAGE_CSP)
    h.setdefault("X-Content-Type-Options", "nosniff")
    h.setdefault("Referrer-Policy", "no-referrer")
    h.setdefault("X-Frame-Options", "DENY")
    h.setdefault("Cache-Control", "no-store")
    return response


def _clock(t) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError):
        return "?"
