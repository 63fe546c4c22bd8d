"""The same kind elsewhere: other call sites that would block like a hang finding's collective.

When a deadlock or stall shows ranks of group G waiting in a collective that other members
never call (they are on another path), the same will happen at every other collective on G,
and, when G is the default group, at every collective whose group is left to its default. This
module reads the user's source files named by the waiting ranks' frames (and the user modules
they import), finds those call sites with colltrace.callsites.scan, and adds them to the finding as
`same_kind`, most likely to run next first:

0. later in the functions on the stack (innermost first): what runs once the hang is fixed;
1. elsewhere in the files on the stack;
2. in the user modules those files import.

It runs after the (pure) analysis, in the watchdog and in `colltrace analyze`; files that are
not on this machine are skipped. Never raises.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from colltrace import origins
from colltrace.callsites import scan
from colltrace.model.finding import Deadlock, Finding, Stall
from colltrace.model.parts import SameKindSite
from colltrace.origins import user_frames

KINDS = ("deadlock", "stall")
MAX_SITES = 50
_cache: dict[tuple, object] = {}


def _user_file(path) -> bool:
    """The user's own source (not torch's, the standard library's or an installed framework's), by
    this machine's roots: the files read here are this machine's."""
    if not path or not str(path).endswith(".py"):
        return False
    return _local().classify(str(path))[0] == origins.USER


@functools.lru_cache(maxsize=1)
def _local():
    return origins.for_roots(origins.local_roots())


def _load(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _cache:
        try:
            _cache[key] = scan.parse(path)
        except (OSError, SyntaxError, ValueError, RecursionError):
            _cache[key] = None
    return _cache[key]


def _waiting(f: Finding) -> list[int]:
    if isinstance(f, Deadlock):
        cycle: Sequence[Mapping[str, Any]] = f.cycle or [{}]   # [{}]: read back without one
        return list(cycle[0].get("waiting") or [])
    return list(f.waiting) if isinstance(f, Stall) else []


def _is_default(f: Finding) -> bool:
    g = f.group
    return g.get("desc") == "default_pg" or str(g.get("name")) == "0"


def sites_for(f: Finding) -> list[SameKindSite]:
    """The same-kind call sites of one finding (empty when it is not a "never called" hang)."""
    if f.kind not in KINDS or not f.missing_ranks:
        return []
    chains = []
    for r in _waiting(f):
        e = f.ranks.get(str(r)) or {}
        chain = [x for x in user_frames(e.get("frames")) if _user_file(x.get("file"))]
        if chain and chain not in chains:
            chains.append(chain)
    if not chains:
        return []
    default = _is_default(f)
    hang = chains[0][-1]
    hang_sf = _load(hang["file"])
    keys = set()
    if hang_sf is not None:
        for s in hang_sf.sites:
            if s.line == hang.get("line") and s.group_kind == "explicit":
                keys.add(scan.group_key(s.group))

    def same(s) -> bool:
        if s.group_kind in ("default", "maybe_default"):
            return default
        return scan.group_key(s.group) in keys

    here = {(x["file"], x.get("line")) for chain in chains for x in chain}
    out, seen = [], set()

    def add(s, tier):
        k = (s.file, s.line)
        if k in seen or k in here:
            return
        seen.add(k)
        out.append((tier, s))

    files = []
    for chain in chains:
        for x in reversed(chain):   # innermost first
            if x["file"] not in files:
                files.append(x["file"])
    # 0: later in the functions on the stack
    for chain in chains:
        for x in reversed(chain):
            sf = _load(x["file"])
            if sf is None:
                continue
            func = x.get("func")
            for s in sf.sites:
                if same(s) and s.line > (x.get("line") or 0) and s.func.rsplit(".", 1)[-1] == func:
                    add(s, 0)
    # 1: elsewhere in the files on the stack
    for path in files:
        sf = _load(path)
        for s in (sf.sites if sf else ()):
            if same(s):
                add(s, 1)
    # 2: the user modules they import
    imported = []
    for path in files:
        sf = _load(path)
        for mod, level in (sf.imports if sf else ()):
            for cand in scan.resolve_import(path, mod, level):
                cand = os.path.abspath(cand)
                if _user_file(cand) and cand not in files and cand not in imported:
                    imported.append(cand)
    for path in imported:
        sf = _load(path)
        for s in (sf.sites if sf else ()):
            if same(s):
                add(s, 2)
    return [s.as_dict() for _, s in out[:MAX_SITES]]


def annotate(findings: list[Finding]) -> list[Finding]:
    """Set `same_kind` on the findings it concerns, in place (the watchdog's reported findings
    carry it to the store and report.txt); returns the findings."""
    for f in findings:
        if f.same_kind is not None:
            continue
        try:
            sites = sites_for(f)
        except Exception:   # a reading aid: never in the way of the finding itself
            sites = []
        if sites:
            f.same_kind = sites
    return findings
