"""HOST:PORT text to (host, port): the one parser for the job's store, the leader's server and
the dashboard's bind address."""
from __future__ import annotations

from colltrace.errors import UsageError


class AddressError(UsageError, ValueError):
    """Not a HOST:PORT (or [HOST:]PORT) this parser accepts."""


def parse(text: str, default_host: str | None = None, any_port: bool = False) -> tuple[str, int]:
    """"HOST:PORT" -> (host, port); IPv6 hosts in brackets ("[::1]:29500").

    `default_host`: the host when the text is a bare PORT ("8765"); without it the host is
    required. `any_port`: port 0 (pick a free one) is allowed, as for a bind address."""
    text = str(text).strip()
    host, sep, port = text.rpartition(":")
    host = host.strip().strip("[]")
    if not sep:
        host = default_host or ""
    low = 0 if any_port else 1
    if not host or not port.isdigit() or not low <= int(port) < 65536:
        form = "[HOST:]PORT" if default_host else "HOST:PORT"
        raise AddressError(f"{text!r} is not {form}")
    return host, int(port)
