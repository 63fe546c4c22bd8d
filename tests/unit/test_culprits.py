"""culprits.explain: which ranks the findings point at as the cause, and which only wait."""
from __future__ import annotations

from colltrace.analysis.culprits import explain as _explain
from colltrace.model.finding import Mismatch, Stall
from colltrace.reporters.culprits import culprit_paragraph


def explain(findings):
    """The analyzer's facts with the reporter's paragraph beside them, as `colltrace analyze` prints."""
    c = _explain(findings)
    return {"culprits": c.culprits, "reasons": c.reasons, "others": c.others, "consequences": c.consequences,
            "paragraph": culprit_paragraph(c)}


def stall(group, seq, waiting, missing=(), stage="arrival", completed=(), key=None):
    return Stall(stage=stage, key=key or f"stall:{group}:{seq}:{stage}", group={"name": group}, seq=seq,
                 waiting=list(waiting), missing_ranks=list(missing),
                 ranks={str(r): {"op": "all_reduce", "seq": seq} for r in [*waiting, *missing]},
                 completed_ranks=list(completed) if stage == "completion" else None)


def test_nothing_wrong_names_nobody():
    assert explain([]) == {"culprits": [], "reasons": {}, "others": [], "consequences": [], "paragraph": ""}


def test_work_everyone_entered_is_a_consequence_when_a_rank_is_missing_elsewhere():
    fs = [stall("tp", 7, [0, 2], stage="completion"), stall("dp", 3, [0, 2], missing=[1])]
    c = explain(fs)
    assert c["culprits"] == [1] and c["consequences"] == ["stall:tp:7:completion"]
    assert c["paragraph"].startswith("Culprits: look at rank 1 first. Rank 1 never entered all_reduce #3 on group dp")


def test_a_hang_nobody_explains_names_the_ranks_in_it():
    c = explain([stall("tp", 7, [0, 1], stage="completion")])
    assert c["culprits"] == [0, 1] and c["consequences"] == []


def test_a_rank_that_did_not_complete_what_its_peers_completed_is_a_culprit_unless_it_waits():
    lag = stall("tp", 7, [3], stage="completion", completed=[2])
    assert explain([lag])["culprits"] == [3]
    # rank 3 lags on tp because it waits for rank 5 on another group: rank 5 is the cause
    assert explain([lag, stall("pp", 2, [3], missing=[5])])["culprits"] == [5]


def test_mismatch_names_the_smallest_class():
    f = Mismatch(key="mismatch:0:4", group={"name": "0"}, seq=4, differs=["op"],
                 classes=[{"ranks": [0, 1, 3], "op": "all_reduce"}, {"ranks": [2], "op": "broadcast"}], ranks={})
    c = explain([f])
    assert c["culprits"] == [2] and "broadcast where ranks 0-1,3 called all_reduce" in c["paragraph"]
