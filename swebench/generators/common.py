"""What both scenario generators share: test cases, expected values by execution, rendering, checks.

A generator builds a `Draft`: the package twice (`buggy` and `fixed` source files, identical but for the
bug), and `Case`s, each a call of the public API. `finish(draft)` then
  - evaluates every case on both versions (in process: this is our own generated code),
  - checks that target and hidden cases change with the bug and regression cases do not,
  - writes the visible and hidden test files with the fixed version's results as literal expectations (a result
    must be that plain value, not an object that compares equal to it: `PLAIN_CHECK`),
  - builds the oracle patch (buggy -> fixed), a shortcut patch that hard-codes the visible expectation
    into the entry function (the hidden tests must catch it), and the problem statement,
and returns a `Scenario`. A draft whose checks fail raises `DraftRejected` (the generator draws again).
"""
from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from swebench._inmemory import InMemoryPackages
from swebench.patches import make_patch
from swebench.scenario import Scenario

Kind = Literal["target", "hidden", "regression"]


class DraftRejected(Exception):
    """A draft whose cases do not separate the buggy and the fixed code as required."""


@dataclass
class Case:
    """One test: `func(args...)` (on `receiver` when given), imported from the package."""

    name: str  # test function name, without the test_ prefix
    kind: Kind
    func: str
    args: list[str]  # Python source of each argument
    imports: dict[str, list[str]]  # module -> names the test imports
    receiver: str | None = None  # source of the object the method is called on

    @property
    def call(self) -> str:
        call = f"{self.func}({', '.join(self.args)})"
        return f"{self.receiver}.{call}" if self.receiver else call

    def import_lines(self) -> str:
        return "\n".join(f"from {module} import {', '.join(sorted(names))}" for module, names in
                         sorted(self.imports.items()))


@dataclass
class Outcome:
    ok: bool  # False: the call raised
    value: Any  # the value, or the exception's type name

    def text(self) -> str:
        return repr(self.value) if self.ok else f"raises {self.value}"


@dataclass
class Draft:
    capability: str
    seed: int
    package: str
    buggy: dict[str, str]  # source files, buggy version
    fixed: dict[str, str]  # same paths, fixed version
    cases: list[Case]
    test_path: str  # tests/test_<x>.py
    hidden_path: str  # tests/test_hidden_<x>.py
    entry: tuple[str, str]  # (module path, function or method name) the target case calls
    problem: Callable[["Draft", Case, Outcome, Outcome], str]  # (draft, target case, buggy, fixed) -> text
    difficulty: dict[str, Any] = field(default_factory=dict)
    test_docstring: str = ""


def literal(value: Any) -> str:
    """Python source of a plain value; ValueError for anything that would not read back equal."""
    text = repr(value)
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"expected value {text[:60]} is not a plain literal") from None
    if back != value or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"expected value {text[:60]} does not read back equal")
    return text


def evaluate(files: dict[str, str], cases: list[Case]) -> list[Outcome]:
    with InMemoryPackages(files) as packages:
        return [Outcome(*packages.evaluate(case.call, case.import_lines())) for case in cases]


# Every expected value is a plain literal (`literal`), so a result counts only when it is made of plain values of
# exactly those types: an object that merely compares equal to anything (its own `__eq__`, a subclass of `str`)
# does not pass a test by that. Each test module carries the check, since test modules are all the grader trusts.
PLAIN_CHECK = '''def plain(value):
    """`value` when it is made only of plain Python values (exact types); anything else fails the test."""
    kind = type(value)
    if kind in (list, tuple, set, frozenset):
        return kind(plain(item) for item in value)
    if kind is dict:
        return {plain(key): plain(item) for key, item in value.items()}
    if kind in (int, float, complex, str, bytes, bool, type(None)):
        return value
    raise AssertionError(f"not a plain value: {kind.__name__}")
'''


def _test_function(case: Case, expected: Outcome) -> str:
    return f"def test_{case.name}():\n    assert plain({case.call}) == {literal(expected.value)}\n"


def _test_module(docstring: str, cases: list[Case], outcomes: list[Outcome]) -> str:
    imports: dict[str, set[str]] = {}
    for case in cases:
        for module, names in case.imports.items():
            imports.setdefault(module, set()).update(names)
    lines = [f'"""{docstring}"""'] if docstring else []
    lines += [f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(imports.items())]
    body = "\n\n".join(_test_function(case, outcome) for case, outcome in zip(cases, outcomes))
    return "\n".join(lines) + "\n\n\n" + PLAIN_CHECK + "\n\n" + body


def shortcut_patch(files: dict[str, str], entry_path: str, entry: str, args: list[str], expected: str) -> str | None:
    """A patch that hard-codes `expected` for the call `entry(*args)`: `if (params) == (args): return expected`
    at the top of the function or method `entry` in `entry_path`. None when `entry` is not found there."""
    source = files[entry_path]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            params = [a.arg for a in node.args.args if a.arg not in ("self", "cls")][: len(args)]
            if len(params) != len(args):
                return None
            body = node.body
            has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
            first = body[1] if has_doc and len(body) > 1 else body[0]
            pad = " " * first.col_offset
            guard = (f"{pad}if ({', '.join(params)},) == ({', '.join(args)},):\n"
                     f"{pad}    return {expected}\n")
            lines = source.splitlines(keepends=True)
            lines.insert(first.lineno - 1, guard)
            return make_patch({entry_path: source}, {entry_path: "".join(lines)})
    return None


def finish(draft: Draft, extra_checks: Callable[[Draft, list[Outcome], list[Outcome]], None] | None = None) -> Scenario:
    """The scenario of a draft (see the module docstring); DraftRejected when the cases do not separate."""
    if set(draft.buggy) != set(draft.fixed):
        raise ValueError("buggy and fixed versions must hold the same files")
    buggy = evaluate(draft.buggy, draft.cases)
    fixed = evaluate(draft.fixed, draft.cases)
    for case, before, after in zip(draft.cases, buggy, fixed):
        if not after.ok:
            raise DraftRejected(f"case {case.name}: the fixed code raises {after.value}")
        changed = before.ok != after.ok or before.value != after.value or type(before.value) is not type(after.value)
        if case.kind == "regression" and changed:
            raise DraftRejected(f"regression case {case.name} changes with the bug ({before.text()} vs {after.text()})")
        if case.kind != "regression" and not changed:
            raise DraftRejected(f"{case.kind} case {case.name} does not see the bug")
        try:
            literal(after.value)
        except ValueError as err:
            raise DraftRejected(f"case {case.name}: {err}") from None
    if extra_checks is not None:
        extra_checks(draft, buggy, fixed)
    targets = [i for i, c in enumerate(draft.cases) if c.kind == "target"]
    if len(targets) != 1 or not any(c.kind == "hidden" for c in draft.cases):
        raise ValueError("a draft needs exactly one target case and at least one hidden case")
    target = targets[0]
    visible = [(c, o) for c, o in zip(draft.cases, fixed) if c.kind != "hidden"]
    hidden = [(c, o) for c, o in zip(draft.cases, fixed) if c.kind == "hidden"]
    files = dict(draft.buggy)
    files[draft.test_path] = _test_module(draft.test_docstring, [c for c, _ in visible], [o for _, o in visible])
    files[draft.hidden_path] = _test_module("Held-out checks of the same behaviour.", [c for c, _ in hidden],
                                            [o for _, o in hidden])
    fixed_files = {**files, **draft.fixed}
    case = draft.cases[target]
    metadata: dict[str, Any] = {"mutations": [], "difficulty": dict(draft.difficulty),
                                "hidden_test_files": [draft.hidden_path],
                                "entry": {"path": draft.entry[0], "function": draft.entry[1]},
                                "generator": draft.capability}
    entry_path = draft.entry[0]
    expected = literal(fixed[target].value)
    metadata["shortcut"] = {"args": list(case.args), "expected": expected}
    shortcut = shortcut_patch(files, entry_path, draft.entry[1], list(case.args), expected)
    if shortcut is not None:
        metadata["shortcut_patch"] = shortcut
    return Scenario(
        id=f"{draft.capability}_{draft.seed:04d}",
        capability=draft.capability,
        seed=draft.seed,
        files=files,
        test_files=[draft.test_path],
        target_test=f"{draft.test_path}::test_{case.name}",
        oracle_patch=make_patch(files, fixed_files),
        problem_statement=draft.problem(draft, case, buggy[target], fixed[target]),
        metadata=metadata,
    )


def generate_with_retries(build: Callable[[random.Random], Draft], seed: int, attempts: int = 50) -> Scenario:
    """Draw drafts from `random.Random(seed)` until one passes `finish`; deterministic per seed."""
    rng = random.Random(seed)
    reasons = []
    for _ in range(attempts):
        try:
            return finish(build(rng))
        except DraftRejected as err:
            reasons.append(str(err))
    raise RuntimeError(f"seed {seed}: no valid scenario in {attempts} draws; last reasons: {reasons[-3:]}")


def indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())
