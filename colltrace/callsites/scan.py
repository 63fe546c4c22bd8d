"""The collective call sites of Python source files, read with the standard `ast` (no torch import).

Shared by `colltrace lint` (colltrace/callsites/lint.py) and by the "same kind elsewhere" list that a
hang finding gets (colltrace/callsites/samekind.py). A call site is a call of a torch.distributed
collective through a name the file bound to torch.distributed (`import torch.distributed as
dist`, `from torch import distributed`, `from torch.distributed import barrier`, or the plain
`torch.distributed.x`), with the group argument classified as:

- "default": no group argument, `group=None`, `dist.group.WORLD`, or a local name whose every
  assignment in the function is None;
- "maybe_default": an expression that may be None (`g if mesh else None`, a local assigned such
  an expression, a parameter that defaults to None);
- "explicit": anything else (its source text is kept, to match the same group elsewhere).
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from colltrace.model.parts import SameKindSite

# op -> index of the group parameter when passed positionally (torch.distributed's signatures)
GROUP_POS = {
    "all_reduce": 2, "all_reduce_coalesced": 2, "all_gather": 2, "all_gather_into_tensor": 2,
    "_all_gather_base": 2, "all_gather_object": 2, "all_gather_coalesced": 2,
    "broadcast": 2, "broadcast_object_list": 2, "reduce": 3, "gather": 3, "gather_object": 3,
    "scatter": 3, "scatter_object_list": 3, "reduce_scatter": 3, "reduce_scatter_tensor": 3,
    "_reduce_scatter_base": 3, "all_to_all": 2, "all_to_all_single": 4,
    "barrier": 0, "monitored_barrier": 0,
}
OBJECT_OPS = frozenset(("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list"))
GROUP_KWARGS = ("group", "process_group", "pg")
# calls that carve rank subsets out of the world explicitly (device meshes cover every rank in
# each dimension, and programs built on them run the same path everywhere: not counted)
SUBGROUP_MAKERS = frozenset(("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"))
# calls that make process groups, which every rank of the job (every member of a split's parent)
# must make, members or not, in the same order: torch names a group by how many were made before it
GROUP_MAKERS = SUBGROUP_MAKERS | {"init_device_mesh", "DeviceMesh"}
_MAKER_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d", "torch.distributed.device_mesh")


@dataclass
class CallSite:
    file: str
    line: int
    func: str            # qualified name of the enclosing function ("<module>" at top level)
    op: str
    group: str           # "default", or the group expression's source text
    group_kind: str      # "default" | "maybe_default" | "explicit"
    owner: str = ""      # the enclosing class, else the enclosing function ("" at module level)
    why_default: str = ""   # maybe_default: where the None may come from (`group = None if ... else ...`)
    node: ast.Call | None = field(repr=False, compare=False, default=None)

    def as_dict(self) -> SameKindSite:
        d: SameKindSite = {"file": self.file, "line": self.line, "func": self.func, "op": self.op, "group": self.group}
        if self.group_kind == "maybe_default":
            d["may_be_default"] = self.why_default or True
        return d


@dataclass
class SourceFile:
    path: str
    tree: ast.Module
    lines: list[str]
    dist_names: set            # names bound to the torch.distributed module
    direct_ops: dict           # local name -> op, for `from torch.distributed import barrier [as b]`
    torch_names: set           # names bound to the torch package
    imports: list              # (module name, level) of every import, in source order
    parents: dict = field(default_factory=dict)   # id(node) -> parent node
    sites: list = field(default_factory=list)
    makes_subgroups: bool = False  # calls new_group / new_subgroups / split_group
    makers: dict = field(default_factory=dict)   # local name -> group maker, `from torch.distributed import new_group`
    mesh_names: set = field(default_factory=set)   # names bound to torch.distributed.device_mesh


def parse(path: str) -> SourceFile:
    """Read and parse one file; OSError / SyntaxError / ValueError propagate to the caller."""
    with open(path, "rb") as f:
        src = f.read()
    tree = ast.parse(src, filename=path)
    text = src.decode("utf-8", errors="replace")
    sf = SourceFile(path, tree, text.splitlines(), set(), {}, set(), [])
    _bind_imports(sf)
    _index(sf)
    return sf


def _bind_imports(sf: SourceFile) -> None:
    for node in ast.walk(sf.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                sf.imports.append((a.name, 0))
                if a.name == "torch.distributed.device_mesh" and a.asname:
                    sf.mesh_names.add(a.asname)
                if a.name == "torch.distributed" and a.asname:
                    sf.dist_names.add(a.asname)
                elif a.name.split(".")[0] == "torch" and not a.asname:
                    sf.torch_names.add("torch")
                elif a.name == "torch" and a.asname:
                    sf.torch_names.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            sf.imports.append((mod, node.level))
            sf.imports.extend((f"{mod}.{a.name}" if mod else a.name, node.level) for a in node.names)
            if node.level:
                continue
            for a in node.names:
                if mod == "torch" and a.name == "distributed":
                    sf.dist_names.add(a.asname or a.name)
                elif mod in ("torch.distributed", "torch.distributed.distributed_c10d") and a.name in GROUP_POS:
                    sf.direct_ops[a.asname or a.name] = a.name
                if mod in _MAKER_MODULES and a.name in GROUP_MAKERS:
                    sf.makers[a.asname or a.name] = a.name
                elif mod == "torch.distributed" and a.name == "device_mesh":
                    sf.mesh_names.add(a.asname or a.name)


def _is_dist(sf: SourceFile, node) -> bool:
    """Whether `node` names the torch.distributed module in this file."""
    if isinstance(node, ast.Name):
        return node.id in sf.dist_names
    if isinstance(node, ast.Attribute) and node.attr == "distributed":
        return isinstance(node.value, ast.Name) and node.value.id in sf.torch_names
    return False


# The frameworks' own collectives, called on their usual objects (`accelerator.wait_for_everyone()`,
# `self.strategy.barrier()`, `fabric.all_reduce(x)`): every process of the job must call them.
FRAMEWORK_OWNERS = frozenset(("accelerator", "fabric", "strategy"))
FRAMEWORK_OPS = frozenset(("wait_for_everyone", "barrier", "broadcast", "all_gather", "all_reduce", "gather",
                           "reduce", "gather_for_metrics"))


def _framework_op(fn) -> str | None:
    if isinstance(fn, ast.Attribute) and fn.attr in FRAMEWORK_OPS:
        owner = fn.value
        name = owner.attr if isinstance(owner, ast.Attribute) else (owner.id if isinstance(owner, ast.Name) else None)
        if name in FRAMEWORK_OWNERS:
            return f"{name}.{fn.attr}"
    return None


def collective_op(sf: SourceFile, call: ast.Call) -> str | None:
    fn = call.func
    if isinstance(fn, ast.Attribute) and fn.attr in GROUP_POS and _is_dist(sf, fn.value):
        return fn.attr
    if isinstance(fn, ast.Name) and fn.id in sf.direct_ops:
        return sf.direct_ops[fn.id]
    return _framework_op(fn)


def group_maker(sf: SourceFile, call: ast.Call) -> str | None:
    """The torch.distributed call that makes process groups (GROUP_MAKERS), or None."""
    fn = call.func
    if isinstance(fn, ast.Name):
        return sf.makers.get(fn.id)
    if not isinstance(fn, ast.Attribute) or fn.attr not in GROUP_MAKERS:
        return None
    owner = fn.value
    if _is_dist(sf, owner) or (isinstance(owner, ast.Name) and owner.id in sf.mesh_names):
        return fn.attr
    if (isinstance(owner, ast.Attribute) and owner.attr in ("device_mesh", "distributed_c10d")
            and _is_dist(sf, owner.value)):
        return fn.attr   # dist.device_mesh.init_device_mesh, torch.distributed.distributed_c10d.new_group
    return None


def _is_none(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_world(sf: SourceFile, node) -> bool:
    # dist.group.WORLD, GroupMember.WORLD
    return isinstance(node, ast.Attribute) and node.attr == "WORLD"


def _const_truth(node):
    """True/False for a constant test (`True`, `not True`), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
        return bool(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        t = _const_truth(node.operand)
        return None if t is None else not t
    return None


def group_arg(op: str, call: ast.Call):
    """The group argument's node, or None when it is left to its default."""
    if op not in GROUP_POS:
        return None   # a framework's collective: on all of its processes
    for kw in call.keywords:
        if kw.arg in GROUP_KWARGS:
            return kw.value
    pos = GROUP_POS[op]
    if pos < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:pos + 1]):
        return call.args[pos]
    return None


class _Scope:
    """Assignments of plain names within one function, to see through `group = ...`."""

    def __init__(self, fn, module=None):
        self.assigned: dict[str, list] = {}
        self.params_none: set[str] = set()
        if fn is None:
            self._collect(module)
            return
        args = fn.args
        positional = args.posonlyargs + args.args
        for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=False):
            if _is_none(d):
                self.params_none.add(a.arg)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=False):
            if d is not None and _is_none(d):
                self.params_none.add(a.arg)
        self._collect(fn)

    def _collect(self, root) -> None:
        todo = list(ast.iter_child_nodes(root)) if root is not None else []
        while todo:   # this scope's own assignments: not those of the functions inside it
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            todo.extend(ast.iter_child_nodes(node))
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append(node.value)
            elif isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigned.setdefault(node.target.id, []).append(node.value)


def classify(sf: SourceFile, node, scope: _Scope, depth: int = 0) -> str:
    """'default' | 'maybe_default' | 'explicit' for a group expression (None: left to default)."""
    if node is None or _is_none(node) or _is_world(sf, node):
        return "default"
    if depth > 3:
        return "explicit"
    if isinstance(node, ast.IfExp):
        t = _const_truth(node.test)
        if t is not None:
            return classify(sf, node.body if t else node.orelse, scope, depth + 1)
        kinds = {classify(sf, node.body, scope, depth + 1), classify(sf, node.orelse, scope, depth + 1)}
        return "explicit" if kinds == {"explicit"} else ("default" if kinds == {"default"} else "maybe_default")
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return "explicit"   # `group or default_group`: never None
    if isinstance(node, ast.Name):
        values = scope.assigned.get(node.id)
        if values:
            kinds = {classify(sf, v, scope, depth + 1) for v in values}
            if node.id in scope.params_none:
                kinds.add("maybe_default")
            if kinds == {"default"}:
                return "default"
            return "explicit" if kinds == {"explicit"} else "maybe_default"
        if node.id in scope.params_none:
            return "maybe_default"
    return "explicit"


def _qualname(stack: list) -> str:
    names = [n.name for n in stack if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return ".".join(names) if names else "<module>"


def _index(sf: SourceFile) -> None:
    """Parents, call sites (with their enclosing function) and whether the file uses subgroups."""
    scopes: dict[int, _Scope] = {}

    def visit(node, stack):
        for child in ast.iter_child_nodes(node):
            sf.parents[id(child)] = node
            defines = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            inner = stack + [child] if defines else stack
            if isinstance(child, ast.Call):
                _call(child, stack)
            visit(child, inner)

    def _call(call, stack):
        fn = call.func
        name = fn.attr if isinstance(fn, ast.Attribute) else (fn.id if isinstance(fn, ast.Name) else None)
        if name in SUBGROUP_MAKERS and (name != "new_group" or call.args or any(
                kw.arg == "ranks" and not _is_none(kw.value) for kw in call.keywords)):
            sf.makes_subgroups = True   # new_group() without ranks (another backend) spans the world
        op = collective_op(sf, call)
        if op is None:
            return
        if op not in GROUP_POS and any(kw.arg in GROUP_KWARGS for kw in call.keywords):
            return   # a framework collective on a group of its own: not followed
        fdef = next((n for n in reversed(stack) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        scope = scopes.get(id(fdef))
        if scope is None:
            scope = scopes[id(fdef)] = _Scope(fdef, sf.tree)
        g = group_arg(op, call)
        kind = classify(sf, g, scope)
        text = "default" if kind == "default" and (g is None or not _is_world(sf, g)) else ast.unparse(g)
        why = ""
        if kind == "maybe_default" and isinstance(g, ast.Name):
            why = "; ".join(f"{g.id} = {ast.unparse(v)}" for v in scope.assigned.get(g.id, ()))
            if g.id in scope.params_none:
                why = "; ".join(x for x in (why, f"parameter {g.id}=None") if x)
        cls = next((n for n in reversed(stack) if isinstance(n, ast.ClassDef)), None)
        owner = cls.name if cls is not None else (fdef.name if fdef is not None else "")
        sf.sites.append(CallSite(sf.path, call.lineno, _qualname(stack), op, text, kind, owner, why, call))

    visit(sf.tree, [])
    sf.sites.sort(key=lambda s: s.line)


def group_key(expr: str) -> str:
    """The last name of a group expression (`self.ipc.train_group` -> `train_group`), to match
    one group written several ways."""
    tail = expr.rsplit(".", 1)[-1]
    return tail.split("(", 1)[0].strip()


def resolve_import(importer: str, module: str, level: int) -> list[str]:
    """The .py files an import in `importer` can name, looked up next to the importer and in
    the folders above it (a script run from its own folder, a package run from the repo root)."""
    parts = [p for p in module.split(".") if p]
    base = os.path.dirname(os.path.abspath(importer))
    if level:
        for _ in range(level - 1):
            base = os.path.dirname(base)
        roots = [base]
    else:
        roots, d = [], base
        for _ in range(4):
            roots.append(d)
            up = os.path.dirname(d)
            if up == d:
                break
            d = up
    out = []
    for root in roots:
        for n in range(len(parts), 0, -1):   # `from a.b import c`: a/b/c.py, a/b.py, a/b/__init__.py
            stem = os.path.join(root, *parts[:n])
            for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
                if os.path.isfile(cand):
                    out.append(cand)
                    break
            else:
                continue
            break
        if out:
            break
    return out
