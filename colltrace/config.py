"""Settings, read from the environment (the CLI and the pytest plugin set the same variables).

A bad value never raises: it gives one warning on stderr and the default is used, because a
typo in a debugging aid must not stop a training job.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

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
    hooks: bool = True               # COLLTRACE_HOOKS=0: on torch >= 2.14, no c10d hooks (the wrappers only,
                                     # as on 2.13)
    hooks_compiled: bool = True      # COLLTRACE_HOOKS=python: the hooks registered from Python even where
                                     # build-hooks built C++ ones
    straggler_share: float = 0.1     # a rank that made the others wait this share of the window: one line (0: never)
    straggler_window_s: float = 60.0
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Variable:
    """One environment variable: the README's row (default as shown, meaning), the Settings field
    it fills (where one does: its default is the field's), and `colltrace run`'s flag for it."""
    env: str
    shown: str                      # the default as the README shows it
    meaning: str                    # the README's words (Markdown)
    field: str | None = None        # the Settings attribute it sets
    flag: str | None = None         # `colltrace run FLAG VALUE` sets it for the job
    flag_help: str | None = None    # the flag's help, where the README's words hold links
    metavar: str | None = None


# Every variable colltrace reads, in the README's order. The README's table is markdown_table()'s
# text, `colltrace run`'s flags are the rows with a flag, and tests/unit/test_settings_table.py
# keeps both equal to this table and each row's default equal to its Settings field's.
VARIABLES: tuple[Variable, ...] = (
    Variable("COLLTRACE", "off", "`1` (anything but empty/`0`) traces the process", "enabled"),
    Variable("COLLTRACE_DIR", "`colltrace-out`", "folder for traces, findings and the report", "dir"),
    Variable("COLLTRACE_STALL_S", "`30`", "seconds ranks may wait for a rank that has not arrived before a *stall* "
             "finding", "stall_s", "--stall-s", metavar="S"),
    Variable("COLLTRACE_ON_HANG", "`warn`", "`warn`, `dump` (also write every rank's stacks) or `abort` (end every "
             "rank; [Slow or hung](#slow-or-hung))", "on_hang", "--on-hang",
             "warn (default), dump (also write every rank's stacks) or abort (end every rank)"),
    Variable("COLLTRACE_ABORT_STALL_S", "off", "with `abort`: also end a stall whose missing ranks still move, or a "
             "collective every member entered that never completes, once it has lasted this long", "abort_stall_s",
             "--abort-stall-s", metavar="S"),
    Variable("COLLTRACE_PY_SPY", "on `PATH` or beside `python`", "the py-spy binary, or `off`"),
    Variable("COLLTRACE_RING_SLOTS", "`65536`", "64-byte event slots per rank (4 MiB): the most recent events kept",
             "ring_slots"),
    Variable("COLLTRACE_DEFS_MAX_MB", "`64`", "cap on interned stacks/signatures per rank", "defs_max_bytes"),
    Variable("COLLTRACE_STACK_DEPTH", "`48`", "frames kept per call stack", "stack_depth"),
    Variable("COLLTRACE_PURE", "off", "`1`: the Python wrappers only, not the compiled hot path", "pure"),
    Variable("COLLTRACE_HOOKS", "on", "`0`: no c10d collective hooks on torch ≥ 2.14 (DDP's all-reduces are counted, "
             "as on 2.13); `python`: the Python route even where `colltrace build-hooks` built its module", "hooks"),
    Variable("COLLTRACE_WATCHDOG", "`auto`", "`auto` (one per host), `external` (`colltrace run` hosts it), `off`",
             "watchdog"),
    Variable("COLLTRACE_DIGEST", "off", "`1`: for `duplicate_data`, a CRC-32 of each gathered CPU input up to 64 KiB "
             "(`N`: N KiB) and of every step's whole batch", "digest_bytes"),
    Variable("COLLTRACE_BATCHES", "on", "`0`: do not sample what DDP and FSDP models are fed (steps 1-8, then every "
             "64th), which `duplicate_data` compares", "batches"),
    Variable("COLLTRACE_USER_PACKAGES", "none", "`mylib,otherlib`: installed packages that are your own code "
             "([How it works](#how-it-works))", "user_packages", "--user-packages",
             "installed packages that are your own code: verdicts name their lines like your scripts'",
             metavar="NAME[,NAME...]"),
    Variable("COLLTRACE_STORE", "the job's TCPStore", "where the leader's address is found ([Several "
             "hosts](#several-hosts)); `off`: each host judges its own ranks"),
    Variable("COLLTRACE_LEADER_PORT", "any free port", "the port the leader's watchdog serves the other hosts on"),
    Variable("COLLTRACE_FANOUT", "`32`", "on a job of more hosts than this + 1, the hosts exchange along a tree of "
             "this many children per parent ([Several hosts](#several-hosts)); unset, past 1,057 hosts: the square "
             "root of the hosts (two levels)"),
    Variable("COLLTRACE_STRAGGLER_SHARE", "`0.1`", "one line on stderr when a rank made the others wait this share "
             "of the job's time over the window (then at most every 5 minutes); `0`: never", "straggler_share",
             "--straggler-share", "one line when a rank made the others wait this share of the time (0: never)",
             metavar="SHARE"),
    Variable("COLLTRACE_STRAGGLER_WINDOW_S", "`60`", "the window the live straggler view (that line, the "
             "dashboard's panel) judges; the line needs half of it seen", "straggler_window_s"),
    Variable("COLLTRACE_HOST", "the host name", "tells this host's ranks from others' in a shared folder", "host"),
    Variable("COLLTRACE_POLL_S", "`0.1`", "how often the watchdog reads the rings and each rank's poller wakes",
             "poll_s"),
    Variable("COLLTRACE_DASHBOARD", "off", "`[HOST:]PORT` (HOST: 127.0.0.1): rank 0's host serves the "
             "[dashboard](#dashboard) there", "dashboard", "--dashboard",
             "serve the live dashboard while the job runs (127.0.0.1 unless HOST is given; another HOST needs "
             "COLLTRACE_DASHBOARD_TOKEN; port 0 picks a free one)", metavar="[HOST:]PORT"),
    Variable("COLLTRACE_DASHBOARD_TOKEN", "none", "token every dashboard request must carry; required to bind "
             "anything but loopback", "dashboard_token"),
)


def markdown_table() -> str:
    """The README's table of variables (Settings, "Variables")."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{v.env}` | {v.shown} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"


_DEFAULT: dict[str, Any] = {f.name: f.default for f in Settings.__dataclass_fields__.values()}


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
        stall_s=_float(env, "COLLTRACE_STALL_S", _DEFAULT["stall_s"], 0.0, warnings),
        on_hang=on_hang,
        abort_stall_s=_float(env, "COLLTRACE_ABORT_STALL_S", _DEFAULT["abort_stall_s"], 0.0, warnings),
        ring_slots=_int(env, "COLLTRACE_RING_SLOTS", _DEFAULT["ring_slots"], 1024, warnings),
        defs_max_bytes=_int(env, "COLLTRACE_DEFS_MAX_MB", _DEFAULT["defs_max_bytes"] >> 20, 1, warnings) << 20,
        stack_depth=_int(env, "COLLTRACE_STACK_DEPTH", _DEFAULT["stack_depth"], 1, warnings),
        digest_bytes=_digest(env, warnings),
        batches=env.get("COLLTRACE_BATCHES", "").strip().lower() not in ("0", "off", "no", "false"),
        watchdog=watchdog,
        poll_s=_float(env, "COLLTRACE_POLL_S", _DEFAULT["poll_s"], 0.01, warnings),
        host=env.get("COLLTRACE_HOST", "").strip() or socket.gethostname(),
        dashboard=_bind(env, "COLLTRACE_DASHBOARD", warnings),
        dashboard_token=env.get("COLLTRACE_DASHBOARD_TOKEN", "").strip(),
        user_packages=_names(env, "COLLTRACE_USER_PACKAGES", warnings),
        pure=env.get("COLLTRACE_PURE", "").strip() not in ("", "0"),
        hooks=hooks not in ("0", "off"),
        hooks_compiled=hooks != "python",
        straggler_share=_float(env, "COLLTRACE_STRAGGLER_SHARE", _DEFAULT["straggler_share"], 0.0, warnings),
        straggler_window_s=_float(env, "COLLTRACE_STRAGGLER_WINDOW_S", _DEFAULT["straggler_window_s"], 1.0, warnings),
        warnings=tuple(warnings),
    )


def warn_once(settings: Settings, stream=None) -> None:
    stream = stream or sys.stderr
    for w in settings.warnings:
        stream.write(f"colltrace: warning: {w}\n")
