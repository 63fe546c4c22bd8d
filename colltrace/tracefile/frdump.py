"""Reads PyTorch Flight Recorder dumps (a folder, one file per rank) into the analyzer's snapshot.

Every NCCL job already has the Flight Recorder; gloo records too (torch >= 2.6). A dump is a
pickle (NCCL's dump on timeout, `_dump_fr_trace`) or JSON (`_dump_fr_trace_json`) of
`{"version", "pg_config", "pg_status", "entries": [...]}`; the rank is the number that ends the
file name (`nccl_trace_rank_3`, `_dump_3`, ...). Versions 2.0-2.10 (torch 2.4-2.15) differ in
keys that come and go (`seq_id` before `collective_seq_id`, `is_p2p`, `pg_status`, dtypes,
`nccl_version` -> `comm_lib_version`); what a version lacks is left unknown, never guessed.

Pickles are loaded with an unpickler that builds plain data only: a dump is read from files that
came from elsewhere, and a pickle may otherwise run any code. No torch import.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re

from colltrace.errors import InputError
from colltrace.model.schema import COMPLETED, IN_FLIGHT, UNKNOWN, Snapshot
from colltrace.tracefile.asks import DTYPES
from colltrace.words import group_desc

# the rank that ends a dump's file name, as torchfrtrace reads it (an extension is allowed)
DUMP_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?:\.json|\.pkl|\.pickle)?$")
# Builtins a plain-data pickle may name; anything else (os.system, torch classes, ...) is refused.
SAFE_BUILTINS = frozenset(("set", "frozenset", "complex", "bytearray", "slice", "range", "bytes", "str",
                           "int", "float", "bool", "list", "dict", "tuple"))


class DumpError(InputError):
    """A file or folder that cannot be read as Flight Recorder dumps (one line, names the file)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "builtins" and name in SAFE_BUILTINS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refuses to load {module}.{name} (a dump holds plain data only)")


def _loads(data: bytes, path: str) -> dict:
    head = data.lstrip()[:1]
    try:
        if head == b"{":
            obj = json.loads(data)
        elif data[:1] == b"\x80":
            obj = _PlainUnpickler(io.BytesIO(data)).load()
        else:
            raise DumpError(f"{path}: not a Flight Recorder dump (neither pickle nor JSON)")
    except DumpError:
        raise
    except Exception as exc:   # a pickle or JSON of anything raises anything: one DumpError naming the file
        raise DumpError(f"{path}: not a readable Flight Recorder dump ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("entries", []), list) or "version" not in obj:
        raise DumpError(f"{path}: not a Flight Recorder dump (no 'version' and 'entries')")
    return obj


def candidates(directory: str, prefix: str | None = None) -> dict[int, str]:
    """rank -> path of the dump files in the folder: those named `<prefix><rank>`. Without a
    prefix, the one prefix that the rank-numbered files share (several: DumpError, use --prefix)."""
    if not os.path.isdir(directory):
        raise DumpError(f"{directory}: no such folder")
    found: dict[str, dict[int, str]] = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        if prefix is not None:
            if not name.startswith(prefix):
                continue
            m = DUMP_NAME.match(name[len(prefix):])
            if m is None or m.group("prefix"):
                continue
            found.setdefault(prefix, {})[int(m.group("rank"))] = path
            continue
        m = DUMP_NAME.match(name)
        if m is not None:
            found.setdefault(m.group("prefix"), {})[int(m.group("rank"))] = path
    if len(found) > 1:
        names = ", ".join(repr(p) for p in sorted(found))
        raise DumpError(f"{directory}: files with several prefixes ({names}); choose one with --prefix")
    return dict(sorted(next(iter(found.values())).items())) if found else {}


def read(directory: str, prefix: str | None = None) -> dict[int, dict]:
    """rank -> dump, for every dump file in the folder ({} when there is none)."""
    out = {}
    for rank, path in candidates(directory, prefix).items():
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise DumpError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        out[rank] = _loads(data, path)
    return out


# -- conversion (plain data in, the analyzer's snapshot out) ------------------------------------------

def _int(x, default=None):
    try:
        if isinstance(x, bool) or x is None:
            return default
        return int(x)
    except (TypeError, ValueError):
        return default


def _ranks_of(cfg) -> list[int]:
    ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError:
            return []
    if not isinstance(ranks, (list, tuple)):
        return []
    return [r for r in (_int(x) for x in ranks) if r is not None]


def _pg(e: dict) -> tuple[str, str]:
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    if pg is not None:
        return str(pg), ""
    return str(e.get("pg_id", "?")), ""


_P2P = re.compile(r"^(?P<op>send|recv)\s+(?P<a>\d+)\s*(?:->|<-)\s*(?P<b>\d+)")


def _op(e: dict) -> tuple[str, int | None]:
    """(op name, the peer's rank in the group for send/recv). "nccl:recv 3<-0": recv from 0."""
    name = str(e.get("profiling_name") or "unknown")
    name = name.split(":", 1)[-1].strip()
    m = _P2P.match(name)
    if m:
        return m.group("op"), int(m.group("b"))
    return name.split(" ", 1)[0].lstrip("_") or "unknown", None


def _frames(e: dict) -> list[dict]:
    out = []
    for f in e.get("frames") or ():
        if isinstance(f, dict):
            out.append({"file": str(f.get("filename", "?")), "line": _int(f.get("line"), 0),
                        "func": str(f.get("name", "?"))})
    out.reverse()   # the recorder lists innermost first; the contract wants innermost last
    return out


def _ns(x) -> float | None:
    v = _int(x)
    return v / 1e9 if v else None


def to_snapshot(dumps: dict[int, dict], source: str = "") -> Snapshot:
    """The analyzer's snapshot of the ranks' dumps. A record is "completed" when the dump says so
    (its state, retired, or the group's last completed number); else the oldest unfinished one
    of its group (p2p: of its group and peer) is "in_flight" (the recorder cannot tell whether
    the CPU waited, only that the work did not finish) and the ones behind it are "queued"."""
    groups: dict[str, dict] = {}
    for _rank, d in dumps.items():
        for key, cfg in (d.get("pg_config") or {}).items():
            name = str(cfg.get("name", key)) if isinstance(cfg, dict) else str(key)
            members = _ranks_of(cfg)
            if name and members and name not in groups:   # gloo writes an empty table
                groups[name] = {"name": name, "desc": group_desc(cfg.get("desc")), "ranks": sorted(members)}
    world = sorted(dumps)
    ranks = {}
    taken_at = 0.0
    for rank, d in sorted(dumps.items()):
        entries = [e for e in d.get("entries") or () if isinstance(e, dict)]
        entries.sort(key=lambda e: (_int(e.get("record_id"), 0), _int(e.get("time_created_ns"), 0)))
        pg_names: dict[str, str] = {}
        for e in entries:
            name, desc = _pg(e)
            if e.get("pg_id") is not None:
                pg_names[str(e["pg_id"])] = name
            if name not in groups and desc == "default_pg":
                groups[name] = {"name": name, "desc": desc, "ranks": world}
            # other groups without a table (gloo): the analyzer takes the ranks that name them
        progress: dict[str, dict] = {}
        for pg_id, st in (d.get("pg_status") or {}).items():
            pg_name = pg_names.get(str(pg_id))
            if pg_name is None or not isinstance(st, dict):
                continue   # a group with no entry here: its name is not known on this rank
            progress[pg_name] = {"entered": max(0, _int(st.get("last_enqueued_collective"), 0)),
                              "completed": max(0, _int(st.get("last_completed_collective"), 0))}
        records: list[dict] = []
        pair_count: dict[tuple, int] = {}
        for e in entries:
            name, _ = _pg(e)
            op, peer_local = _op(e)
            p2p = bool(e.get("is_p2p")) if "is_p2p" in e else peer_local is not None
            seq = _int(e.get("collective_seq_id", e.get("seq_id")), 0)
            p = progress.setdefault(name, {"entered": 0, "completed": 0})
            done = e.get("state") == COMPLETED or e.get("retired") is True   # the recorder's own word
            if not p2p:
                p["entered"] = max(p["entered"], seq)
                if done:
                    p["completed"] = max(p["completed"], seq)
            t = _ns(e.get("time_created_ns")) or 0.0
            fin = _ns(e.get("time_discovered_completed_ns"))
            taken_at = max(taken_at, t, fin or 0.0, _ns(e.get("time_discovered_started_ns")) or 0.0)
            peer = None
            if peer_local is not None:
                members = groups.get(name, {}).get("ranks") or []
                peer = members[peer_local] if peer_local < len(members) else None
            dtypes = [DTYPES.get(str(x), str(x).lower()) for x in e.get("input_dtypes") or ()]
            r = {"id": len(records) + 1, "rank": rank, "group": name, "seq": seq, "seq_end": seq, "op": op,
                 "backend_op": op.replace("_", ""), "p2p": p2p, "peer": peer, "state": IN_FLIGHT, "async": True,
                 "entered_at": t, "returned_at": t, "completed_at": None,
                 "shapes": [list(s) for s in e.get("input_sizes") or () if isinstance(s, (list, tuple))],
                 "dtypes": dtypes, "reduce_op": None, "root": None, "count": 1,
                 "thread": str(e.get("thread_name") or e.get("thread_id") or ""), "frames": _frames(e),
                 "fr": {"record_id": e.get("record_id"), "state": e.get("state"),
                        "p2p_seq_id": e.get("p2p_seq_id"), "output_sizes": e.get("output_sizes")}}
            if done:
                r["state"], r["completed_at"] = COMPLETED, fin or t
            records.append(r)
        head: set[tuple] = set()
        for r in records:
            if not r["p2p"] and r["state"] != COMPLETED and r["seq"] <= progress[r["group"]]["completed"]:
                r["state"], r["completed_at"] = COMPLETED, r["completed_at"] or r["entered_at"]
            if r["state"] != COMPLETED:
                # A group's work runs in order on its stream (p2p: per peer): only the oldest
                # unfinished op there is waited on; the later ones are queued behind it.
                lane = (r["group"], r["p2p"] and r["peer"])
                if lane in head:
                    r["state"] = "queued"
                head.add(lane)
            if not r["p2p"]:
                continue
            # The recorder's p2p numbers count every p2p op of the rank on the group, so they do
            # not match the peer's. Pending ops between a pair match in order, so number the ones
            # not completed per (group, peer, op) from 1: the peer's count of pending matches says
            # whether it posted this one. Completed ones are 0.
            if r["state"] == COMPLETED:
                r["seq"] = r["seq_end"] = 0
            else:
                k = (r["group"], r["peer"], r["backend_op"])
                pair_count[k] = pair_count.get(k, 0) + 1
                r["seq"] = r["seq_end"] = pair_count[k]
        ranks[str(rank)] = {
            "rank": rank, "status": UNKNOWN, "exit": None, "died_at": None, "heartbeat": None, "error": None,
            "pid": None, "host": None, "progress": progress, "records": records, "stack": None, "stack_at": None,
            "fault": None, "stall_s": 0.0, "flight_recorder": {"version": str(d.get("version")), "source": source}}
    return {"version": 1, "taken_at": taken_at, "groups": groups, "ranks": ranks,
            "source": {"kind": "flight_recorder", "path": source}}
