"""AST mutations that make a scenario harder without changing what its oracle fixes.

Every primitive rewrites the buggy and the fixed version of the package the same way (the tests are never
touched, and no name the tests use changes), so the oracle patch (recomputed as fixed - buggy) still
fixes exactly the bug, the target test still fails before it, and everything else still passes. The
calibration re-runs the self-test on every mutated scenario anyway.

Primitives:
  rename_identifiers       functions, classes, parameters, locals and module constants the tests do not use
                           get neutral names (fn_a, v3, K2, ...)
  inline_helper            a one-expression helper (function or method) is inlined into its callers in the
                           same module (and removed when nothing else uses it): the bug moves into a
                           longer function, or is copied into every caller
  add_decoys               a look-alike copy of the buggy function (as it is before the fix) under a
                           confusable name, never called: editing it changes nothing
  misleading_docstrings    the entry function's docstring blames another function; the buggy function's
                           docstring says it is verified correct (again: the same sentences are replaced, never
                           stacked)
  misleading_symptom       the issue text gets the reporter's wrong guess at the cause (input order, rounding
                           where the result is numbers, parsing, caching); it names no identifier but the entry
                           point the issue already calls, and a later round replaces the paragraph an earlier one
                           added instead of adding a second
  extend_call_graph        the buggy function's body moves into a new module one call deeper; the original
                           keeps its signature and delegates
  wrap_in_class_hierarchy  the buggy function becomes a strategy class hierarchy (base, mixin, default and
                           a sibling) behind the original signature; a buggy method moves into a mixin base

Calibration schedules (strategy bundles A, B, C, applied in rounds A/B/C/A/B):
  semantic_logic_precision:   A rename_identifiers; B inline_helper + misleading_docstrings + misleading_symptom;
                              C add_decoys + misleading_docstrings
  deep_call_graph_traversal:  A extend_call_graph + rename_identifiers;
                              B add_decoys + misleading_docstrings + misleading_symptom;
                              C wrap_in_class_hierarchy + extend_call_graph

Deliberately misleading text (docstrings, the issue's guess) is always recorded in metadata.mutations, so a
reader of the scenario knows which statements are false on purpose.
"""
from __future__ import annotations

import ast
import builtins
import copy
import keyword
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from swebench.generators.common import shortcut_patch
from swebench.patches import make_patch
from swebench.scenario import Scenario

ROUND_ORDER = ("A", "B", "C", "A", "B")
SCHEDULES: dict[str, dict[str, tuple[str, ...]]] = {
    "semantic_logic_precision": {"A": ("rename_identifiers",),
                                 "B": ("inline_helper", "misleading_docstrings", "misleading_symptom"),
                                 "C": ("add_decoys", "misleading_docstrings")},
    "deep_call_graph_traversal": {"A": ("extend_call_graph", "rename_identifiers"),
                                  "B": ("add_decoys", "misleading_docstrings", "misleading_symptom"),
                                  "C": ("wrap_in_class_hierarchy", "extend_call_graph")},
}
_BUILTINS = frozenset(dir(builtins))
_DECOY_SUFFIXES = ("_legacy", "_v1", "_compat", "_fast", "_strict", "_old")
_MODULE_WORDS = ("kernels", "impl", "primitives", "backend", "internals", "engine", "core_ops")


class NotApplicable(Exception):
    """The primitive finds nothing to change in this scenario."""


# --------------------------------------------------------------------------------------------------
# The two versions of the package
# --------------------------------------------------------------------------------------------------
@dataclass
class Pair:
    """Buggy and fixed syntax trees of every non-test Python file; `touched` marks the rewritten ones."""

    buggy: dict[str, ast.Module]
    fixed: dict[str, ast.Module]
    protected: set[str]  # names the tests (or the entry point) rely on
    touched: set[str] = field(default_factory=set)
    problem: str = ""  # the issue text (primitives that rewrite it change this)
    issue_paragraphs: list[str] = field(default_factory=list)  # paragraphs earlier rounds added to the issue
    expected: str = ""  # the target call's expected value, as a Python literal ("" when unknown)

    def paths(self) -> list[str]:
        return sorted(self.buggy)

    def both(self, path: str) -> tuple[ast.Module, ast.Module]:
        return self.buggy[path], self.fixed[path]

    def add_module(self, path: str, buggy: ast.Module, fixed: ast.Module) -> None:
        self.buggy[path], self.fixed[path] = buggy, fixed
        self.touched.add(path)


def _names_in(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(part for part in (node.name.split(".")[-1], node.asname) if part)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _pair_of(scenario: Scenario) -> Pair:
    tests = set(scenario.all_test_files())
    fixed_files = scenario.fixed_files()
    sources = [p for p in scenario.files if p.endswith(".py") and p not in tests]
    protected: set[str] = set()
    for path in tests:
        protected |= _names_in(ast.parse(scenario.files[path]))
    entry = scenario.metadata.get("entry") or {}
    if entry.get("function"):
        protected.add(entry["function"])
    for path in sources:  # attributes and keyword names are never renamed: protect every one in use
        for tree in (ast.parse(scenario.files[path]), ast.parse(fixed_files[path])):
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute):
                    protected.add(node.attr)
                elif isinstance(node, ast.keyword) and node.arg:
                    protected.add(node.arg)
                elif isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            protected.add(item.name)
                        for target in _targets(item):
                            protected.add(target)
    return Pair({p: ast.parse(scenario.files[p]) for p in sources},
                {p: ast.parse(fixed_files[p]) for p in sources}, protected)


def _targets(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _functions(tree: ast.Module) -> dict[str, tuple[ast.FunctionDef, ast.AST]]:
    """{qualified name: (def, container)} for module-level functions and methods of module-level classes."""
    out: dict[str, tuple[ast.FunctionDef, ast.AST]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = (node, tree)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = (item, node)
    return out


def buggy_functions(pair: Pair) -> list[tuple[str, str]]:
    """(path, qualified name) of every function whose buggy and fixed versions differ."""
    found = []
    for path in pair.paths():
        buggy, fixed = (_functions(t) for t in pair.both(path))
        for name in sorted(set(buggy) & set(fixed)):
            if ast.dump(buggy[name][0]) != ast.dump(fixed[name][0]):
                found.append((path, name))
    return found


def _module_name(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def _set_docstring(function: ast.FunctionDef | ast.ClassDef, text: str) -> None:
    doc = ast.Expr(ast.Constant(text))
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
            body[0].value.value, str):
        body[0] = doc
    else:
        body.insert(0, doc)


def _docstring(function: ast.AST) -> str:
    return ast.get_docstring(function) or ""


def _all_names(pair: Pair) -> set[str]:
    names = set(pair.protected)
    for path in pair.paths():
        for tree in pair.both(path):
            names |= _names_in(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.arg):
                    names.add(node.arg)
    return names


def _fresh(base: str, taken: set[str]) -> str:
    name, index = base, 2
    while name in taken or keyword.iskeyword(name) or name in _BUILTINS:
        name, index = f"{base}{index}", index + 1
    taken.add(name)
    return name


# --------------------------------------------------------------------------------------------------
# Primitives: each rewrites both versions of the pair, or raises NotApplicable
# --------------------------------------------------------------------------------------------------
def rename_identifiers(pair: Pair, rng: random.Random) -> dict[str, Any]:
    candidates: set[str] = set()
    for path in pair.paths():
        for tree in pair.both(path):
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    candidates.add(node.name)
                elif isinstance(node, ast.arg):
                    candidates.add(node.arg)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    candidates.add(node.id)
    candidates = {n for n in candidates if n not in pair.protected and n not in _BUILTINS and not n.startswith("__")
                  and n not in ("self", "cls", "_")}
    if not candidates:
        raise NotApplicable("no identifier outside the tests' view")
    taken = _all_names(pair)
    order = sorted(candidates)
    rng.shuffle(order)
    mapping: dict[str, str] = {}
    counters: dict[str, int] = {}
    for name in order:
        kind = "K" if name.isupper() else "Kind" if name[:1].isupper() else "fn_" if _is_function(pair, name) else "v"
        counters[kind] = counters.get(kind, 0) + 1
        prefix = "_" if name.startswith("_") and kind == "fn_" else ""
        base = f"{prefix}{kind}{_letters(counters[kind])}" if kind == "fn_" else f"{kind}{counters[kind]}"
        mapping[name] = _fresh(base, taken)

    class Renamer(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            node.id = mapping.get(node.id, node.id)
            return node

        def visit_arg(self, node: ast.arg) -> ast.AST:
            node.arg = mapping.get(node.arg, node.arg)
            return node

        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
            node.name = mapping.get(node.name, node.name)
            self.generic_visit(node)
            return node

        def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
            node.name = mapping.get(node.name, node.name)
            self.generic_visit(node)
            return node

        def visit_alias(self, node: ast.alias) -> ast.AST:
            if "." not in node.name:
                node.name = mapping.get(node.name, node.name)
            if node.asname:
                node.asname = mapping.get(node.asname, node.asname)
            return node

    for path in pair.paths():
        for tree in pair.both(path):
            Renamer().visit(tree)
        pair.touched.add(path)
    return {"renamed": len(mapping)}


def _letters(number: int) -> str:
    out = ""
    while number:
        number, rest = divmod(number - 1, 26)
        out = chr(ord("a") + rest) + out
    return out


def _is_function(pair: Pair, name: str) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == name
               for path in pair.paths() for node in ast.walk(pair.buggy[path]))


def _single_expression(function: ast.FunctionDef) -> ast.expr | None:
    body = function.body[1:] if _docstring(function) else function.body
    args = function.args
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    if args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs or function.decorator_list:
        return None
    return body[0].value


def _pure(node: ast.expr) -> bool:
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _pure(node.value)
    if isinstance(node, ast.Subscript):
        return _pure(node.value) and isinstance(node.slice, ast.Constant)
    return False


def _binds(tree: ast.AST) -> set[str]:
    """Names bound inside lambdas and comprehensions of an expression."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda):
            names |= {a.arg for a in node.args.args}
        elif isinstance(node, ast.comprehension):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return names


def inline_helper(pair: Pair, rng: random.Random) -> dict[str, Any]:
    options = []
    for path in pair.paths():
        for qualified, (function, container) in _functions(pair.fixed[path]).items():
            if _single_expression(function) is None:
                continue
            buggy_fn = _functions(pair.buggy[path]).get(qualified)
            if buggy_fn is None or _single_expression(buggy_fn[0]) is None:
                continue
            options.append((path, qualified))
    rng.shuffle(options)
    for path, qualified in options:
        method = "." in qualified
        name = qualified.split(".")[-1]
        trial = [copy.deepcopy(tree) for tree in pair.both(path)]
        counts = [_inline_in(tree, qualified, method) for tree in trial]
        if not all(counts) or counts[0] != counts[1]:
            continue
        pair.buggy[path], pair.fixed[path] = trial
        removed = False
        if not method and name not in pair.protected and not any(
                _referenced(t, name) for p in pair.paths() for t in pair.both(p)):
            for tree in pair.both(path):
                tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == name)]
            removed = True
        pair.touched.add(path)
        return {"function": qualified, "call_sites": counts[0], "removed": removed}
    raise NotApplicable("no one-expression helper with plain call sites in its own module")


def _referenced(tree: ast.Module, name: str) -> bool:
    return any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(tree)) or any(
        isinstance(node, ast.alias) and node.name == name for node in ast.walk(tree))


def _inline_in(tree: ast.Module, qualified: str, method: bool) -> int:
    """Inline `qualified` at its call sites in `tree`; returns how many (0 when any site is unsuitable)."""
    function, container = _functions(tree)[qualified]
    expression = _single_expression(function)
    params = [a.arg for a in function.args.args]
    name = function.name
    scope = container if method else tree
    sites: list[ast.Call] = []
    for node in ast.walk(scope):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if method and isinstance(func, ast.Attribute) and func.attr == name and isinstance(func.value, ast.Name) \
                and func.value.id == "self":
            args = [func.value, *node.args]
        elif not method and isinstance(func, ast.Name) and func.id == name:
            args = list(node.args)
        else:
            continue
        if node.keywords or len(args) != len(params) or not all(_pure(a) for a in args):
            return 0
        if _binds(expression) & {n.id for a in args for n in ast.walk(a) if isinstance(n, ast.Name)}:
            return 0
        if any(node is inner for inner in ast.walk(function)):  # recursion
            return 0
        sites.append(node)
    if not sites:
        return 0
    replacements: dict[int, ast.expr] = {}
    for site in sites:
        func = site.func
        args = [func.value, *site.args] if method else list(site.args)
        substitution = dict(zip(params, args))

        class Substitute(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                if node.id in substitution and isinstance(node.ctx, ast.Load):
                    return copy.deepcopy(substitution[node.id])
                return node

        replacements[id(site)] = Substitute().visit(copy.deepcopy(expression))

    class Replace(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            self.generic_visit(node)
            return replacements.get(id(node), node)

    Replace().visit(scope)
    ast.fix_missing_locations(tree)
    return len(sites)


def add_decoys(pair: Pair, rng: random.Random) -> dict[str, Any]:
    targets = buggy_functions(pair)
    if not targets:
        raise NotApplicable("no function differs between the buggy and fixed versions")
    taken = _all_names(pair)
    added = []
    for path, qualified in targets[:2]:
        function = _functions(pair.buggy[path])[qualified][0]
        decoy_name = _fresh(function.name + rng.choice(_DECOY_SUFFIXES), taken)
        for tree in pair.both(path):
            decoy = copy.deepcopy(function)  # the buggy version in both: the fix never touches it
            decoy.name = decoy_name
            _, container = _functions(tree)[qualified]
            body = container.body
            index = next(i for i, node in enumerate(body) if isinstance(node, ast.FunctionDef)
                         and node.name == function.name)
            body.insert(index + 1, decoy)
        pair.touched.add(path)
        added.append(f"{qualified} -> {decoy_name}")
    return {"decoys": added}


def misleading_docstrings(pair: Pair, rng: random.Random, entry: str | None = None) -> dict[str, Any]:
    targets = buggy_functions(pair)
    if not targets:
        raise NotApplicable("no function differs between the buggy and fixed versions")
    bug_names = {q.split(".")[-1] for _, q in targets}
    others = sorted({q.split(".")[-1] for p in pair.paths() for q in _functions(pair.fixed[p])} - bug_names - {entry})
    blamed = rng.choice(others) if others else "the input parsing"
    changed = []
    for path, qualified in targets:
        for tree in pair.both(path):
            function = _functions(tree)[qualified][0]
            _set_docstring(function, _with_paragraph(_docstring(function), _VERIFIED, _VERIFIED))
        pair.touched.add(path)
        changed.append(qualified)
    if entry:
        for path in pair.paths():
            for qualified, (function, _) in _functions(pair.buggy[path]).items():
                if function.name != entry or (path, qualified) in targets:
                    continue
                for tree in pair.both(path):
                    target = _functions(tree)[qualified][0]
                    _set_docstring(target, _with_paragraph(
                        _docstring(target), _KNOWN_ISSUE, f"{_KNOWN_ISSUE}results can be off for some inputs; "
                        f"`{blamed}` is the usual cause and is being reworked."))
                pair.touched.add(path)
                changed.append(qualified)
    return {"docstrings": changed, "blames": blamed}


_VERIFIED = "Verified against the specification (see the tests); this logic is correct."
_KNOWN_ISSUE = "Known issue: "


def _with_paragraph(doc: str, marker: str, paragraph: str) -> str:
    """`doc` with `paragraph` as its last paragraph, replacing a paragraph that starts with `marker` (so a second
    application replaces the first instead of stacking)."""
    kept = [part for part in doc.split("\n\n") if part.strip() and not part.strip().startswith(marker)]
    return "\n\n".join([*kept, paragraph])


_ROUNDING = ("It looks like a rounding or display problem to me: the numbers are only a little off, and only for "
             "some inputs.")
_FRAMINGS = (
    "This started after our last dependency upgrade; before it, `{entry}` gave the right answer on the same input, "
    "so I suspect something changed in how the input is ordered.",
    _ROUNDING,
    "My guess is that the input is read wrongly somewhere before `{entry}` gets it; the calculation itself looks "
    "simple enough.",
    "Maybe something is cached between calls: the wrong answer shows up on the first call of `{entry}` in a fresh "
    "interpreter already, though.",
)


def _numbers(literal: str) -> bool:
    """Whether a Python literal is a number or holds only numbers (a guess about rounding fits only such a result)."""
    def only_numbers(value: Any) -> bool:
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple, set)):
            return bool(value) and all(only_numbers(item) for item in value)
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    try:
        return only_numbers(ast.literal_eval(literal))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def misleading_symptom(pair: Pair, rng: random.Random, entry: str | None = None) -> dict[str, Any]:
    """Add the reporter's wrong guess at the cause to the issue text (replacing one an earlier round added)."""
    if not pair.problem.strip():
        raise NotApplicable("no issue text")
    name = entry if entry and re.search(rf"(?<![A-Za-z0-9_]){re.escape(entry)}(?![A-Za-z0-9_])", pair.problem) \
        else None
    options = [f for f in _FRAMINGS if (name or "{entry}" not in f) and (f != _ROUNDING or _numbers(pair.expected))]
    paragraph = rng.choice(options).format(entry=name)
    kept = [part for part in pair.problem.strip().split("\n\n") if part.strip() not in pair.issue_paragraphs]
    pair.problem = "\n\n".join([*kept, paragraph]) + "\n"
    pair.issue_paragraphs.append(paragraph)
    return {"issue_paragraph": paragraph}


def _free_module_names(tree: ast.Module, function: ast.FunctionDef) -> tuple[list[str], list[ast.stmt]]:
    """(names the function uses that the module defines itself, the module's import statements)."""
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    imported = {a.asname or a.name.split(".")[0] for node in imports for a in node.names}
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        defined.update(_targets(node))
    used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted((used & defined) - imported), imports


def _movable(function: ast.FunctionDef) -> bool:
    args = function.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        return False
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
            return False
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and not node.attr.endswith("__"):
            return False
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom, ast.Await)):
            return False
    return True


def extend_call_graph(pair: Pair, rng: random.Random) -> dict[str, Any]:
    targets = [(p, q) for p, q in buggy_functions(pair)
               if _movable(_functions(pair.buggy[p])[q][0]) and _movable(_functions(pair.fixed[p])[q][0])]
    if not targets:
        raise NotApplicable("no buggy function that can move (super(), name mangling, *args or generators)")
    path, qualified = rng.choice(targets)
    package = path.split("/")[0]
    existing = {p.rsplit("/", 1)[-1][:-3] for p in pair.paths()}
    words = [w for w in _MODULE_WORDS if w not in existing and f"_{w}" not in existing]
    if not words:
        raise NotApplicable("no free module name")
    new_module = f"_{rng.choice(words)}"
    new_path = f"{package}/{new_module}.py"
    taken = _all_names(pair)
    impl_name = _fresh(f"_{qualified.replace('.', '_').lstrip('_')}_impl", taken)
    trees = {}
    for version in ("buggy", "fixed"):
        tree = getattr(pair, version)[path]
        function, container = _functions(tree)[qualified]
        names, imports = _free_module_names(tree, function)
        module = ast.Module(body=[ast.Expr(ast.Constant(f"Implementation details behind {_module_name(path)}."))],
                            type_ignores=[])
        module.body += [copy.deepcopy(node) for node in imports]
        if names:
            module.body.append(ast.ImportFrom(module=_module_name(path), names=[ast.alias(n) for n in names], level=0))
        impl = copy.deepcopy(function)
        impl.name = impl_name
        impl.decorator_list = []
        doc = _docstring(function)
        impl.body = impl.body[1:] if doc else impl.body
        if not impl.body:
            raise NotApplicable(f"{qualified} has only a docstring")
        module.body.append(impl)
        call = ast.Call(ast.Name(impl_name, ast.Load()), [ast.Name(a.arg, ast.Load()) for a in function.args.args], [])
        function.body = ([ast.Expr(ast.Constant(doc))] if doc else []) + [
            ast.ImportFrom(module=f"{package}.{new_module}", names=[ast.alias(impl_name)], level=0),
            ast.Return(call)]
        ast.fix_missing_locations(module)
        ast.fix_missing_locations(tree)
        trees[version] = module
    pair.touched.add(path)
    pair.add_module(new_path, trees["buggy"], trees["fixed"])
    return {"function": qualified, "moved_to": new_path, "as": impl_name}


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[_.]+", name) if part)


def wrap_in_class_hierarchy(pair: Pair, rng: random.Random) -> dict[str, Any]:
    targets = [(p, q) for p, q in buggy_functions(pair)
               if _movable(_functions(pair.buggy[p])[q][0]) and _movable(_functions(pair.fixed[p])[q][0])]
    if not targets:
        raise NotApplicable("no buggy function that can move")
    path, qualified = rng.choice(targets)
    taken = _all_names(pair)
    stem = _camel(qualified)
    if "." in qualified:  # a method: it moves into a mixin base class
        class_name, method = qualified.split(".")
        mixin = _fresh(f"_{stem}Rules", taken)
        for tree in pair.both(path):
            cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
            if cls.keywords:
                raise NotApplicable(f"{class_name} has class keywords")
            function = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
            cls.body = [n for n in cls.body if n is not function] or [ast.Pass()]
            holder = ast.ClassDef(name=mixin, bases=[], keywords=[], decorator_list=[],
                                  body=[ast.Expr(ast.Constant(f"Rules shared by {class_name} and its variants.")),
                                        function])
            cls.bases.insert(0, ast.Name(mixin, ast.Load()))
            tree.body.insert(tree.body.index(cls), holder)
            ast.fix_missing_locations(tree)
        pair.touched.add(path)
        return {"function": qualified, "mixin": mixin}
    base, mixin_name, default, sibling = (_fresh(f"_{stem}{suffix}", taken) for suffix in
                                          ("Base", "Mixin", "Default", "Strict"))
    instance = _fresh(f"_{stem.upper()}_STRATEGY", taken)
    for tree in pair.both(path):
        function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == qualified)
        params = [a.arg for a in function.args.args]
        if "self" in params:
            raise NotApplicable("a parameter is called self")
        doc = _docstring(function)
        body = function.body[1:] if doc else function.body
        arg_list = ", ".join(params)
        source = (f"class {base}:\n    \"\"\"How {qualified} is computed.\"\"\"\n\n"
                  f"    def compute(self, {arg_list}):\n        raise NotImplementedError\n\n\n"
                  f"class {mixin_name}({base}):\n\n    def __call__(self, {arg_list}):\n"
                  f"        return self.compute({arg_list})\n\n\n"
                  f"class {default}({mixin_name}):\n\n    def compute(self, {arg_list}):\n        pass\n\n\n"
                  f"class {sibling}({mixin_name}):\n    \"\"\"Like {default}, but refuses missing values.\"\"\"\n\n"
                  f"    def compute(self, {arg_list}):\n"
                  f"        if None in ({arg_list},):\n            raise ValueError('missing value')\n"
                  f"        return {default}().compute({arg_list})\n\n\n"
                  f"{instance} = {default}()\n")
        classes = ast.parse(source).body
        default_cls = classes[2]
        default_cls.body[0].body = copy.deepcopy(body)
        function.body = ([ast.Expr(ast.Constant(doc))] if doc else []) + [
            ast.Return(ast.Call(ast.Name(instance, ast.Load()), [ast.Name(p, ast.Load()) for p in params], []))]
        index = tree.body.index(function)
        tree.body[index:index] = classes
        ast.fix_missing_locations(tree)
    pair.touched.add(path)
    return {"function": qualified, "classes": [base, mixin_name, default, sibling]}


PRIMITIVES: dict[str, Callable[..., dict[str, Any]]] = {
    "rename_identifiers": rename_identifiers,
    "inline_helper": inline_helper,
    "add_decoys": add_decoys,
    "misleading_docstrings": misleading_docstrings,
    "misleading_symptom": misleading_symptom,
    "extend_call_graph": extend_call_graph,
    "wrap_in_class_hierarchy": wrap_in_class_hierarchy,
}


_TAKE_ENTRY = ("misleading_docstrings", "misleading_symptom")


# --------------------------------------------------------------------------------------------------
# Scenario-level API
# --------------------------------------------------------------------------------------------------
def apply_primitives(scenario: Scenario, names: tuple[str, ...], seed: str, label: str = "") -> Scenario:
    """`scenario` with the primitives `names` applied in order (those that do not apply are skipped and
    recorded); metadata.mutations gets one entry. Raises ValueError for an unknown primitive."""
    unknown = [n for n in names if n not in PRIMITIVES]
    if unknown:
        raise ValueError(f"unknown mutation(s) {unknown}; known: {', '.join(PRIMITIVES)}")
    rng = random.Random(f"{scenario.id}:{seed}")
    pair = _pair_of(scenario)
    pair.problem = scenario.problem_statement
    pair.issue_paragraphs = [applied["issue_paragraph"] for record in scenario.metadata.get("mutations", [])
                             if isinstance(record, dict) for applied in record.get("applied", [])
                             if isinstance(applied, dict) and isinstance(applied.get("issue_paragraph"), str)]
    pair.expected = str((scenario.metadata.get("shortcut") or {}).get("expected") or "")
    entry = (scenario.metadata.get("entry") or {}).get("function")
    applied, skipped = [], {}
    for name in names:
        try:
            details = PRIMITIVES[name](pair, rng, entry) if name in _TAKE_ENTRY else PRIMITIVES[name](pair, rng)
            applied.append({"name": name, **details})
        except NotApplicable as err:
            skipped[name] = str(err)
    buggy_files = dict(scenario.files)
    fixed_files = scenario.fixed_files()
    for path in sorted(pair.touched):
        buggy_files[path] = ast.unparse(pair.buggy[path]) + "\n"
        fixed_files[path] = ast.unparse(pair.fixed[path]) + "\n"
    metadata = copy.deepcopy(scenario.metadata)
    metadata.setdefault("mutations", []).append({"strategy": label or "+".join(names), "applied": applied,
                                                  "skipped": skipped})
    difficulty = metadata.setdefault("difficulty", {})
    if isinstance(difficulty, dict):
        difficulty["mutation_rounds"] = len(metadata["mutations"])
        difficulty["n_files"] = len(buggy_files)
    guard = metadata.get("shortcut")
    entry_meta = metadata.get("entry") or {}
    if guard and entry_meta.get("path") in buggy_files:
        patch = shortcut_patch(buggy_files, entry_meta["path"], entry_meta["function"], guard["args"],
                               guard["expected"])
        if patch:
            metadata["shortcut_patch"] = patch
        else:
            metadata.pop("shortcut_patch", None)
    data = scenario.to_dict()
    data.update(files=buggy_files, oracle_patch=make_patch(buggy_files, fixed_files), metadata=metadata,
                problem_statement=pair.problem)
    return Scenario.from_dict(data)


def mutate_round(scenario: Scenario, round_index: int) -> Scenario:
    """Calibration round `round_index` (0-4): strategy bundle A, B, C, A, B of the scenario's capability."""
    if not 0 <= round_index < len(ROUND_ORDER):
        raise ValueError(f"round_index must be within 0..{len(ROUND_ORDER) - 1}, got {round_index}")
    schedule = SCHEDULES.get(scenario.capability)
    if schedule is None:
        raise ValueError(f"no mutation schedule for capability {scenario.capability!r}; known: {sorted(SCHEDULES)}")
    letter = ROUND_ORDER[round_index]
    return apply_primitives(scenario, schedule[letter], seed=f"round{round_index}", label=letter)


def mutate_rounds(scenario: Scenario, rounds: int) -> Scenario:
    """Rounds 0 .. rounds-1 applied one after the other."""
    for index in range(rounds):
        scenario = mutate_round(scenario, index)
    return scenario
