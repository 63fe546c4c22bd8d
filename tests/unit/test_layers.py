"""The dependency order docs/design.md states ("Dependency order"), held against every import of
every module under colltrace/ and dashboard/colltrace_dashboard/: the document is the source of
truth, this test only reads it.

A module imports its own package and the lines above its own; the packages on one line are peers
and import neither each other. Imports inside functions and relative imports count; only
`colltrace.__version__` may be read from anywhere."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from helpers.paths import ROOT

DESIGN = os.path.join(ROOT, "docs", "design.md")
PACKAGES = {"colltrace": os.path.join(ROOT, "colltrace"),
            "colltrace_dashboard": os.path.join(ROOT, "dashboard", "colltrace_dashboard")}
EVERYWHERE = {("colltrace", "__version__")}   # the package's own __init__ runs first anyway


def numbered(head: str, what: str) -> dict[str, int]:
    """{name: its line's number} from the numbered list under the heading `head` of docs/design.md
    (each line's names in backquotes before its " — "); `what` names the list in the messages."""
    with open(DESIGN) as f:
        text = f.read()
    assert head in text, f"docs/design.md has no {head!r} section"
    section = re.split(r"\n#", text.split(head, 1)[1], maxsplit=1)[0]
    out: dict[str, int] = {}
    numbers = []
    for line in section.splitlines():
        m = re.match(r"(\d+)\. (.*)", line)
        if not m:
            continue
        numbers.append(int(m.group(1)))
        names = re.findall(r"`([\w.]+)`", m.group(2).split(" — ", 1)[0])
        assert names, f"docs/design.md: line {m.group(1)} of {what} names no module: {line!r}"
        for name in names:
            assert name not in out, f"docs/design.md: {name} is in two lines of {what}"
            out[name] = int(m.group(1))
    assert numbers == list(range(1, len(numbers) + 1)) and numbers, \
        f"docs/design.md: {what} must be numbered 1, 2, 3, ... (found {numbers})"
    return out


def layers() -> dict[str, int]:
    """{name: its layer} from "### Dependency order"."""
    return numbered("### Dependency order", "the dependency order")


def modules() -> dict[str, tuple[str, bool]]:
    """{dotted name: (path, is a package)} of every .py under the two packages."""
    out = {}
    for top, base in PACKAGES.items():
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            rel = os.path.relpath(dirpath, base)
            parts = [top] + ([] if rel == "." else rel.split(os.sep))
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                if name == "__init__.py":
                    out[".".join(parts)] = (os.path.join(dirpath, name), True)
                else:
                    out[".".join(parts + [name[:-3]])] = (os.path.join(dirpath, name), False)
    return out


def imports(name: str, path: str, is_package: bool, known) -> list[tuple[int, str, str]]:
    """(line, imported module, how it was written) for every import in the file, anywhere in it."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[:len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if (base, alias.name) in EVERYWHERE:
                    continue
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub if sub in known else base,
                            f"from {'.' * node.level}{node.module or ''} import {alias.name}"))
    return out


def owner(module: str, order: dict[str, int], known) -> str | None:
    """The listed name a module belongs to: the longest one naming it or a package above it
    (`colltrace` alone names only the package's own __init__, not every module in it)."""
    while module not in known and "." in module:   # colltrace.rank._fastpath (compiled): its package
        module = module.rsplit(".", 1)[0]
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in order and (candidate != "colltrace" or module == "colltrace"):
            return candidate
    return None


def test_the_order_names_modules_that_exist():
    known = modules()
    order = layers()
    missing = [n for n in order if n not in known]
    assert missing == [], f"docs/design.md's dependency order names modules that do not exist: {missing}"


def test_every_module_is_in_a_layer():
    known = modules()
    order = layers()
    lost = sorted(m for m in known if owner(m, order, known) is None)
    assert lost == [], f"modules in no line of docs/design.md's dependency order: {lost}"


def test_every_import_follows_the_order():
    known = modules()
    order = layers()
    wrong = []
    for name, (path, is_package) in sorted(known.items()):
        mine = owner(name, order, known)
        if mine is None:
            continue   # test_every_module_is_in_a_layer says so
        for line, target, written in imports(name, path, is_package, known):
            if target.split(".")[0] not in PACKAGES:
                continue
            theirs = owner(target, order, known)
            if theirs is None or theirs == mine:
                continue
            if order[theirs] >= order[mine]:
                where = os.path.relpath(path, ROOT)
                why = (f"peers on layer {order[mine]}" if order[theirs] == order[mine] else
                       f"{mine} is layer {order[mine]}, {theirs} layer {order[theirs]}")
                wrong.append(f"{name} imports {target} against the order ({where}:{line}: {written}; {why})")
    assert wrong == [], "imports against docs/design.md's dependency order:\n" + "\n".join(wrong)


def inner_layers(package: str) -> dict[str, int]:
    """{module: its line} from the list under "#### `<package>`" of "### Inside ..."."""
    return numbered(f"#### `{package}`", f"{package}'s list")


def test_inside_rank_and_host_every_module_is_in_a_line_and_imports_follow_it():
    known = modules()
    wrong = []
    for package in ("colltrace.rank", "colltrace.host"):
        order = inner_layers(package)
        mine_all = {n[len(package) + 1:]: v for n, v in known.items() if n.startswith(package + ".")}
        wrong += [f"{package}.{n} is in no line of docs/design.md's list for {package}"
                  for n in sorted(mine_all) if n not in order]
        wrong += [f"docs/design.md's list for {package} names {n}, which does not exist"
                  for n in sorted(order) if n not in mine_all]
        for name, (path, is_package) in sorted(mine_all.items()):
            if name not in order:
                continue
            for line, target, written in imports(f"{package}.{name}", path, is_package, known):
                if not target.startswith(package + "."):
                    continue
                theirs = target[len(package) + 1:].split(".")[0]
                if theirs == name or theirs not in order:
                    continue
                if order[theirs] >= order[name]:
                    where = os.path.relpath(path, ROOT)
                    wrong.append(f"{package}.{name} (line {order[name]}) imports {theirs} (line {order[theirs]}) "
                                 f"at {where}:{line}: {written}")
    assert wrong == [], "against docs/design.md's order inside rank/ and host/:\n" + "\n".join(wrong)


def test_the_analysis_imports_neither_torch_nor_the_reporters():
    known = modules()
    wrong = []
    for name, (path, is_package) in sorted(known.items()):
        if name != "colltrace.analysis" and not name.startswith("colltrace.analysis."):
            continue
        for line, target, written in imports(name, path, is_package, known):
            top = target.split(".")[0]
            if top in ("torch", "torchgen", "functorch") or target == "colltrace.reporters" \
                    or target.startswith("colltrace.reporters."):
                wrong.append(f"{os.path.relpath(path, ROOT)}:{line}: {written}")
    assert wrong == [], "the analyzer is pure (no torch) and says facts, not sentences:\n" + "\n".join(wrong)


def test_importing_the_analysis_loads_neither_torch_nor_the_reporters():
    env = {k: v for k, v in os.environ.items() if k != "COLLTRACE"}   # the start-up hook stays off
    code = ("import sys, colltrace.analysis\n"
            "print(sorted(m for m in sys.modules"
            " if m.split('.')[0] == 'torch' or m.startswith('colltrace.reporters')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import colltrace.analysis loaded {out.stdout.strip()}"
