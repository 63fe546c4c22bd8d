"""The leader watchdog's own meeting point, announced by one key in the job's store.

The job's TCPStore belongs to the program: colltrace writes exactly one key there,
LEADER_KEY = "HOST:PORT" of a small c10d TCPStore server that the leader watchdog (the host
of rank 0) serves itself, and deletes it when the job ends. Every other host's watchdog reads
that key once, lets go of the job's store, and talks only to the leader's server. The address
is this host's end of a route to the job's store (the one its default group was made with), so
it is one the other hosts can reach; COLLTRACE_LEADER_PORT fixes the port (default: any free one).
"""
from __future__ import annotations

import socket
from datetime import timedelta

from colltrace import config
from colltrace.host import storelink
from colltrace.host.storelink import PREFIX, StoreError, _one_line, parse_address, quiet_c10d

LEADER_KEY = PREFIX + "leader"


def parent_key(index: int) -> str:
    """On a job of many hosts (host/tree.py) a host with children of its own announces its
    server by this key, as the leader does by LEADER_KEY; deleted when the job ends."""
    return f"{PREFIX}agg/{index}"




def local_address_towards(host: str, port: int) -> str:
    """This host's address on the route to HOST (no packet is sent: a UDP connect only routes)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def leader_address(job_store, key: str = LEADER_KEY) -> str | None:
    """The leader's "HOST:PORT" (or another key's) as announced in the job's store (a client), or None."""
    try:
        if not job_store.check([key]):
            return None
        return bytes(job_store.get(key)).decode()
    except Exception as exc:   # c10d's store errors are no Python type we can name: one StoreError
        raise StoreError(f"store: {_one_line(exc)}") from None


def find_leader(host: str, port: int, timeout_s: float = 5.0, keys=(LEADER_KEY,),
                connect=storelink.connect) -> tuple[str, int] | list[tuple[str, int] | None] | None:
    """Read the announcement once and let go of the job's store. Several keys: a list of
    addresses (None for each not announced yet); one key: its address or None."""
    store = connect(host, port, timeout_s)
    try:
        texts = [leader_address(store, k) for k in keys]
    finally:
        del store
    found = [parse_address(t) if t else None for t in texts]
    return found[0] if len(keys) == 1 else found


class MeetingPoint:
    """The leader's TCPStore server, and its one key in the job's store."""

    def __init__(self, job_host: str, job_port: int, timeout_s: float = 5.0, key: str = LEADER_KEY,
                 connect=storelink.connect):
        quiet_c10d()   # torch's first import in the leader's watchdog: its log level is set now
        from torch.distributed import TCPStore

        self.job = (job_host, job_port)
        self._connect = connect   # to the job's store
        self.key = key
        self.timeout_s = timeout_s
        want = config.value("leader_port")
        me = local_address_towards(job_host, job_port)
        try:
            self.server = TCPStore(me, want, is_master=True,
                                   timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        except Exception as exc:   # a port taken, an address refused (c10d's errors): one StoreError
            raise StoreError(f"cannot serve the watchdogs' meeting point on {me}: {_one_line(exc)}") from None
        self.address = (me, self.server.port)
        self.announced = False

    def announce(self) -> None:
        store = self._connect(*self.job, self.timeout_s)
        try:
            store.set(self.key, f"{self.address[0]}:{self.address[1]}".encode())
            store.check([self.key])   # answered: the set is applied before we let go
            self.announced = True
        except Exception as exc:   # c10d's RuntimeError/DistStoreError, OSError: one StoreError for the caller
            raise StoreError(f"store at {self.job[0]}:{self.job[1]}: {_one_line(exc)}") from None
        finally:
            del store

    def withdraw(self) -> None:
        """Delete the one key (the job's store may be gone already: then there is nothing to do)."""
        if not self.announced:
            return
        self.announced = False
        try:
            store = self._connect(*self.job, min(self.timeout_s, 2.0))
            store.delete_key(self.key)
            del store
        except Exception:   # the store may be gone at exit: nothing left to withdraw
            pass
