"""The job's c10d TCPStore as the watchdogs' meeting point.

Only watchdogs talk to the store, never the traced ranks: one compact summary per node
(all its ranks at once, zlib-compressed JSON) is written at most every PUBLISH_S, so store
traffic grows with the number of nodes, not ranks or collectives. The leader (the node that
holds rank 0) reads every node's summary, runs the one global analysis, and writes back the
findings and the ranks whose live stacks it wants. `colltrace dump --from-store` and the
dashboard read the same keys from outside the job.

Keys (all under PREFIX):
  nodes            counter; each node watchdog takes an index with add(1)
  node/<i>         zlib(JSON summary of node i), its group table replaced by "groups_crc"
  node/<i>/groups  zlib(JSON group table of node i), rewritten only when it changes: it lists
                   every member of every group (a 1,024-rank world group in each node's table)
  want             JSON {"stacks": ranks whose live stack the leader needs, "groups": groups whose
                   members' entries it needs in full, "all": every entry in full (a small job)}
  findings         zlib(JSON list of findings so far)
  hang             set by the leader when it finds a hang: every node then acts on
                   COLLTRACE_ON_HANG (dump its ranks' stacks; abort: end them too)
  ended            set by the leader just before its server goes away with the job
  control          a counter bumped after each write of want, hang or ended (read with add(0):
                   one request a round tells a host whether to read them again)
These live in the leader's own store (colltrace/host/meeting.py); the job's store holds only
PREFIX + "leader", its address. A reader given the job's store follows that key.
"""
from __future__ import annotations

import json
import os
import threading
import time
import zlib
from datetime import timedelta
from typing import Any

from colltrace import address, config
from colltrace.errors import ColltraceError
from colltrace.model import finding
from colltrace.model.finding import Finding
from colltrace.tracefile import layout

PREFIX = "colltrace/v1/"
PUBLISH_S = 0.25
BEATS_EVERY_S = 0.5   # a reader takes the beats this often (liveness waits seconds); summaries every round
CONTROL = PREFIX + "control"   # counts the writes of want, hang and ended: their readers' one request a round


class StoreError(ColltraceError):
    """The store cannot be reached or holds something that is not colltrace's (one line)."""


def parse_address(text: str) -> tuple[str, int]:
    try:
        return address.parse(text)
    except address.AddressError as exc:
        raise StoreError(str(exc)) from None


def address_from_env(environ=os.environ, job_store: str | None = None) -> tuple[str, int] | None:
    """COLLTRACE_STORE=HOST:PORT, or off; by default the store the job's default group was made
    with, as the rank that started the watchdog found it (job_store: "HOST:PORT", or "off" for a
    FileStore or HashStore), unless the whole job is on this host (torchrun's LOCAL_WORLD_SIZE ==
    WORLD_SIZE): then the trace folder is the meeting point, and the watchdog need not import
    torch to reach the store. MASTER_ADDR:MASTER_PORT only for a watchdog no rank told: in a test
    session they may be an earlier test's, while this one made a store of its own."""
    explicit = config.value("store", environ)
    if explicit == "off":
        return None
    if explicit:
        return parse_address(explicit)
    world, local = environ.get("WORLD_SIZE", ""), environ.get("LOCAL_WORLD_SIZE", "")
    if world.isdigit() and world == local:
        return None
    if job_store is not None:
        return None if job_store == "off" else parse_address(job_store)
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if addr and port and port.isdigit():
        return addr, int(port)
    return None


def encode(obj) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":"), default=str).encode(), 1)


def decode(data: bytes):
    try:
        return json.loads(zlib.decompress(data))
    except (zlib.error, ValueError) as exc:
        raise StoreError(f"a colltrace key in the store holds something unreadable ({exc})") from None


def node_payload(summary: dict, memo: list | None = None) -> tuple[bytes, bytes, int, bytes]:
    """(summary, group table, the table's CRC, beat), encoded. The summary leaves out what changes
    on every round even in a hang (its time, the ranks' heartbeats: the beat), so that a hung
    job's summaries stay byte for byte the same and the leader decodes each one once. memo: a
    one-slot list where the last group table's encoding is kept (a world group of 16,384 ranks
    is 100 KB of JSON: 23 ms a publish to encode and compress, for a table that never changes)."""
    summary = dict(summary)
    table = summary.pop("groups", None) or {}
    key = _groups_key(table)
    if memo is not None and memo and memo[0][0] == key:
        groups, crc = memo[0][1], memo[0][2]
    else:
        groups = encode(table)
        crc = zlib.crc32(groups)
        if memo is not None:
            memo[:] = [(key, groups, crc)]
    summary["groups_crc"] = crc
    beat = beat_payload(summary)
    summary.pop("t", None)
    summary["ranks"] = without_beats(summary.get("ranks") or {})
    return encode(summary), groups, crc, beat


def _groups_key(table: dict) -> tuple:
    """What a group table says, as a value to compare (its member lists as tuples: C-speed)."""
    return tuple((str(k), tuple(sorted((kk, tuple(vv) if isinstance(vv, list) else vv) for kk, vv in v.items()))
                  if isinstance(v, dict) else repr(v)) for k, v in sorted(table.items(), key=lambda kv: str(kv[0])))


def without_beats(ranks: dict) -> dict:
    """The ranks' entries less their heartbeats (what changes every round even in a hang)."""
    return {r: {k: v for k, v in e.items() if k != "heartbeat"} if isinstance(e, dict) and "heartbeat" in e else e
            for r, e in ranks.items()}


def beat_payload(summary: dict) -> bytes:
    """A summary's beat, encoded: its time and its ranks' heartbeats."""
    hb = {r: e["heartbeat"] for r, e in (summary.get("ranks") or {}).items()
          if isinstance(e, dict) and "heartbeat" in e}
    return json.dumps({"t": summary.get("t"), "hb": hb}, separators=(",", ":")).encode()


def quiet_c10d() -> None:
    """c10d logs each failed connect attempt in C++; our one-line error says it once. Only
    effective before torch is imported, which holds in the CLI; the ranks' watchdog is started
    with it set (colltrace/rank/launcher.py)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


def connect(host: str, port: int, timeout_s: float):
    """A c10d TCPStore client of HOST:PORT. A host's watchdog tries once: a store that cannot be
    reached costs one line after `timeout_s` (and another try STORE_RETRY_S later). c10d's client
    looks up its peer's name on every connect; where the resolver drops a query, that connect
    waits the resolver's timeout (5 s) and fails within a `timeout_s` as short."""
    quiet_c10d()
    return _connect(host, port, timeout_s, attempts=1)


class SharedClients:
    """How the hosts one process simulates connect (colltrace/testing/simhosts.py), in place of
    `connect`: one client per server (c10d's client serializes its own requests), as real hosts
    share nothing but need no more than one each; a new connect one at a time (overlapping c10d
    connects of one process stall each other: 32 at once on torch 2.13, most time out), and one
    that timed out tried again at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, int], Any] = {}   # c10d TCPStore clients

    def __call__(self, host: str, port: int, timeout_s: float):
        quiet_c10d()
        with self._lock:
            client = self._clients.get((host, port))
            if client is not None:
                try:
                    client.check([PREFIX + "nodes"])   # its server may have gone (a host that died)
                    return client
                except Exception:   # a server gone (c10d's error, any type): a fresh client below
                    del self._clients[(host, port)]
            client = self._clients[(host, port)] = _connect(host, port, timeout_s, attempts=3)
            return client


def _connect(host: str, port: int, timeout_s: float, attempts: int):
    for attempt in range(attempts):
        try:
            from torch.distributed import TCPStore  # no torch (a laptop reading a copied folder): one line

            return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s),
                            wait_for_workers=False)
        except Exception as exc:  # RuntimeError/DistStoreError from c10d, OSError
            if attempt + 1 < attempts and "timed out" in str(exc):
                continue
            raise StoreError(f"cannot reach the job's store at {host}:{port}: {_one_line(exc)}") from None
    raise AssertionError("unreachable")


class StoreLink:
    def __init__(self, host: str, port: int, timeout_s: float = 5.0, follow_leader: bool = False,
                 connect=connect):
        """connect(host, port, timeout_s) -> a c10d client: `connect`, or a SharedClients."""
        self.address = f"{host}:{port}"
        self.traffic = 0   # payload bytes sent and received through this link (benchmarks/scale_live.py)
        self._store = connect(host, port, timeout_s)
        self.followed = False   # True: this link talks to the leader's server it found announced
        if follow_leader:   # given the job's store: the state is on the leader's own server
            raw = self._get(PREFIX + "leader")
            if raw is not None:
                del self._store
                type(self).__init__(self, *parse_address(raw.decode(errors="replace")), timeout_s=timeout_s,
                                    connect=connect)
                self.followed = True
                return
        self.node_index: int | None = None
        self._present: set[str] = set()   # node keys known to exist (they are never deleted)
        self._groups: dict[str, tuple] = {}  # node key -> (crc, group table), read side
        self._groups_crc: int | None = None  # what this node last wrote, write side
        self._groups_memo: list = []         # its encoding, while the table says the same (node_payload)
        self._data: bytes | None = None
        self._decoded: dict[str, tuple] = {}  # node key -> (bytes, summary): decoded once
        self._control_seen: tuple = (-1, (None, None, False))   # (CONTROL count, control()) last read
        self._unfolded: dict[str, tuple] = {}  # node key -> (bytes, summary with its classes unfolded)
        self._beats: dict[str, dict] = {}      # node key -> its beat, as last read (every BEATS_EVERY_S)
        self._beats_read_at = -1e9
        self._beaten: dict[str, tuple] = {}    # node key -> (its ranks table, the beat) last put in it

    # -- node side ----------------------------------------------------------------------
    def publish_node(self, summary: dict, confirm: bool = False) -> None:
        """What changed of this node's summary, and its beat, in one request. c10d answers no set,
        so it costs no wait; the watchdog's next request on this connection (control's counter, or
        the leader's read) is answered only after the server applied it. confirm: wait for that
        here (another client reads it next)."""
        try:
            if self.node_index is None:
                self.node_index = int(self._store.add(PREFIX + "nodes", 1))
            key = f"{PREFIX}node/{self.node_index}"
            data, groups, crc, beat = node_payload(summary, self._groups_memo)
            keys, values = [], []
            if crc != self._groups_crc:   # groups first: a summary never points at a missing table
                keys.append(key + "/groups")
                values.append(groups)
            if data != self._data:
                keys.append(key)
                values.append(data)
            keys.append(key + "/beat")
            values.append(beat)
            self._store.multi_set(keys, values)   # applied in order, as one
            self._groups_crc, self._data = crc, data
            self.traffic += sum(len(v) for v in values)
            if confirm:
                self._applied(key + "/beat")
        except Exception as exc:   # a server gone mid-publish (c10d's errors, OSError): one StoreError for the watchdog
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None

    def publish_beat(self, summary: dict) -> None:
        """Only the beat: the rest of this node's summary is what it last published (the caller
        knows it did not change), so nothing is encoded but the heartbeats."""
        if self.node_index is None or self._data is None:
            return self.publish_node(summary)
        try:
            beat = beat_payload(summary)
            self._store.multi_set([f"{PREFIX}node/{self.node_index}/beat"], [beat])
            self.traffic += len(beat)
        except Exception as exc:   # a server gone (c10d's errors, OSError): one StoreError for the watchdog
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None

    def wanted_stacks(self) -> set[int]:
        return self.want()["stacks"]

    def want(self) -> dict:
        """What the leader wants of every host (host/tree.py's want_of; nothing said: all in full)."""
        from colltrace.host.tree import want_from

        return want_from(self._get(PREFIX + "want"))

    def control(self) -> tuple[bytes | None, bytes | None, bool]:
        """(want, hang, ended) as this store holds them: a host with children copies its parent's down.
        One request a round while nothing changed (the CONTROL counter), so that a parent's server
        answers each child once a round, not six times."""
        try:
            version = int(self._store.add(CONTROL, 0))
            if version != self._control_seen[0]:
                keys = [PREFIX + "want", PREFIX + "hang", PREFIX + "ended"]
                have = [self._store.check([k]) for k in keys]
                got = [bytes(self._store.get(k)) if h else None for k, h in zip(keys, have, strict=True)]
                self.traffic += sum(len(g) for g in got if g)
                self._control_seen = (version, (got[0], got[1], got[2] is not None))
        except Exception as exc:   # a server gone or a bad reply (c10d's errors, int()): one StoreError
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None
        return self._control_seen[1]

    def set_control(self, want: bytes | None, hang: bytes | None, ended: bool) -> None:
        """Write what changed of (want, hang, ended) here, for this store's readers."""
        have = getattr(self, "_control", (None, None, False))
        if want is not None and want != have[0]:
            self._set(PREFIX + "want", want)
        if hang is not None and hang != have[1]:
            self._set(PREFIX + "hang", hang)
        if ended and not have[2]:
            self._set(PREFIX + "ended", b"1")
        new = (want or have[0], hang or have[1], ended or have[2])
        if new != have:
            self._changed()
        self._control = new

    def hang_reported(self) -> str | None:
        raw = self._get(PREFIX + "hang")
        return raw.decode(errors="replace") if raw is not None else None

    def node_summary(self, index: int) -> dict | None:
        """One node's summary (another host keeps the leader's, to speak for its ranks if it dies)."""
        key = f"{PREFIX}node/{index}"
        raw = self._get(key)
        if raw is None:
            return None
        have = self._decoded.get(key)
        if have is None or have[0] != raw:
            s = decode(raw)
            if not (isinstance(s, dict) and isinstance(s.get("ranks"), dict)):
                return None
            s["groups"] = self._groups_of(key, s.get("groups_crc"), s.get("groups"))
            have = self._decoded[key] = (raw, s)
        return _with_beat(self._unfolded_of(key, raw, have[1]), None)

    # -- leader side ----------------------------------------------------------------------
    def node_summaries(self, skip: int | None = None, unfold: bool = True) -> list[dict]:
        """Every node's summary (heartbeats put back). unfold: the ranks a host folded into classes
        (host/tree.py's fold) whole again; False: as they came (a parent passes them up so)."""
        try:
            n = int(self._store.add(PREFIX + "nodes", 0))
            keys = [f"{PREFIX}node/{i}" for i in range(1, n + 1) if i != skip]
            # A node takes its index before it writes its key: ask only about keys not seen yet.
            for k in keys:
                if k not in self._present and self._store.check([k]):
                    self._present.add(k)
                b = k + "/beat"    # written after the summary: may lag it by a round
                if k in self._present and b not in self._present and self._store.check([b]):
                    self._present.add(b)
            present = [k for k in keys if k in self._present]
            now = time.monotonic()
            fresh = now - self._beats_read_at >= BEATS_EVERY_S
            beats = [k + "/beat" for k in present if k + "/beat" in self._present] if fresh else []
            values = self._store.multi_get(present + beats) if present else []
            self.traffic += sum(len(v) for v in values)
        except Exception as exc:   # a server gone or a bad reply (c10d's errors, OSError): one StoreError
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None
        if fresh:
            self._beats_read_at = now
            for k, v in zip(beats, values[len(present):], strict=False):
                try:
                    self._beats[k[:-len("/beat")]] = json.loads(bytes(v))
                except ValueError:
                    continue
        beat_of = self._beats
        out = []
        for key, v in zip(present, values, strict=False):
            try:
                raw = bytes(v)
                have = self._decoded.get(key)
                if have is not None and have[0] == raw:
                    s = have[1]
                else:
                    s = decode(raw)
                    if not (isinstance(s, dict) and isinstance(s.get("ranks"), dict)):
                        continue
                    s["groups"] = self._groups_of(key, s.get("groups_crc"), s.get("groups"))
                    self._decoded[key] = (raw, s)
                if unfold:
                    s = self._unfolded_of(key, raw, s)
            except StoreError:
                continue  # one node's bad value must not hide the others
            beat = beat_of.get(key)
            if not fresh and self._beaten.get(key) == (id(s["ranks"]), id(beat)):
                out.append(dict(s, t=beat.get("t", s.get("t")) if isinstance(beat, dict) else s.get("t")))
                continue   # its entries hold these heartbeats already
            self._beaten[key] = (id(s["ranks"]), id(beat))
            out.append(_with_beat(s, beat))
        return out

    def _unfolded_of(self, key: str, raw: bytes, s: dict) -> dict:
        """A summary with its classes unfolded, done once per value."""
        if not s.get("classes"):
            return s
        have = self._unfolded.get(key)
        if have is None or have[0] != raw:
            from colltrace.host.tree import unfold

            have = self._unfolded[key] = (raw, dict(s, ranks=unfold(s["ranks"], s["classes"]), classes={}))
        return have[1]

    def _groups_of(self, key: str, crc, inline) -> dict:
        """A node's group table, fetched again only when its checksum changed."""
        if crc is None:
            return inline if isinstance(inline, dict) else {}
        have = self._groups.get(key)
        if have is None or have[0] != crc:
            groups = decode(self._get(key + "/groups") or encode({}))
            have = self._groups[key] = (crc, groups if isinstance(groups, dict) else {})
        return have[1]

    def set_wanted_stacks(self, ranks, groups=(), every: bool = True, sample=()) -> None:
        self._set(PREFIX + "want", json.dumps({"stacks": sorted(ranks), "groups": sorted(groups), "all": every,
                                               "sample": sorted(sample)}).encode())
        self._changed()

    def publish_findings(self, findings: list[Finding]) -> None:
        self._set(PREFIX + "findings", encode(finding.to_json(findings)))

    def findings(self) -> list[Finding]:
        raw = self._get(PREFIX + "findings")
        return finding.from_json(decode(raw)) if raw is not None else []

    def report_hang(self, why: str) -> None:
        self._set(PREFIX + "hang", why.encode())
        self._changed()

    def report_end(self) -> None:
        self._set(PREFIX + "ended", b"1")
        self._changed()

    def _changed(self) -> None:
        """After a control key's set, on the same connection: readers see the key, then the count."""
        try:
            self._store.add(CONTROL, 1)
        except Exception as exc:   # c10d's RuntimeError/DistStoreError, OSError: one StoreError
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None

    # -- plumbing ---------------------------------------------------------------------------
    def join(self) -> int:
        """This host joins the hosts its server has seen: its index among them (1: the first)."""
        try:
            return int(self._store.add(PREFIX + "nodes", 1))
        except Exception as exc:   # c10d's RuntimeError/DistStoreError, OSError: one StoreError
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None

    def read(self, key: str) -> bytes | None:
        """One key's value (None: not set)."""
        return self._get(key)

    def write(self, key: str, value: bytes) -> None:
        self._set(key, value)

    def _get(self, key: str) -> bytes | None:
        try:
            if not self._store.check([key]):
                return None
            v = bytes(self._store.get(key))
            self.traffic += len(v)
            return v
        except Exception as exc:   # c10d's RuntimeError/DistStoreError, OSError: one StoreError
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None

    def _set(self, key: str, value: bytes) -> None:
        try:
            self._store.set(key, value)
            self.traffic += len(value)
            self._applied(key)
        except Exception as exc:   # c10d's RuntimeError/DistStoreError, OSError: one StoreError
            raise StoreError(f"store at {self.address}: {_one_line(exc)}") from None

    def _applied(self, key: str) -> None:
        """c10d's set() returns before the server has applied it (another client can still miss
        it); a request that is answered, on the same connection, returns only after it."""
        self._store.check([key])


def _with_beat(summary: dict, beat) -> dict:
    """A (cached) summary with its time and heartbeats put back. The heartbeats are set in the
    cached entries themselves: copying every entry each round cost the root of 16,384 ranks 18 ms
    a round, and a summary whose bytes did not change keeps its ranks table (host/tree.py's
    Suspicion counts each table once)."""
    beat = beat if isinstance(beat, dict) else {}
    hb = beat.get("hb") if isinstance(beat.get("hb"), dict) else {}
    ranks = summary["ranks"]
    for r, t in hb.items():
        e = ranks.get(r)
        if isinstance(e, dict):
            e["heartbeat"] = t
    return dict(summary, t=beat.get("t", summary.get("t")))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300].rstrip(".") if text else type(exc).__name__   # our line goes on after it


def snapshot_to_folder(address: str, directory: str) -> str:
    """`colltrace dump --from-store`: the live (even hung) job's merged state into DIR/snapshot.json."""
    import time

    host, port = parse_address(address)
    link = StoreLink(host, port, follow_leader=True)
    summaries = link.node_summaries()
    if not summaries:
        raise StoreError(f"the store at {address} holds no colltrace state (is the job running with COLLTRACE=1?)")
    from colltrace.model.build import merge

    snap = merge(summaries, time.time())
    snap["findings"] = finding.to_json(link.findings())
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, layout.SNAPSHOT)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(snap, default=str))   # one C encode, not json.dump's Python one
    os.replace(tmp, path)
    return path
