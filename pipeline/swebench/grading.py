"""Grade a candidate repository state of a scenario: SWE-bench's FAIL_TO_PASS / PASS_TO_PASS rule.

    grade = grade_files(scenario, files, GradeConfig())
    grade.reward, grade.success, grade.detail

The candidate's test files are ignored: the scenario's own visible and hidden tests are written over them,
so editing or deleting a test changes nothing. The reward is 1.0 when the target test and every hidden
test pass and every regression test (every other test that passes on the unpatched scenario) still
passes. When the target and the hidden tests pass but some regression tests broke, the reward is
`partial_credit` times the share of regression tests still passing (0 by default). Anything else, a run
that timed out or crashed included, is 0.

Before running anything, the candidate's Python files are screened against the originals (`screen_patch`,
on the syntax tree, so strings and comments never count): a candidate that adds an import outside a small
standard-library allow-list, or a use of process, file, network or interpreter internals (open, exec, sys,
os, pytest, builtins, __class__, frame attributes, ...) gets 0 without a run. The scenarios never need
them, and they are how a patch would tamper with the test run itself (the grader reads the results from
inside the sandbox, where the candidate's code runs).
"""
from __future__ import annotations

import ast
import hashlib
import json
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from pipeline.swebench.sandbox import SandboxConfig, TestRun, run_pytest
from pipeline.swebench.scenario import Scenario

ALLOWED_IMPORTS = frozenset({"math", "fractions", "decimal", "functools", "itertools", "collections", "dataclasses",
                             "typing", "re", "string", "statistics", "bisect", "heapq", "operator", "enum",
                             "datetime", "numbers", "copy"})
FORBIDDEN_NAMES = frozenset({"__import__", "importlib", "open", "exec", "eval", "compile", "globals", "locals", "vars",
                             "getattr", "setattr", "delattr", "breakpoint", "sys", "os", "subprocess", "socket",
                             "signal", "atexit", "pytest", "_pytest", "builtins", "__builtins__", "ctypes",
                             "threading", "multiprocessing", "inspect", "gc", "pathlib", "shutil", "tempfile", "io"})
FORBIDDEN_ATTRIBUTES = frozenset({"__class__", "__dict__", "__code__", "__globals__", "__subclasses__", "__mro__",
                                  "__bases__", "__builtins__", "__loader__", "__spec__", "f_globals", "f_locals",
                                  "f_back", "gi_frame", "tb_frame"})


@dataclass(frozen=True)
class GradeConfig:
    """How candidates are graded. partial_credit in [0, 1): weight of the share of regression tests still
    passing when the target and hidden tests pass but a regression test broke."""

    partial_credit: float = 0.0
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(timeout_s=20.0, cpu_s=20))
    cache_size: int = 512  # graded states remembered per process (keyed by scenario and file contents)

    def __post_init__(self) -> None:
        if isinstance(self.partial_credit, bool) or not isinstance(self.partial_credit, (int, float)) or not (
                0.0 <= self.partial_credit < 1.0):
            raise ValueError(f"GradeConfig.partial_credit must be a number in [0, 1), got {self.partial_credit!r}; "
                             "0 gives reward only for a full fix")
        if not isinstance(self.sandbox, SandboxConfig):
            raise ValueError("GradeConfig.sandbox must be a SandboxConfig")
        if isinstance(self.cache_size, bool) or not isinstance(self.cache_size, int) or self.cache_size < 0:
            raise ValueError(f"GradeConfig.cache_size must be an int >= 0, got {self.cache_size!r}")


@dataclass
class Grade:
    reward: float
    success: bool
    target: str = "missing"  # outcome of the target test
    hidden_passed: int = 0
    hidden_total: int = 0
    regression_passed: int = 0
    regression_total: int = 0
    detail: str = ""
    run_problem: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _suspicious(tree: ast.AST) -> Counter:
    """Counts of the names, attributes and imports a candidate may not add (see the module docstring)."""
    found: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found[f"name {node.id}"] += 1
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found[f"attribute {node.attr}"] += 1
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found[f"import {alias.name}"] += alias.name.split(".")[0] not in ALLOWED_IMPORTS
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found[f"import {node.module}"] += (node.module or "").split(".")[0] not in ALLOWED_IMPORTS
    return +found


def screen_patch(original: dict[str, str], candidate: dict[str, str]) -> str | None:
    """Why the candidate is refused without a run (it adds a forbidden import, name or attribute to a
    Python file, compared with the original), or None. Strings and comments are not code: never refused."""
    for path in sorted(candidate):
        if not path.endswith(".py") or candidate[path] == original.get(path):
            continue
        try:
            added = _suspicious(ast.parse(candidate[path])) - _suspicious(ast.parse(original.get(path, "")))
        except (SyntaxError, ValueError, RecursionError):  # it will not import: the test run shows that
            continue
        if added:
            what = sorted(added)[0]
            return (f"{path}: the patch adds {what} (scenario fixes need no process, file, network or interpreter "
                    f"internals; allowed imports: {', '.join(sorted(ALLOWED_IMPORTS))})")
    return None


def test_node_ids(path: str, source: str) -> list[str]:
    """pytest node ids of the plain test functions and Test* class methods of one test module."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            nodes.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            nodes += [f"{path}::{node.name}::{item.name}" for item in node.body
                      if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]
    return nodes


class Grader:
    """Grades candidates of one scenario; remembers results by content (graded states repeat a lot)."""

    _cache: "OrderedDict[str, Grade]" = OrderedDict()
    _runs: "OrderedDict[str, TestRun]" = OrderedDict()
    _lock = threading.Lock()

    def __init__(self, scenario: Scenario, config: GradeConfig | None = None) -> None:
        self.scenario = scenario
        self.config = config or GradeConfig()

    def _key(self, files: dict[str, str], what: str) -> str:
        digest = hashlib.sha256()
        rules = [self.scenario.target_test, self.scenario.test_files, self.scenario.hidden_test_files()]
        digest.update(json.dumps([what, self.scenario.id, rules, self.config.partial_credit, repr(self.config.sandbox),
                                  sorted(files.items())]).encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def _cached(self, key: str, compute) -> Grade:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        grade = compute()
        if self.config.cache_size:
            with self._lock:
                self._cache[key] = grade
                while len(self._cache) > self.config.cache_size:
                    self._cache.popitem(last=False)
        return grade

    def pristine(self, files: dict[str, str]) -> dict[str, str]:
        """`files` with the scenario's test files restored (visible and hidden) and nothing else added."""
        out = {path: text for path, text in files.items() if path in self.scenario.files}
        for path in self.scenario.all_test_files():
            out[path] = self.scenario.files[path]
        return out

    def run_visible(self, files: dict[str, str], selection: list[str] | None = None) -> TestRun:
        """The visible tests on `files` (hidden tests removed), for an agent's run_tests."""
        tree = self.pristine(files)
        for path in self.scenario.hidden_test_files():
            del tree[path]
        key = self._key({**tree, "\0selection": json.dumps(selection)}, "visible")
        with self._lock:
            if key in self._runs:
                self._runs.move_to_end(key)
                return self._runs[key]
        run = run_pytest(tree, self.config.sandbox, selection=selection)
        if self.config.cache_size and not run.timed_out:
            with self._lock:
                self._runs[key] = run
                while len(self._runs) > self.config.cache_size:
                    self._runs.popitem(last=False)
        return run

    def grade(self, files: dict[str, str]) -> Grade:
        """The grade of a candidate state (see the module docstring)."""
        tree = self.pristine(files)
        return self._cached(self._key(tree, "grade"), lambda: self._grade(tree))

    def _grade(self, tree: dict[str, str]) -> Grade:
        refused = screen_patch(self.scenario.files, tree)
        if refused:
            return Grade(0.0, False, detail=f"refused without running: {refused}")
        run = run_pytest(tree, self.config.sandbox)
        target = self.scenario.target_test
        hidden_prefix = tuple(f"{path}::" for path in self.scenario.hidden_test_files())
        hidden = sorted(node for node in run.outcomes if node.startswith(hidden_prefix))
        baseline = self.baseline_regressions()
        grade = Grade(0.0, False, target=run.outcome(target), hidden_total=max(len(hidden), 1),
                      hidden_passed=sum(run.passed(node) for node in hidden), regression_total=len(baseline),
                      regression_passed=sum(run.passed(node) for node in baseline), run_problem=run.problem)
        if run.problem:
            grade.detail = f"no test results: {run.problem}"
            return grade
        if not hidden and self.scenario.hidden_test_files():
            grade.detail = "the hidden tests did not run"
            return grade
        if grade.target != "passed":
            grade.detail = f"the target test {target} {grade.target}"
            return grade
        if grade.hidden_passed < len(hidden):
            grade.detail = f"{len(hidden) - grade.hidden_passed} of {len(hidden)} hidden tests fail"
            return grade
        if grade.regression_passed == grade.regression_total:
            grade.reward, grade.success = 1.0, True
            grade.detail = "the target and hidden tests pass and no regression test broke"
            return grade
        share = grade.regression_passed / max(grade.regression_total, 1)
        grade.reward = round(self.config.partial_credit * share, 6)
        grade.detail = (f"the target passes but {grade.regression_total - grade.regression_passed} regression "
                        f"test(s) broke (partial credit {grade.reward:g})")
        return grade

    def baseline_regressions(self) -> list[str]:
        """Node ids of the regression tests: every visible test but the target (the self-test guarantees they
        pass on the unpatched scenario)."""
        return [node for path in self.scenario.test_files for node in test_node_ids(path, self.scenario.files[path])
                if node != self.scenario.target_test]
