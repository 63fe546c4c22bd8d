"""Serving the app with uvicorn: in the foreground (`colltrace dashboard`) or in a thread of the
leader watchdog (COLLTRACE_DASHBOARD). The socket is bound here, before uvicorn starts, so a
port in use or a refused bind is one clear line, and port 0 gives a free port whose address is
printed."""
from __future__ import annotations

import ipaddress
import socket
import threading

import uvicorn

from colltrace.errors import ColltraceError
from colltrace_dashboard.app import LOOPBACK_HOSTS, create_app


class DashboardError(ColltraceError):
    """The dashboard cannot start (one line)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise DashboardError(f"serving on {host} makes the dashboard reachable from other machines: give it a "
                             "token (--token or COLLTRACE_DASHBOARD_TOKEN), or bind 127.0.0.1 and use an ssh tunnel")


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        raise DashboardError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


class Server:
    def __init__(self, source, host: str, port: int, token: str | None = None, period_s: float | None = None):
        check_bind(host, token)
        self.sock = bind(host, port)
        self.host = host
        self.port = self.sock.getsockname()[1]
        app = create_app(source, token=token or None, allowed_hosts=None if token else LOOPBACK_HOSTS,
                         period_s=period_s)
        self.app = app
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=2)
        self.uvicorn = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/"

    def run(self) -> None:
        """In the foreground until Ctrl-C."""
        self.uvicorn.run(sockets=[self.sock])

    def start(self) -> Server:
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]},
                                       name="colltrace-dashboard", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        try:
            self.sock.close()
        except OSError:
            pass


def start_for_watchdog(watchdog) -> Server:
    """COLLTRACE_DASHBOARD in the leader watchdog: serve its latest rounds from a thread."""
    from colltrace_dashboard.sources import WatchdogSource

    host, port = watchdog.settings.dashboard
    server = Server(WatchdogSource(watchdog), host, port, token=watchdog.settings.dashboard_token or None).start()
    watchdog.stream.write(f"colltrace: dashboard at {server.url}"
                          f"{' (token required)' if watchdog.settings.dashboard_token else ''}\n")
    watchdog.stream.flush()
    return server
