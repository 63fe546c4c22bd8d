"""Settings, read from the environment (the CLI and the pytest plugin set the same variables).

A bad value never raises: it gives one warning on stderr and the default is used, because a
typo in a debugging aid must not stop a training job.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field

ON_HANG_CHOICES = ("warn", "dump", "abort")
DEFAULT_DIR = "colltrace-out"


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    dir: str = DEFAULT_DIR
    stall_s: float = 30.0
    on_hang: str = "warn"
    abort_stall_s: float = 0.0       # >0: abort also ends a stall whose missing ranks still move, after this long
    ring_slots: int = 65536          # 64-byte slots: 4 MiB of recent events per rank
    defs_max_bytes: int = 64 << 20   # interned stacks and signatures, per rank
    stack_depth: int = 48
    digest_bytes: int = 0            # >0: CRC-32 of collective inputs up to this size (COLLTRACE_DIGEST)
    batches: bool = True             # COLLTRACE_BATCHES=0: no sampling of what DDP/FSDP models are fed (duplicate_data)
    watchdog: str = "auto"           # auto: the first rank on a host starts one; "off"/"external"
    poll_s: float = 0.1
    host: str = field(default_factory=socket.gethostname)
    dashboard: tuple[str, int] | None = None   # COLLTRACE_DASHBOARD=[HOST:]PORT: the leader watchdog serves it
    dashboard_token: str = field(default="", repr=False)
    user_packages: tuple[str, ...] = ()   # installed packages that are the user's own code (COLLTRACE_USER_PACKAGES)
    pure: bool = False               # COLLTRACE_PURE=1: the Python wrappers only, not the compiled hot path
    hooks: bool = True               # COLLTRACE_HOOKS=0: on torch >= 2.14, no c10d hooks (the wrappers only, as on 2.13)
    hooks_compiled: bool = True      # COLLTRACE_HOOKS=python: the hooks registered from Python even where build-hooks built C++ ones
    straggler_share: float = 0.1     # a rank that made the others wait this share of the window: one line (0: never)
    straggler_window_s: float = 60.0
    warnings: tuple[str, ...] = ()


def _float(env, name, default, lo, warnings):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = None
    if value is None or not (lo <= value < float("inf")):
        warnings.append(f"{name}={raw!r} is not a number >= {lo}; using {default}")
        return default
    return value


def _int(env, name, default, lo, warnings):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < lo:
        warnings.append(f"{name}={raw!r} is not an integer >= {lo}; using {default}")
        return default
    return value


def _digest(env, warnings) -> int:
    """COLLTRACE_DIGEST: off (default), on (inputs up to 64 KiB) or a size cap in KiB."""
    raw = env.get("COLLTRACE_DIGEST", "").strip().lower()
    if raw in ("", "0", "off", "no", "false"):
        return 0
    if raw in ("1", "on", "yes", "true"):
        return 64 << 10
    try:
        kib = int(raw)
    except ValueError:
        kib = -1
    if kib < 1:
        warnings.append(f"COLLTRACE_DIGEST={raw!r} is not on, off or a size in KiB; digests stay off")
        return 0
    return kib << 10


def _names(env, name, warnings) -> tuple[str, ...]:
    """"mylib, otherlib" -> ("mylib", "otherlib"): top-level import names."""
    out = []
    for part in env.get(name, "").split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isidentifier():
            warnings.append(f"{name}: {part!r} is not a package name (top-level import name, e.g. mylib); ignored")
            continue
        out.append(part)
    return tuple(out)


def parse_bind(text: str) -> tuple[str, int]:
    """"[HOST:]PORT" -> (host, port); the host defaults to 127.0.0.1 (loopback only). ValueError if bad."""
    from colltrace import address

    return address.parse(text, default_host="127.0.0.1", any_port=True)


def _bind(env, name, warnings):
    raw = env.get(name, "").strip()
    if raw in ("", "0", "off"):
        return None
    try:
        return parse_bind(raw)
    except ValueError:
        warnings.append(f"{name}={raw!r} is not [HOST:]PORT (e.g. 8765 or 0.0.0.0:8765); no dashboard")
        return None


def load(env=None) -> Settings:
    env = os.environ if env is None else env
    warnings: list[str] = []
    raw_on = env.get("COLLTRACE", "").strip()
    enabled = raw_on not in ("", "0")
    if raw_on.lower() in ("false", "off", "no"):
        warnings.append(f"COLLTRACE={raw_on!r} turns tracing ON (only unset, empty or 0 turn it off)")
    on_hang = env.get("COLLTRACE_ON_HANG", "warn").strip().lower() or "warn"
    if on_hang not in ON_HANG_CHOICES:
        warnings.append(f"COLLTRACE_ON_HANG={on_hang!r} is not one of {', '.join(ON_HANG_CHOICES)}; using warn")
        on_hang = "warn"
    watchdog = env.get("COLLTRACE_WATCHDOG", "auto").strip().lower() or "auto"
    if watchdog not in ("auto", "off", "external"):
        warnings.append(f"COLLTRACE_WATCHDOG={watchdog!r} is not one of auto, off, external; using auto")
        watchdog = "auto"
    hooks = env.get("COLLTRACE_HOOKS", "").strip().lower() or "1"
    if hooks not in ("1", "on", "0", "off", "python"):
        warnings.append(f"COLLTRACE_HOOKS={hooks!r} is not one of 1, 0, python; using 1")
        hooks = "1"
    return Settings(
        enabled=enabled,
        dir=env.get("COLLTRACE_DIR", "").strip() or DEFAULT_DIR,
        stall_s=_float(env, "COLLTRACE_STALL_S", 30.0, 0.0, warnings),
        on_hang=on_hang,
        abort_stall_s=_float(env, "COLLTRACE_ABORT_STALL_S", 0.0, 0.0, warnings),
        ring_slots=_int(env, "COLLTRACE_RING_SLOTS", 65536, 1024, warnings),
        defs_max_bytes=_int(env, "COLLTRACE_DEFS_MAX_MB", 64, 1, warnings) << 20,
        stack_depth=_int(env, "COLLTRACE_STACK_DEPTH", 48, 1, warnings),
        digest_bytes=_digest(env, warnings),
        batches=env.get("COLLTRACE_BATCHES", "").strip().lower() not in ("0", "off", "no", "false"),
        watchdog=watchdog,
        poll_s=_float(env, "COLLTRACE_POLL_S", 0.1, 0.01, warnings),
        host=env.get("COLLTRACE_HOST", "").strip() or socket.gethostname(),
        dashboard=_bind(env, "COLLTRACE_DASHBOARD", warnings),
        dashboard_token=env.get("COLLTRACE_DASHBOARD_TOKEN", "").strip(),
        user_packages=_names(env, "COLLTRACE_USER_PACKAGES", warnings),
        pure=env.get("COLLTRACE_PURE", "").strip() not in ("", "0"),
        hooks=hooks not in ("0", "off"),
        hooks_compiled=hooks != "python",
        straggler_share=_float(env, "COLLTRACE_STRAGGLER_SHARE", 0.1, 0.0, warnings),
        straggler_window_s=_float(env, "COLLTRACE_STRAGGLER_WINDOW_S", 60.0, 1.0, warnings),
        warnings=tuple(warnings),
    )


def warn_once(settings: Settings, stream=None) -> None:
    stream = stream or sys.stderr
    for w in settings.warnings:
        stream.write(f"colltrace: warning: {w}\n")
