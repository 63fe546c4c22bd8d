"""The pytest guard's thread and a test that forks its ranks: a fork never lands in the middle
of one of the guard's rounds (an import half done there would hang the child for good)."""
from __future__ import annotations

import os
import threading
import time

from colltrace.testing import guard


def test_a_fork_waits_for_the_guards_round_and_the_child_is_free_to_run_its_own():
    guard._hold_forks_during_rounds()
    in_round = threading.Event()

    def a_round():
        with guard._round_lock:
            in_round.set()
            time.sleep(0.5)

    t = threading.Thread(target=a_round)
    t.start()
    assert in_round.wait(10)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:   # the child: the lock must be free for its own guard, if it starts one
        os._exit(0 if guard._round_lock.acquire(timeout=5) else 3)
    waited = time.monotonic() - t0
    _, status = os.waitpid(pid, 0)
    t.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert waited >= 0.3   # the fork waited for the round to end
    assert guard._round_lock.acquire(timeout=1)   # and the parent's lock was given back
    guard._round_lock.release()
