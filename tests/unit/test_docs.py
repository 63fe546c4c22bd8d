"""What a reader with a clone meets in the README, the other docs and the example's own README:
folders the clone holds, and no story told by reference to documents it does not have."""
from __future__ import annotations

import glob
import os
import re

import pytest

from helpers.paths import ROOT

DOCS = ["README.md", "benchmarks/README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/design.md", "docs/usage.md",
        *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "examples", "*", "*")))]
DOCS = [d for d in DOCS if d.endswith((".md", ".py"))]


def text(doc: str) -> str:
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


@pytest.mark.parametrize("doc", DOCS)
def test_every_folder_a_doc_names_is_in_the_clone(doc):
    """`examples/distill/`, `tests/fixtures/fr-gloo/`: a folder of two parts or more, named as
    one to look in (single names such as `lightning/` are other projects' folders)."""
    named = re.findall(r"`([\w.-]+(?:/[\w.-]+)+/)`", text(doc))
    missing = [n for n in named if not os.path.isdir(os.path.join(ROOT, n))]
    assert missing == [], f"{doc} names folders a clone does not have: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_no_doc_leans_on_reports_the_reader_has_not_got(doc):
    found = re.findall(r"[^\n]*\b(?:the (?:user )?reports'?|the seeds'?|user reports)\b[^\n]*", text(doc), re.I)
    assert found == [], f"{doc}: say what happened instead of pointing at reports: {found}"


def test_what_build_hooks_saves_is_one_figure_in_the_help_the_install_notes_and_the_faq():
    """benchmarks/README.md's measured figures (a traced 1-element all_reduce, with and without the
    build, torch 2.13 and 2.14.1) are the ones the help, the README's Install and its FAQ give."""
    from colltrace.commands.build_hooks import BuildHooksCommand

    readme = text("README.md")
    table = text("benchmarks/README.md").splitlines()
    on_213 = next(row for row in table if row.startswith("| instructions per 1-element `all_reduce`"))
    on_214 = next(row for row in table if row.startswith("| the same on torch 2.14.1"))
    measured = [re.search(r"traced \([^|]*?\) \*\*(\+[\d,]+)\*\*", on_213).group(1),
                re.search(r"without the build[^|]*?\*\*(\+[\d,]+)\*\*", on_213).group(1),
                re.search(r"traced \*\*(\+[\d,]+)\*\*", on_214).group(1),
                re.search(r"the Python route[^|]*?\*\*(\+[\d,]+)\*\*", on_214).group(1)]
    install = readme[readme.index("For the least cost per collective"):readme.index("## Quick start")]
    faq = readme[readme.index("**What does it cost?**"):readme.index("**Which torch?**")]
    for where, words in (("build-hooks' help", BuildHooksCommand.help), ("Install", install), ("the FAQ", faq)):
        said = re.findall(r"\+[\d,]{3,}", words)
        assert sorted(said) == sorted(measured), f"{where} says {said}; benchmarks/README.md measured {measured}"


def test_nothing_of_a_run_is_in_the_clone_and_run_folders_are_ignored():
    """What the README's commands leave in the repository root (colltrace run's folders, the
    example's checkpoints) is never shipped: a newcomer's first run starts where ours did not."""
    import subprocess

    with open(os.path.join(ROOT, ".gitignore")) as f:
        ignored = f.read().splitlines()
    assert "/colltrace-out/" in ignored and "/distill-out/" in ignored
    if os.path.exists(os.path.join(ROOT, ".git")):   # a clone (CI's, a developer's): nothing of a run tracked
        tracked = subprocess.run(["git", "ls-files", "--", "colltrace-out", "distill-out"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=30)
        assert tracked.returncode == 0 and tracked.stdout == ""


def test_the_closing_verdict_is_cut_at_a_words_end():
    from colltrace.model.finding import Finding
    from colltrace.reporters.text import headline

    words = " ".join(f"word{i}" for i in range(200))
    f = Finding.from_json({"kind": "stall", "summary": f"Stall: {words}. The rest."})
    cut = headline(f, limit=100)
    assert len(cut) <= 100 and cut.endswith(" …") and cut[:-2] == f"Stall: {words}"[:len(cut) - 2]
    assert re.fullmatch(r"Stall: (word\d+ )*word\d+ …", cut), cut
    assert headline(Finding.from_json({"kind": "stall", "summary": "Short. Then more."})) == "Short."
