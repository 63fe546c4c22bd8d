"""A rank that ends itself, each way a program ends, while rank 0 waits in the next all_reduce:
the ending named with the process's real exit code and the line it was called at, live (the
watchdog's findings.jsonl) and post-mortem (`colltrace analyze` of the folder), with rank 0's
failed all_reduce (gloo's "Connection closed by peer", or its timeout) as the consequence.
A healthy job that ends with sys.exit(0) everywhere: tests/integration/test_desync.py."""
from __future__ import annotations

import json
import signal

from helpers.cli import run_cli
from helpers.jobs import findings, markers
from helpers.waiting import wait_until

SCRIPT = "endings.py"

# way: (the process's exit code, its line's marker in endings.py or None, how its ending reads)
WAYS = {
    "os_exit": (4, "end_os_exit", "exited with code 4 at {at} (load_shard), called os._exit"),
    "sys_exit": (3, "end_sys_exit", "exited with code 3 at {at} (load_shard), called sys.exit"),
    "exit": (5, "end_exit", "exited with code 5 at {at} (load_shard), called exit()"),
    "raise": (6, None, "exited with code 6 (raise SystemExit(6)"),
    "return": (0, None, "exited with code 0 (its program returned)"),
    "error": (1, "end_error", "exited with code 1 (ValueError: no shard for this rank); it was at {at} (load_shard)"),
    "interrupt": (-signal.SIGINT, "end_interrupt",
                  "was interrupted by SIGINT (KeyboardInterrupt) at {at} (load_shard)"),
}
# Known at once: their code is the call's own (the others' comes after the interpreter's shutdown).
AT_ONCE = ("os_exit", "sys_exit", "exit", "error", "interrupt")


def words(way: str) -> str:
    _, marker, text = WAYS[way]
    return text.format(at=f"{SCRIPT}:{markers(SCRIPT)[marker]}" if marker else "")


JOBS = ("os_exit", "sys_exit,raise,return", "exit,error,interrupt")   # rank 1's way first: 2 ranks, 4, 4


def test_a_rank_that_ends_itself_is_named_with_its_code_and_line(gloo_job):
    """The three jobs run side by side (their waits overlap); each is judged on its own."""
    jobs = [(ways.split(","), gloo_job(SCRIPT, ways.count(",") + 2, args=[ways])) for ways in JOBS]
    for ways, job in jobs:
        check(ways, job)


def check(ways: list[str], job) -> None:
    enders = {rank: way for rank, way in enumerate(ways, 1)}
    codes = job.wait(120)
    assert codes == [1] + [WAYS[w][0] for w in ways], (ways, job.stderr(0)[-3000:])
    waits = f"{SCRIPT}:{markers(SCRIPT)['waits']} (main)"
    # live: one dead_rank per ending rank, each as it ended (the watchdog writes as it judges)
    assert wait_until(lambda: {f.get("rank") for f in findings(job.dir)} >= set(enders), 30), findings(job.dir)
    live = {f["rank"]: f for f in findings(job.dir)}
    assert {f["kind"] for f in live.values()} == {"dead_rank"}
    for rank, way in enders.items():
        if way in AT_ONCE:
            assert words(way) in live[rank]["summary"], (way, live[rank]["summary"])
    # post-mortem: the same endings, each with the process's own code, and rank 0's failure as
    # their consequence
    out = run_cli("analyze", job.dir, "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["culprits"] == sorted(enders)
    found = {f["rank"]: f for f in doc["findings"]}
    assert set(found) == set(enders) and {f["kind"] for f in found.values()} == {"dead_rank"}
    for rank, way in enders.items():
        f = found[rank]
        assert words(way) in f["summary"], (way, f["summary"])
        assert f["ranks"][str(rank)]["state"] == "exited"
        if WAYS[way][0] >= 0:
            assert f["exit"]["code"] == WAYS[way][0]
        else:
            assert f["exit"]["signal"] == "SIGINT"
        [failed] = f["failed"]
        assert failed["ranks"] == [0] and failed["op"] == "all_reduce" and failed["error"]
        assert f"Rank 0 failed in all_reduce #2 on group 0 (default_pg, ranks 0-{len(ways)}) at {waits}" in f["summary"]
    text = run_cli("analyze", job.dir)
    assert text.returncode == 1 and "no problems found" not in text.stdout
    assert f"Culprits: look at {'rank 1' if len(ways) == 1 else f'ranks 1-{len(ways)}'} first" in text.stdout
