"""Settings, read from the environment (the CLI and the pytest plugin set the same variables).

A bad value never raises: it gives one warning on stderr and the default is used, because a
typo in a debugging aid must not stop a training job.
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping
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
    # COLLTRACE_HOOKS: "1" (c10d hooks on torch >= 2.14), "0" (none: the wrappers only, as on 2.13),
    # "python" (the hooks registered from Python even where build-hooks built C++ ones)
    hooks_mode: str = "1"
    straggler_share: float = 0.1     # a rank that made the others wait this share of the window: one line (0: never)
    straggler_window_s: float = 60.0
    py_spy: str = ""                 # the py-spy binary; "off": never; "": on PATH or beside python
    store: str = ""                  # the exchange's store: "HOST:PORT", "off", or "": the job's own
    leader_port: int = 0             # the port the leader's meeting point serves on (0: any free one)
    fanout: int = 0                  # the hosts' tree: children per parent (0: host/tree.py's own choice)
    warnings: tuple[str, ...] = ()

    @property
    def hooks(self) -> bool:
        return self.hooks_mode != "0"

    @property
    def hooks_compiled(self) -> bool:
        return self.hooks_mode != "python"


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
    # (environment, this variable's name, warnings) -> the field's value; a bad value appends one
    # warning and gives the default
    read: Callable[[Mapping[str, str], str, list[str]], Any] | None = None


_DEFAULT: dict[str, Any] = {f.name: f.default for f in Settings.__dataclass_fields__.values()}


# -- readers: (env, name, warnings) -> a field's value; a bad value warns once and gives the default --
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


def _a_float(field_name: str, lo: float):
    return lambda env, name, warnings: _float(env, name, _DEFAULT[field_name], lo, warnings)


def _an_int(field_name: str, lo: int):
    return lambda env, name, warnings: _int(env, name, _DEFAULT[field_name], lo, warnings)


def _text(default: str):
    return lambda env, name, warnings: env.get(name, "").strip() or default


def _choice(default: str, choices: tuple[str, ...]):
    def read(env, name, warnings):
        value = env.get(name, default).strip().lower() or default
        if value not in choices:
            warnings.append(f"{name}={value!r} is not one of {', '.join(choices)}; using {default}")
            return default
        return value
    return read


def _off_unless_set(env, name, warnings) -> bool:
    """On for anything but unset, empty or 0."""
    return env.get(name, "").strip() not in ("", "0")


def _on_unless_off(env, name, warnings) -> bool:
    return env.get(name, "").strip().lower() not in ("0", "off", "no", "false")


def _enabled(env, name, warnings) -> bool:
    raw = env.get(name, "").strip()
    if raw.lower() in ("false", "off", "no"):
        warnings.append(f"{name}={raw!r} turns tracing ON (only unset, empty or 0 turn it off)")
    return raw not in ("", "0")


def _defs_bytes(env, name, warnings) -> int:
    """Given in MB, kept in bytes."""
    return _int(env, name, _DEFAULT["defs_max_bytes"] >> 20, 1, warnings) << 20


def _hooks(env, name, warnings) -> str:
    """"1", "0" or "python" (on/off read as 1/0)."""
    mode = env.get(name, "").strip().lower() or "1"
    if mode not in ("1", "on", "0", "off", "python"):
        warnings.append(f"{name}={mode!r} is not one of 1, 0, python; using 1")
        return "1"
    return {"on": "1", "off": "0"}.get(mode, mode)


def _digest(env, name, warnings) -> int:
    """COLLTRACE_DIGEST: off (default), on (inputs up to 64 KiB) or a size cap in KiB."""
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "off", "no", "false"):
        return 0
    if raw in ("1", "on", "yes", "true"):
        return 64 << 10
    try:
        kib = int(raw)
    except ValueError:
        kib = -1
    if kib < 1:
        warnings.append(f"{name}={raw!r} is not on, off or a size in KiB; digests stay off")
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


def _py_spy(env, name, warnings) -> str:
    """"off" (also 0 or no): never; else the binary as given, or "" to look for it."""
    raw = env.get(name, "").strip()
    return "off" if raw.lower() in ("off", "0", "no") else raw


def _store(env, name, warnings) -> str:
    """"off" (any case), else HOST:PORT as given: the watchdog says there what is wrong with it."""
    raw = env.get(name, "").strip()
    return "off" if raw.lower() == "off" else raw


def _fanout(env, name, warnings) -> int:
    raw = env.get(name, "").strip()
    if raw.isdigit() and int(raw) >= 2:
        return int(raw)
    if raw:
        warnings.append(f"{name}={raw!r} is not an integer >= 2; the tree's own fan-out is used")
    return 0


def _host(env, name, warnings) -> str:
    return env.get(name, "").strip() or socket.gethostname()


# Every variable colltrace reads, in the README's order. The README's table is markdown_table()'s
# text, `colltrace run`'s flags are the rows with a flag, and tests/unit/test_settings_table.py
# keeps both equal to this table and each row's default equal to its Settings field's.
VARIABLES: tuple[Variable, ...] = (
    Variable("COLLTRACE", "off", "`1` (anything but empty/`0`) traces the process", "enabled", read=_enabled),
    Variable("COLLTRACE_DIR", "`colltrace-out`", "folder for traces, findings and the report", "dir",
             read=_text(DEFAULT_DIR)),
    Variable("COLLTRACE_STALL_S", "`30`", "seconds ranks may wait for a rank that has not arrived before a *stall* "
             "finding", "stall_s", "--stall-s", metavar="S",
             read=_a_float("stall_s", 0.0)),
    Variable("COLLTRACE_ON_HANG", "`warn`", "`warn`, `dump` (also write every rank's stacks) or `abort` (end every "
             "rank; [Slow or hung](#slow-or-hung))", "on_hang", "--on-hang",
             "warn (default), dump (also write every rank's stacks) or abort (end every rank)",
             read=_choice("warn", ON_HANG_CHOICES)),
    Variable("COLLTRACE_ABORT_STALL_S", "off", "with `abort`: also end a stall whose missing ranks still move, or a "
             "collective every member entered that never completes, once it has lasted this long", "abort_stall_s",
             "--abort-stall-s", metavar="S", read=_a_float("abort_stall_s", 0.0)),
    Variable("COLLTRACE_PY_SPY", "on `PATH` or beside `python`", "the py-spy binary, or `off`", "py_spy",
             read=_py_spy),
    Variable("COLLTRACE_RING_SLOTS", "`65536`", "64-byte event slots per rank (4 MiB): the most recent events kept",
             "ring_slots", read=_an_int("ring_slots", 1024)),
    Variable("COLLTRACE_DEFS_MAX_MB", "`64`", "cap on interned stacks/signatures per rank", "defs_max_bytes",
             read=_defs_bytes),
    Variable("COLLTRACE_STACK_DEPTH", "`48`", "frames kept per call stack", "stack_depth",
             read=_an_int("stack_depth", 1)),
    Variable("COLLTRACE_PURE", "off", "`1`: the Python wrappers only, not the compiled hot path", "pure",
             read=_off_unless_set),
    Variable("COLLTRACE_HOOKS", "on", "`0`: no c10d collective hooks on torch ≥ 2.14 (DDP's all-reduces are counted, "
             "as on 2.13); `python`: the Python route even where `colltrace build-hooks` built its module",
             "hooks_mode", read=_hooks),
    Variable("COLLTRACE_WATCHDOG", "`auto`", "`auto` (one per host), `external` (`colltrace run` hosts it), `off`",
             "watchdog", read=_choice("auto", ("auto", "off", "external"))),
    Variable("COLLTRACE_DIGEST", "off", "`1`: for `duplicate_data`, a CRC-32 of each gathered CPU input up to 64 KiB "
             "(`N`: N KiB) and of every step's whole batch", "digest_bytes", read=_digest),
    Variable("COLLTRACE_BATCHES", "on", "`0`: do not sample what DDP and FSDP models are fed (steps 1-8, then every "
             "64th), which `duplicate_data` compares", "batches", read=_on_unless_off),
    Variable("COLLTRACE_USER_PACKAGES", "none", "`mylib,otherlib`: installed packages that are your own code "
             "([How it works](#how-it-works))", "user_packages", "--user-packages",
             "installed packages that are your own code: verdicts name their lines like your scripts'",
             metavar="NAME[,NAME...]", read=_names),
    Variable("COLLTRACE_STORE", "the job's TCPStore", "where the leader's address is found ([Several "
             "hosts](#several-hosts)); `off`: each host judges its own ranks", "store", read=_store),
    Variable("COLLTRACE_LEADER_PORT", "any free port", "the port the leader's watchdog serves the other hosts on",
             "leader_port", read=_an_int("leader_port", 0)),
    Variable("COLLTRACE_FANOUT", "`32`", "on a job of more hosts than this + 1, the hosts exchange along a tree of "
             "this many children per parent ([Several hosts](#several-hosts)); unset, past 1,057 hosts: the square "
             "root of the hosts (two levels)", "fanout", read=_fanout),
    Variable("COLLTRACE_STRAGGLER_SHARE", "`0.1`", "one line on stderr when a rank made the others wait this share "
             "of the job's time over the window (then at most every 5 minutes); `0`: never", "straggler_share",
             "--straggler-share", "one line when a rank made the others wait this share of the time (0: never)",
             metavar="SHARE", read=_a_float("straggler_share", 0.0)),
    Variable("COLLTRACE_STRAGGLER_WINDOW_S", "`60`", "the window the live straggler view (that line, the "
             "dashboard's panel) judges; the line needs half of it seen", "straggler_window_s",
             read=_a_float("straggler_window_s", 1.0)),
    Variable("COLLTRACE_HOST", "the host name", "tells this host's ranks from others' in a shared folder", "host",
             read=_host),
    Variable("COLLTRACE_POLL_S", "`0.1`", "how often the watchdog reads the rings and each rank's poller wakes",
             "poll_s", read=_a_float("poll_s", 0.01)),
    Variable("COLLTRACE_DASHBOARD", "off", "`[HOST:]PORT` (HOST: 127.0.0.1): rank 0's host serves the "
             "[dashboard](#dashboard) there", "dashboard", "--dashboard",
             "serve the live dashboard while the job runs (127.0.0.1 unless HOST is given; another HOST needs "
             "COLLTRACE_DASHBOARD_TOKEN; port 0 picks a free one)", metavar="[HOST:]PORT", read=_bind),
    Variable("COLLTRACE_DASHBOARD_TOKEN", "none", "token every dashboard request must carry; required to bind "
             "anything but loopback", "dashboard_token", read=_text("")),
)


def markdown_table() -> str:
    """The README's table of variables (Settings, "Variables")."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{v.env}` | {v.shown} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"


_BY_FIELD = {v.field: v for v in VARIABLES if v.field}


def load(env=None) -> Settings:
    """Every setting, each read by its row of VARIABLES; the warnings for warn_once."""
    env = os.environ if env is None else env
    warnings: list[str] = []
    values = {v.field: v.read(env, v.env, warnings) for v in VARIABLES if v.field and v.read}
    return Settings(**values, warnings=tuple(warnings))


def value(field_name: str, env=None) -> Any:
    """One setting, read as load() reads it, for a module that needs only it (the watchdog's store,
    port, fan-out and py-spy); its warning, if any, is load()'s to give."""
    row = _BY_FIELD[field_name]
    assert row.read is not None
    return row.read(os.environ if env is None else env, row.env, [])


def warn_once(settings: Settings, stream=None) -> None:
    stream = stream or sys.stderr
    for w in settings.warnings:
        stream.write(f"colltrace: warning: {w}\n")
