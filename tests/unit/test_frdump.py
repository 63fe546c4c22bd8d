"""Post-mortem on PyTorch Flight Recorder dumps: NVIDIA's real 16-rank NCCL dumps (shared data)
and small gloo dumps made by tests/fixtures/make_fr_gloo.py; bad folders; unsafe pickles."""
from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.paths import FIXTURES

GLOO = Path(FIXTURES) / "fr-gloo"
NVRX_CASES = ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"]


def nvrx_dir() -> Path:
    """NVIDIA's dumps, shipped with the tests (tests/fixtures/nvrx-16rank/README.md says whence)."""
    return Path(FIXTURES) / "nvrx-16rank"

def cli(*args):
    return run_cli(*args)


def analyze_json(d) -> tuple[int, dict]:
    out = cli("analyze", d, "--json")
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize("case", NVRX_CASES)
def test_nvrx_culprits_are_the_injected_fault_ranks(case):
    d = nvrx_dir() / case
    truth = json.loads(re.search(r"Fault ranks: (\[[^\]]*\])", (d / "fault_injection.log").read_text()).group(1))
    rc, out = analyze_json(d)
    assert rc == 1 and out["findings"]
    assert out["culprits"] == sorted(truth)
    text = cli("analyze", d).stdout
    first = text.splitlines()[0]
    assert first.startswith("Culprits: look at ranks ") and f"{truth[0]},{truth[1]}" in first, first
    assert "only wait" in first
    # the report prints the culprits' findings and counts the ones only stuck behind them
    shown = len(re.findall(r"^\[\d+\] ", text, re.M))
    hidden = re.search(r"^(\d+) more findings are collectives stuck behind the culprits", text, re.M)
    assert shown + (int(hidden.group(1)) if hidden else 0) == len(out["findings"])
    assert shown < len(out["findings"]) or case == "lock_gil_1st"


def test_gloo_mismatch_names_the_odd_rank_and_its_op():
    rc, out = analyze_json(GLOO / "mismatch")
    assert rc == 1
    [f] = out["findings"]
    assert f["kind"] == "mismatch" and f["differs"] == ["op"] and f["seq"] == 4
    assert {c["op"]: c["ranks"] for c in f["classes"]} == {"all_reduce": [0, 1], "broadcast": [2]}
    assert out["culprits"] == [2]
    # the pickle dump (rank 0) carries stacks: the user's line is in the finding
    assert any(fr["file"].endswith("make_fr_gloo.py") for fr in f["ranks"]["0"]["frames"])


def test_gloo_skipped_collective_is_a_stall_on_the_rank_that_skipped():
    rc, out = analyze_json(GLOO / "skipped")
    assert rc == 1
    [f] = out["findings"]
    assert f["kind"] == "stall" and f["missing_ranks"] == [1] and f["waiting"] == [0, 2] and f["seq"] == 4
    assert out["culprits"] == [1]


@pytest.mark.parametrize("case", ["mismatch_fixed", "skipped_fixed"])
def test_gloo_fixed_jobs_have_no_finding(case):
    rc, out = analyze_json(GLOO / case)
    assert rc == 0 and out == {"findings": [], "culprits": [], "warnings": [], "stragglers": []}


def test_prefix_chooses_among_several(tmp_path):
    for name in ("fr_0", "fr_1", "fr_2"):
        (tmp_path / name).write_bytes((GLOO / "skipped" / name).read_bytes())
        (tmp_path / f"other_{name[-1]}").write_bytes((GLOO / "skipped_fixed" / name).read_bytes())
    out = cli("analyze", tmp_path)
    assert out.returncode == 2 and "--prefix" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert cli("analyze", tmp_path, "--prefix", "fr_").returncode == 1
    assert cli("analyze", tmp_path, "--prefix", "other_").returncode == 0


@pytest.mark.parametrize("content", [None, b"hello\n", b'{"not": "a dump"}', b"\x80\x04K\x01.", b"\x80\x04\x95\x10"])
def test_empty_or_foreign_folder_is_exit_2_naming_the_file(tmp_path, content):
    if content is not None:
        (tmp_path / "dump_0").write_bytes(content)
    for cmd in (["analyze", tmp_path], ["export", tmp_path, "--perfetto", tmp_path / "o.json"]):
        out = cli(*cmd)
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("colltrace: error:") and "Traceback" not in out.stderr
        assert ("dump_0" if content is not None else "no colltrace traces") in lines[0]
        assert "no findings" not in out.stdout


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    from colltrace.tracefile import frdump

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.9", "entries": [_Boom()]}))
    with pytest.raises(frdump.DumpError, match="refuses to load"):
        frdump.read(str(tmp_path))
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def _entry(seq, op="all_reduce", state="scheduled", sizes=((8,),), dtypes=("Float",), pg=("0", "default_pg"), **kw):
    e = {"record_id": seq, "pg_id": 0, "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
         "profiling_name": f"nccl:{op}", "time_created_ns": 10**18 + seq * 10**6,
         "input_sizes": [list(s) for s in sizes], "input_dtypes": list(dtypes),
         "output_sizes": [list(s) for s in sizes], "output_dtypes": list(dtypes),
         "state": state, "retired": False, "timeout_ms": 600000, "is_p2p": False, "frames": []}
    e.update(kw)
    return e


def _dumps(last: dict, version="2.4", n=3) -> dict:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(n)))}}
    return {r: {"version": version, "pg_config": cfg, "entries": [_entry(1, state="completed"), last.get(r, _entry(2))]}
            for r in range(n)}


@pytest.mark.parametrize("field,odd", [("sizes", _entry(2, sizes=((4,),))), ("dtypes", _entry(2, dtypes=("Half",))),
                                       ("op", _entry(2, op="broadcast"))])
def test_mismatch_of_sizes_dtypes_or_op_is_found_in_nccl_dumps(field, odd):
    from colltrace.analysis import analyze, culprits
    from colltrace.tracefile import frdump

    snap = frdump.to_snapshot(_dumps({1: odd}))
    fs = analyze(snap, stall_s=0.0, now=snap["taken_at"])
    assert [f.kind for f in fs] == ["mismatch"]
    assert fs[0].differs == [{"sizes": "shapes"}.get(field, field)]
    assert culprits.explain(fs).culprits == [1]


def test_older_versions_without_collective_seq_id_or_is_p2p_are_read():
    """Version 2.0/2.1 dumps (torch 2.4): `seq_id`, no is_p2p, no pg_status, no dtypes."""
    from colltrace.analysis import analyze
    from colltrace.tracefile import frdump

    def old(seq, **kw):
        e = _entry(seq, **kw)
        e["seq_id"] = e.pop("collective_seq_id")
        for k in ("is_p2p", "p2p_seq_id", "input_dtypes", "output_dtypes"):
            e.pop(k)
        return e
    dumps = {r: {"version": "2.0", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                 "entries": [old(1, state="completed")] + ([old(2)] if r == 0 else [])} for r in range(2)}
    snap = frdump.to_snapshot(dumps)
    [f] = analyze(snap, stall_s=0.0, now=snap["taken_at"])
    assert f.kind == "stall" and f.missing_ranks == [1]


def test_cross_group_wait_cycle_is_a_deadlock_in_dumps():
    """Rank 0 waits in group A for rank 1, which waits in group B for rank 0."""
    from colltrace.analysis import analyze, culprits
    from colltrace.tracefile import frdump

    cfg = {"A": {"name": "A", "desc": "", "ranks": "[0, 1]"}, "B": {"name": "B", "desc": "", "ranks": "[0, 1]"}}
    a, b = ("A", "a"), ("B", "b")
    dumps = {0: {"version": "2.9", "pg_config": cfg,
                 "entries": [_entry(1, pg=a, state="completed"), _entry(1, pg=b, state="completed"),
                             _entry(2, pg=a, op="barrier")]},
             1: {"version": "2.9", "pg_config": cfg,
                 "entries": [_entry(1, pg=a, state="completed"), _entry(1, pg=b, state="completed"), _entry(2, pg=b)]}}
    snap = frdump.to_snapshot(dumps)
    fs = analyze(snap, stall_s=0.0, now=snap["taken_at"])
    assert [f.kind for f in fs] == ["deadlock"]
    assert {c["group"] for c in fs[0].cycle} == {"A", "B"}
    assert culprits.explain(fs).culprits in ([0], [1])


def test_colltrace_traces_get_culprits_too():
    """The distillation example's checkpoint_barrier hang, as `colltrace run --on-hang abort` left
    it: ranks 0-2 wait in the checkpoint barrier that the teacher (rank 3) never calls."""
    rc, out = analyze_json(Path(FIXTURES) / "distill-checkpoint-barrier")
    assert rc == 1 and [f["kind"] for f in out["findings"]] == ["deadlock"]
    assert out["culprits"] == [0, 1, 2]
    first = cli("analyze", Path(FIXTURES) / "distill-checkpoint-barrier").stdout.splitlines()[0]
    assert first.startswith("Culprits: look at ranks 0-2 first.") and "rank 3" in first


def test_unmatched_send_in_dumps_names_the_peer():
    """Rank 0 sends to rank 1 twice; rank 1 posted one recv (done): the second send is unmatched."""
    from colltrace.analysis import analyze, culprits
    from colltrace.tracefile import frdump

    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}

    def p2p(i, name, **kw):
        return _entry(1, op=name, is_p2p=True, p2p_seq_id=i, record_id=10 + i, **kw)
    dumps = {0: {"version": "2.9", "pg_config": cfg,
                 "entries": [p2p(1, "send 0->1", state="completed"), p2p(2, "send 0->1")]},
             1: {"version": "2.9", "pg_config": cfg, "entries": [p2p(1, "recv 1<-0", state="completed")]}}
    snap = frdump.to_snapshot(dumps)
    fs = analyze(snap, stall_s=0.0, now=snap["taken_at"])
    unmatched = [f for f in fs if f.kind == "unmatched_p2p"]
    assert len(unmatched) == 1 and unmatched[0].rank == 0 and unmatched[0].peer == 1
    assert culprits.explain(fs).culprits == [1]


def test_p2p_wait_cycle_is_a_deadlock_in_dumps():
    """Both ranks receive first from each other: neither ever sends."""
    from colltrace.analysis import analyze
    from colltrace.tracefile import frdump

    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    dumps = {r: {"version": "2.9", "pg_config": cfg,
                 "entries": [_entry(1, state="completed"),
                             _entry(1, op=f"recv {r}<-{1 - r}", is_p2p=True, p2p_seq_id=1, record_id=5)]}
             for r in range(2)}
    snap = frdump.to_snapshot(dumps)
    fs = analyze(snap, stall_s=0.0, now=snap["taken_at"])
    assert [f.kind for f in fs] == ["deadlock"]
    assert all(c["p2p"] for c in fs[0].cycle) and len(fs[0].cycle) == 2
