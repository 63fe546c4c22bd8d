"""The static checker behind `colltrace lint`: collective patterns that hang distributed jobs.

Reads Python sources with the standard `ast` (no torch import) and reports, per call site:

- rank-branch: a collective under a rank-dependent `if` (`if rank == 0:`, `dist.get_rank() == ...`,
  `is_main_process`, `global_rank == 0`) that the other branch does not call too: the other ranks
  never join it.
- object-rank-branch: the same for an object collective (broadcast_object_list, gather_object ...).
- rank-exit: a `return` / `raise` / `break` / `continue` taken on some ranks only, before a collective
  that the ranks that went on call and the ranks that left do not.
- default-group: a collective with no explicit group in a file that makes subgroups or passes an
  explicit group elsewhere: ranks outside the subgroup on another path never join it.
- collective-in-except: a collective inside an `except` block: only the ranks that raised call it.
- group-rank-branch: group creation (`new_group`, `new_subgroups`, `split_group`, `init_device_mesh`,
  `DeviceMesh(...)`) under a rank-dependent `if`, a membership test included (`if rank in ranks:`),
  that the other branch does not make the same way: torch needs every rank of the job (of a split's
  parent group) to make every group, members or not, in the same order; it names a group by how many
  were made before it, so ranks that skip one wait for each other in the next. A
  `new_group(..., use_local_synchronization=True)` is its members' alone, and is not named.

Precision before recall: only calls through torch.distributed count, a branch that calls the same
collective on both sides is fine, a membership test (`if rank in ranks:`) with an explicit group is
the normal subgroup idiom. `# colltrace: ignore[rule]` (or a bare `# colltrace: ignore`) on the
call's line silences a finding.
"""
from __future__ import annotations

import ast
import functools
import os
import re
from dataclasses import asdict, dataclass

from colltrace import origins
from colltrace.callsites import scan

RULES = {
    "rank-branch": "collective under a rank-dependent branch: the ranks that skip it never join",
    "object-rank-branch": "object collective under a rank-dependent branch: the ranks that skip it never join",
    "rank-exit": "some ranks leave here, before a collective that the others then wait in",
    "default-group": "collective with no explicit group next to code that splits the ranks into subgroups: "
                     "ranks busy in another group never join",
    "collective-in-except": "collective in an except block: only the ranks that raised call it",
    "group-rank-branch": "group creation under a rank-dependent branch: every rank of the job must make every "
                         "group, members or not, in the same order (torch names groups by their count)",
}
_IGNORE = re.compile(r"#\s*colltrace:\s*ignore(?:\[([\w\-, ]+)\])?")
# names that say "this rank's number" or "am I the main process"
_RANK_NAME = re.compile(r"^(?:.*_)?rank$|^(?:.*_)?rank_?id$|^is_(?:global_|local_)?(?:main|master|rank_?zero|zero|"
                        r"global_zero|local_zero|main_process|local_main_process|last_process|first_rank|coordinator)"
                        r"(?:_process|_rank)?$|^(?:local_)?process_index$|^get_(?:global_|local_|group_)?rank$|"
                        r"^get_is_master$|^rank_zero_only$", re.I)


@dataclass
class Finding:
    file: str
    line: int
    rule: str
    why: str
    suppress: str

    def text(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}: {self.why} (silence: {self.suppress})"


def _names(node):
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr


def rank_test(test) -> bool:
    """Whether an `if` test depends on which rank runs it."""
    return any(_RANK_NAME.match(n) for n in _names(test))


def _membership(test) -> bool:
    return any(isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops)
               for n in ast.walk(test))


def _ops(sf, nodes) -> set:
    out = set()
    for stmt in nodes:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                op = scan.collective_op(sf, n)
                if op:
                    out.add(op)
    return out


def _exits(body) -> ast.stmt | None:
    """The exit statement (return/raise/break/continue) that a block always ends in, or None."""
    if not body:
        return None
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Break, ast.Continue)):
        return last
    return None


class _Checker:
    def __init__(self, sf: scan.SourceFile):
        self.sf = sf
        self.out: list[Finding] = []
        self.seen: set = set()
        self.sites = {id(s.node): s for s in sf.sites}

    def add(self, line: int, rule: str, why: str) -> None:
        if (line, rule) in self.seen:
            return
        text = self.sf.lines[line - 1] if 0 < line <= len(self.sf.lines) else ""
        m = _IGNORE.search(text)
        if m and (m.group(1) is None or rule in [r.strip() for r in m.group(1).split(",")]):
            return
        self.seen.add((line, rule))
        self.out.append(Finding(self.sf.path, line, rule, why, f"# colltrace: ignore[{rule}]"))

    def _ancestors(self, node):
        p = self.sf.parents.get(id(node))
        while p is not None:
            yield node, p
            node, p = p, self.sf.parents.get(id(p))

    def run(self) -> list[Finding]:
        for s in self.sf.sites:
            self._site(s)
        for node in ast.walk(self.sf.tree):
            if isinstance(node, ast.If) and rank_test(node.test):
                self._exit(node)
            elif isinstance(node, ast.Call):
                maker = scan.group_maker(self.sf, node)
                if maker is not None and not _local_sync(node):
                    self._maker(node, maker)
        self.out.sort(key=lambda f: (f.line, f.rule))
        return self.out

    def _site(self, s: scan.CallSite) -> None:
        call = s.node
        for child, parent in self._ancestors(call):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                break
            if isinstance(parent, ast.ExceptHandler):
                tryn = self.sf.parents.get(id(parent))
                if tryn is not None and _ops(self.sf, tryn.body):
                    break   # a fallback for a collective that failed: it fails the same on every rank
                self.add(s.line, "collective-in-except",
                         f"{s.op} runs only on the ranks that raised; the others never join it")
                break
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test and rank_test(parent.test):
                if _membership(parent.test) and s.group_kind == "explicit":
                    continue   # `if rank in ranks: dist.x(group=g)`: the subgroup idiom
                other = parent.orelse if child in _as_list(parent.body) else parent.body
                if s.op in _ops(self.sf, _as_list(other)):
                    continue   # both branches call it (root and non-root sides of a gather)
                if self._matched_after(parent, s.op):
                    continue
                cond = ast.unparse(parent.test)
                rule = "object-rank-branch" if s.op in scan.OBJECT_OPS else "rank-branch"
                self.add(s.line, rule, f"{s.op} runs only where `{_short(cond)}` holds; the other ranks never join it")
                break
        if s.group_kind == "default" and s.group == "default" and s.op in scan.GROUP_POS:
            why = self._subgroups_near(s)
            if why:
                self.add(s.line, "default-group", f"{s.op} on the default group, while {why}: every rank must call it")

    def _maker(self, call: ast.Call, maker: str) -> None:
        """Group creation under a rank-dependent branch (group-rank-branch)."""
        for child, parent in self._ancestors(call):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test and rank_test(parent.test):
                other = parent.orelse if child in _as_list(parent.body) else parent.body
                if _same_call(self.sf, call, _as_list(other)):
                    continue   # both sides make this very group (with other options)
                if self._matched_after(parent, None, call):
                    continue
                cond = _short(ast.unparse(parent.test))
                self.add(call.lineno, "group-rank-branch",
                         f"{maker} runs only where `{cond}` holds; every rank of the job must make every group, "
                         f"members or not, in the same order (torch names a group by how many came before it), "
                         f"so the ranks that skip it wait for the others in the next group they make")
                return

    def _subgroups_near(self, s) -> str:
        """Why ranks may be split over groups around this call ("" when nothing says so)."""
        if s.owner:
            for o in self.sf.sites:
                if o.owner == s.owner and o.group_kind == "explicit":
                    return f"{o.op} at line {o.line} uses group {_short(o.group, 40)}"
        if self.sf.makes_subgroups:
            return "this file makes subgroups"
        if _folder_makes_subgroups(os.path.dirname(os.path.abspath(self.sf.path))):
            return "this folder's code makes subgroups"
        for mod, level in self.sf.imports:
            for path in scan.resolve_import(self.sf.path, mod, level):
                if _origin(path) == origins.INTERNAL:
                    continue   # torch's own modules make subgroups for everyone's use
                if _file_makes_subgroups(os.path.abspath(path)):
                    return f"{os.path.basename(path)}, imported here, makes subgroups"
        return ""

    def _matched_after(self, ifnode, op, call=None) -> bool:
        """`if is_root: dist.gather(..., lst); return lst` then `dist.gather(...)` for the rest
        (call: a group creation, made the same way after the branch)."""
        branch_exit = _exits(_as_list(ifnode.body))
        if branch_exit is None:
            return False
        if call is not None:
            return _same_call(self.sf, call, self._following(ifnode))
        return op in _ops(self.sf, self._following(ifnode))

    def _following(self, node) -> list:
        """The statements after `node` in its block, and after its enclosing blocks up to the function."""
        out = []
        for child, parent in self._ancestors(node):
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module, ast.ClassDef)):
                out += _after(parent.body, child)
                break
            for name in ("body", "orelse", "finalbody"):
                block = getattr(parent, name, None)
                if isinstance(block, list) and child in block:
                    out += _after(block, child)
            if isinstance(parent, (ast.For, ast.While, ast.AsyncFor)):
                break   # break/continue leave the loop body only; `return` is handled per loop level
        return out

    def _exit(self, ifnode: ast.If) -> None:
        stmt = _exits(ifnode.body)
        if stmt is None or ifnode.orelse:
            return
        if isinstance(stmt, (ast.Break, ast.Continue)):
            rest = self._following(ifnode)
        else:
            rest = []
            for child, parent in self._ancestors(ifnode):
                for name in ("body", "orelse", "finalbody"):
                    block = getattr(parent, name, None)
                    if isinstance(block, list) and child in block:
                        rest += _after(block, child)
                if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module, ast.Lambda)):
                    break
        left = _ops(self.sf, ifnode.body)
        for n in (n for st in rest for n in ast.walk(st)):
            if isinstance(n, ast.Call) and id(n) in self.sites:
                s = self.sites[id(n)]
                if s.op in left:
                    continue
                if _membership(ifnode.test) and s.group_kind == "explicit":
                    continue
                word = type(stmt).__name__.lower()
                self.add(stmt.lineno, "rank-exit",
                         f"ranks where `{_short(ast.unparse(ifnode.test))}` holds {word} here; the others then wait "
                         f"in {s.op} at line {s.line}")
                return


def _local_sync(call: ast.Call) -> bool:
    """new_group(..., use_local_synchronization=True): made by its members alone."""
    return any(kw.arg == "use_local_synchronization" and not (isinstance(kw.value, ast.Constant) and not kw.value.value)
               for kw in call.keywords)


def _first_arg(call: ast.Call) -> str:
    """What a group creation asks for, as written: its ranks (first argument or ranks=...)."""
    for kw in call.keywords:
        if kw.arg in ("ranks", "mesh", "mesh_shape", "split_ranks", "group_size", "ranks_per_subgroup_list"):
            return ast.unparse(kw.value)
    return ast.unparse(call.args[0]) if call.args else ""


def _same_call(sf, call: ast.Call, nodes) -> bool:
    """Whether `nodes` make the group `call` makes: the same maker asked for the same ranks."""
    maker, asked = scan.group_maker(sf, call), _first_arg(call)
    for stmt in nodes:
        for n in ast.walk(stmt):
            if (isinstance(n, ast.Call) and n is not call and scan.group_maker(sf, n) == maker
                    and _first_arg(n) == asked):
                return True
    return False


_MAKES = re.compile(r"\b(?:new_group|new_subgroups|new_subgroups_by_enumeration|split_group)\s*\(")


@functools.lru_cache(maxsize=1)
def _local():
    return origins.for_roots(origins.local_roots())


def _origin(path: str) -> str:
    return _local().classify(os.path.abspath(path))[0]


@functools.lru_cache(maxsize=1024)
def _file_makes_subgroups(path: str) -> bool:
    """Whether a module carves rank subsets out of the world (scan.SourceFile.makes_subgroups)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            if _MAKES.search(f.read()) is None:
                return False   # the common case, without parsing
        return scan.parse(path).makes_subgroups
    except (OSError, SyntaxError, ValueError, RecursionError):
        return False


@functools.lru_cache(maxsize=256)
def _folder_makes_subgroups(folder: str) -> bool:
    """Whether a module next to this one makes subgroups."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    except OSError:
        return False
    return any(_file_makes_subgroups(os.path.join(folder, n)) for n in names)


def _as_list(x):
    return x if isinstance(x, list) else [x]


def _after(block, child) -> list:
    try:
        return block[block.index(child) + 1:]
    except ValueError:
        return []


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def check_file(path: str) -> list[Finding]:
    """Findings of one file; OSError / SyntaxError / ValueError propagate."""
    return _Checker(scan.parse(path)).run()


def python_files(paths) -> list[str]:
    """The .py files of the given files and folders (folders recursively, hidden ones skipped)."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
        else:
            out.append(p)
    return out


def as_dict(f: Finding) -> dict:
    return asdict(f)
