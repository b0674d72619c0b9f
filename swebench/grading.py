"""Grade a candidate repository state of a scenario: SWE-bench's FAIL_TO_PASS / PASS_TO_PASS rule.

    grade = grade_files(scenario, files, GradeConfig())
    grade.reward, grade.success, grade.detail

The candidate's test files are ignored: the scenario's own visible and hidden tests are written over them,
so editing or deleting a test changes nothing. The reward is 1.0 when the target test and every hidden
test pass and every regression test (every other test that passes on the unpatched scenario) still
passes. When the target and the hidden tests pass but some regression tests broke, the reward is
`partial_credit` times the share of regression tests still passing (0 by default). Anything else, a run
that timed out or crashed included, is 0.

Threat model. The candidate (an agent's edit of the scenario's source files) is hostile: it wants reward
without fixing the bug, and its code runs inside the test process, with the tests, pytest and everything
else in that interpreter. Two layers stand between it and the reward:

1. The screen (`screen_patch`, before anything runs): a changed Python file is parsed from its bytes, the way
   the importer reads it (a coding cookie cannot hide code), and refused when it adds anything outside
   allow-lists: imports (`ALLOWED_MODULES`, plus the scenario's own packages; no star imports), the names used
   from each allowed module (`dataclasses.sys`, `typing.sys`, `enum.sys`, `operator.attrgetter`,
   `string.Formatter`, `typing.get_type_hints`, `functools.singledispatch` are not on them), a module object
   used as a value (so it cannot be aliased past the check), builtins (`SAFE_BUILTINS` and exception
   classes: no open, eval, exec, getattr, globals, vars, __import__, exit, ...), dunder attributes
   (`SAFE_DUNDER_ATTRIBUTES`: no __class__, __globals__, __self__, __dict__, __subclasses__, ...) and dunder
   names; a short deny-list covers frame, generator and traceback internals (f_globals, gi_frame, tb_frame).
   A patch may not add special methods beyond construction and text (`PLAIN_SPECIAL_METHODS`; no new __eq__,
   __hash__, __bool__, __contains__, __getattr__, ..., wherever defined) nor use `type` but as `type(x)` (three
   arguments, or `type` under another name, make a class at run time): how the package's values compare and
   test true is not something a fix changes. A file that does not parse is refused
   too. The screen is a first filter, not the guarantee.
2. The verdict channel (`swebench/sandbox.py`, `_sandbox_runner.py`): the reward never reads what
   the tested interpreter wrote. The target, the hidden and the regression tests are judged as groups, each by
   pytest in a fresh process forked from a sandbox runner that never imports the candidate, on a copy of the
   tree the tests cannot write. A group passes only when that process ran pytest to its end and said so on a
   private pipe, then echoed a nonce made after the fork and sent only then, with pytest's exit code 0 and
   every test's setup, call and teardown seen returning by the outermost hook wrapper, and then exited 0.
   The runner is non-dumpable (no ptrace or /proc/PID/mem by the same user) and sends the verdicts over a
   pipe inherited from the grader that no test process holds. So exiting early (os._exit(0), sys.exit,
   SystemExit, atexit, threads, signals), killing the runner, writing report, status or junit files,
   planting conftest.py or .pyc files for a later group, and rewriting pytest's reports (TestReport,
   pytest_runtest_makereport, the report plugin) all leave a group not "passed".

Trusted: the grader process, the sandbox runner and the pristine test files; the kernel's process and file
permission boundaries (namespace isolation, or fallback as root: the tests run as `nobody`). Not defended:
code that gets full control of its own interpreter (past the screen) can make its own process lie
convincingly, e.g. replace the test function's code or emulate the proof protocol (it can read the runner's
source) - nothing in one process can be trusted against that, which is what the screen is for. Objects that
compare equal to anything: the generators' tests accept only plain values of exact built-in types
(`generators/common.py` `PLAIN_CHECK`), and the screen refuses new comparison methods; a hand-written or
imported scenario whose own classes already define `__eq__` can have that method rewritten; in the
fallback sandbox without root the tests run as the grader's user and can write the verdict copy or signal
the grader. The agent's own test runs (`run_visible`, the run_tests tool) use the in-process per-test report:
the candidate can forge what the agent sees there, never the grade.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import json
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from common.validation import InputError
from swebench.sandbox import SandboxConfig, TestRun, VerdictGroup, run_pytest, run_verdicts
from swebench.scenario import Scenario


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# What scenario code may use from the standard library: module -> names (an allow-list; nothing private and
# nothing that reaches other modules, evaluates strings or fetches attributes by name).
ALLOWED_MODULES: dict[str, frozenset[str]] = {
    "math": _names("""acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist e erf
        erfc exp exp2 expm1 fabs factorial floor fmod frexp fsum gamma gcd hypot inf isclose isfinite isinf isnan
        isqrt lcm ldexp lgamma log log10 log1p log2 modf nan nextafter perm pi pow prod radians remainder sin sinh
        sqrt tan tanh tau trunc ulp"""),
    "fractions": _names("Fraction"),
    "decimal": _names("""Decimal Context DecimalException InvalidOperation DivisionByZero Inexact Rounded Overflow
        Underflow getcontext localcontext ROUND_05UP ROUND_CEILING ROUND_DOWN ROUND_FLOOR ROUND_HALF_DOWN
        ROUND_HALF_EVEN ROUND_HALF_UP ROUND_UP"""),
    "functools": _names("reduce partial lru_cache cache cached_property total_ordering cmp_to_key"),
    "itertools": _names("""accumulate chain combinations combinations_with_replacement compress count cycle
        dropwhile filterfalse groupby islice pairwise permutations product repeat starmap takewhile tee
        zip_longest"""),
    "collections": _names("Counter OrderedDict defaultdict deque namedtuple ChainMap UserDict UserList UserString"),
    "collections.abc": _names("""Callable Collection Container Generator Hashable ItemsView Iterable Iterator
        KeysView Mapping MappingView MutableMapping MutableSequence MutableSet Reversible Sequence Set Sized
        ValuesView"""),
    "dataclasses": _names("dataclass field fields asdict astuple replace is_dataclass FrozenInstanceError InitVar "
                          "KW_ONLY MISSING"),
    "typing": _names("""Any Optional Union List Dict Tuple Set FrozenSet Iterable Iterator Sequence Mapping
        MutableMapping MutableSequence Callable NamedTuple Literal ClassVar Final TypeVar Generic Protocol Type
        DefaultDict Counter Deque Hashable Sized Collection Container Generator AbstractSet Reversible overload
        cast TYPE_CHECKING NoReturn TypeAlias SupportsInt SupportsFloat SupportsIndex"""),
    "re": _names("""compile match search fullmatch findall finditer sub subn split escape IGNORECASE I MULTILINE M
        DOTALL S VERBOSE X ASCII A Pattern Match error"""),
    "string": _names("""ascii_letters ascii_lowercase ascii_uppercase digits hexdigits octdigits punctuation
        printable whitespace capwords Template"""),
    "statistics": _names("""mean fmean median median_low median_high median_grouped mode multimode geometric_mean
        harmonic_mean pstdev pvariance stdev variance quantiles NormalDist StatisticsError correlation
        covariance linear_regression"""),
    "bisect": _names("bisect bisect_left bisect_right insort insort_left insort_right"),
    "heapq": _names("heapify heappop heappush heappushpop heapreplace merge nlargest nsmallest"),
    "operator": _names("""abs add and_ concat contains countOf eq floordiv ge getitem gt index indexOf inv invert
        is_ is_not itemgetter le length_hint lshift lt matmul mod mul ne neg not_ or_ pos pow rshift sub truediv
        truth xor"""),
    "enum": _names("Enum IntEnum Flag IntFlag StrEnum auto unique"),
    "datetime": _names("date datetime time timedelta timezone MINYEAR MAXYEAR"),
    "numbers": _names("Number Complex Real Rational Integral"),
    "copy": _names("copy deepcopy"),
}
ALLOWED_IMPORTS = frozenset(ALLOWED_MODULES)
SAFE_BUILTINS = _names("""abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict dir divmod
    enumerate filter float format frozenset hash hasattr hex id int isinstance issubclass iter len list map max
    min next object oct ord pow print property range repr reversed round set slice sorted staticmethod str sum
    super tuple type zip None True False NotImplemented Ellipsis __name__ __doc__ __debug__ __all__""") | frozenset(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception))  # exception classes (not SystemExit & co.)
BUILTIN_NAMES = frozenset(dir(builtins))
SAFE_DUNDER_ATTRIBUTES = _names("""__init__ __post_init__ __name__ __qualname__ __doc__ __eq__ __ne__ __lt__ __le__
    __gt__ __ge__ __hash__ __repr__ __str__ __format__ __len__ __iter__ __next__ __contains__ __getitem__
    __setitem__ __delitem__ __add__ __sub__ __mul__ __truediv__ __floordiv__ __mod__ __neg__ __abs__ __bool__
    __round__ __enter__ __exit__""")
SAFE_DUNDER_STORES = _names("__all__ __slots__ __hash__ __match_args__ __doc__")
# Special methods a patch may add to a class: construction and text. Any other one it adds (comparison, hashing,
# truth, containers, arithmetic, attribute access) changes how its values answer the tests' asserts, which a fix of
# the logic never needs: an object whose __eq__ says yes to everything passed every `==` assert.
PLAIN_SPECIAL_METHODS = _names("__init__ __post_init__ __repr__ __str__")
FORBIDDEN_ATTRIBUTES = _names("""f_globals f_locals f_back f_builtins f_code f_trace gi_frame gi_code gi_yieldfrom
    cr_frame cr_code cr_await cr_origin ag_frame ag_code ag_await tb_frame tb_next""")


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


class _Screen:
    """The violations of one Python file (see the module docstring): a Counter of descriptions."""

    def __init__(self, path: str, local_files: frozenset[str], parse) -> None:
        self.path = path
        self.local_files = local_files  # every .py path of the tree
        self.local_roots = frozenset(p.split("/")[0].removesuffix(".py") for p in local_files
                                     if not p.startswith("tests/"))
        self.parse = parse  # path -> syntax tree of another local file (or None)
        self.found: Counter = Counter()

    # --- modules ---------------------------------------------------------------------------------
    def _local_module(self, dotted: str) -> str | None:
        """The file of local module `dotted`, or None when it is not one."""
        base = dotted.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self.local_files:
                return candidate
        return None

    def _module_kind(self, dotted: str) -> tuple[str, str] | None:
        if dotted in ALLOWED_MODULES:
            return ("std", dotted)
        if dotted.split(".")[0] in self.local_roots and self._local_module(dotted):
            return ("local", dotted)
        return None

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.path.removesuffix(".py").split("/")[:-1]
        if self.path.endswith("__init__.py"):
            parts = self.path.split("/")[:-1]
        parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
        return ".".join([*parts, *([node.module] if node.module else [])])

    def _binds_foreign_module(self, module: str, name: str) -> bool:
        """True when local module `module` binds `name` to a standard-library module object."""
        tree = self.parse(self._local_module(module) or "")
        if tree is None:
            return False
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if bound == name and alias.name.split(".")[0] not in self.local_roots:
                        return True
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module in ALLOWED_MODULES:
                if any((alias.asname or alias.name) == name and f"{node.module}.{alias.name}" in ALLOWED_MODULES
                       for alias in node.names):
                    return True
        return False

    def _imports(self, tree: ast.AST) -> dict[str, tuple[str, str]]:
        """Names bound to module objects -> ("std" | "local", dotted module); flags imports off the lists."""
        modules: dict[str, tuple[str, str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    kind = self._module_kind(alias.name)
                    if kind is None:
                        self.found[f"import {alias.name}"] += 1
                    elif alias.asname:
                        modules[alias.asname] = kind
                    else:
                        modules[alias.name.split(".")[0]] = self._module_kind(alias.name.split(".")[0]) or kind
            elif isinstance(node, ast.ImportFrom):
                module = self._absolute(node)
                kind = self._module_kind(module)
                if kind is None:
                    self.found[f"import {module or '.'}"] += 1
                    continue
                for alias in node.names:
                    bound = alias.asname or alias.name
                    sub = self._module_kind(f"{module}.{alias.name}")
                    if alias.name == "*":
                        self.found[f"import * from {module}"] += 1
                    elif sub is not None:
                        modules[bound] = sub
                    elif kind[0] == "std" and alias.name not in ALLOWED_MODULES[module]:
                        self.found[f"import {module}.{alias.name}"] += 1
                    elif kind[0] == "local" and self._binds_foreign_module(module, alias.name):
                        self.found[f"import {module}.{alias.name} (a module)"] += 1
        return modules

    def _resolve(self, node: ast.AST, modules: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
        """The module an expression names (`collections.abc`, an imported alias), or None."""
        if isinstance(node, ast.Name):
            return modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value, modules)
            if base is not None:
                return self._module_kind(f"{base[1]}.{node.attr}")
        return None

    # --- everything ------------------------------------------------------------------------------
    def _bound_names(self, tree: ast.AST) -> set[str]:
        bound: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                bound.add(node.id)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
        return bound

    def run(self, tree: ast.AST) -> Counter:
        modules = self._imports(tree)
        bound = self._bound_names(tree)
        attribute_values = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        # `type(x)` asks for a type; three arguments, or `type` passed on under another name, make a class
        type_of_one_value = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)
                             and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                base = self._resolve(node.value, modules)
                if base is not None and self._resolve(node, modules) is None:
                    if base[0] == "std" and node.attr not in ALLOWED_MODULES[base[1]]:
                        self.found[f"attribute {base[1]}.{node.attr}"] += 1
                    elif base[0] == "local" and (_dunder(node.attr) or self._binds_foreign_module(base[1], node.attr)):
                        self.found[f"attribute {base[1]}.{node.attr}"] += 1
                elif _dunder(node.attr) and node.attr not in SAFE_DUNDER_ATTRIBUTES:
                    self.found[f"attribute {node.attr}"] += 1
                elif node.attr in FORBIDDEN_ATTRIBUTES:
                    self.found[f"attribute {node.attr}"] += 1
                if id(node) not in attribute_values and self._resolve(node, modules) is not None:
                    self.found["a module used as a value"] += 1
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # wherever it is defined (a class body, under an `if`, at module level), never just in a class's body
                if _dunder(node.name) and node.name not in PLAIN_SPECIAL_METHODS:
                    self.found[f"special method {node.name}"] += 1
            elif isinstance(node, ast.Name):
                if node.id == "type" and id(node) not in type_of_one_value:
                    self.found["type() used other than on one value (a class made at run time)"] += 1
                if isinstance(node.ctx, ast.Load):
                    if node.id in modules:
                        if id(node) not in attribute_values:
                            self.found[f"module {node.id} used as a value"] += 1
                    elif node.id in SAFE_BUILTINS:
                        continue
                    elif _dunder(node.id) or node.id in BUILTIN_NAMES or node.id not in bound:
                        self.found[f"name {node.id}"] += 1
                elif _dunder(node.id) and node.id not in SAFE_DUNDER_STORES:
                    self.found[f"name {node.id} (assigned)"] += 1
        return +self.found


def _parse(text: str) -> ast.AST:
    """The syntax tree the importer will see: parsed from the UTF-8 bytes, so a coding cookie is honoured."""
    return ast.parse(text.encode("utf-8", "surrogatepass"))


def screen_patch(original: dict[str, str], candidate: dict[str, str]) -> str | None:
    """Why the candidate is refused without a run (a changed Python file adds something outside the allow-lists
    of the module docstring, or does not parse), or None. Strings and comments are not code: never refused."""
    local_files = frozenset(p for p in {*original, *candidate} if p.endswith(".py"))
    parsed: dict[str, ast.AST | None] = {}

    def parse(path: str) -> ast.AST | None:
        if path not in parsed:
            try:
                parsed[path] = _parse(candidate[path]) if path in candidate else None
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                parsed[path] = None
        return parsed[path]

    for path in sorted(candidate):
        if not path.endswith(".py") or candidate[path] == original.get(path):
            continue
        tree = parse(path)
        if tree is None:
            return f"{path}: the file does not parse as Python (or declares an encoding it is not in)"
        try:
            before = _Screen(path, local_files, parse).run(_parse(original.get(path, "")))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            before = Counter()
        added = _Screen(path, local_files, parse).run(tree) - before
        if added:
            what = sorted(added)[0]
            return (f"{path}: the patch adds {what} (scenario fixes need no process, file, network or interpreter "
                    f"internals; allowed imports: {', '.join(sorted(ALLOWED_MODULES))}, each with its public "
                    "names only)")
    return None


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
            raise InputError(f"GradeConfig.partial_credit must be a number in [0, 1), got {self.partial_credit!r}; "
                             "0 gives reward only for a full fix")
        if not isinstance(self.sandbox, SandboxConfig):
            raise InputError("GradeConfig.sandbox must be a SandboxConfig")
        if isinstance(self.cache_size, bool) or not isinstance(self.cache_size, int) or self.cache_size < 0:
            raise InputError(f"GradeConfig.cache_size must be an int >= 0, got {self.cache_size!r}")


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

    def verdict_groups(self, tree: dict[str, str]) -> list[VerdictGroup]:
        """The target, hidden and regression tests as verdict groups (hidden ones judged one by one on failure,
        regression ones too when partial credit needs the count)."""
        hidden = [node for path in self.scenario.hidden_test_files() for node in test_node_ids(path, tree[path])]
        groups = [VerdictGroup("target", (self.scenario.target_test,))]
        if hidden:
            groups.append(VerdictGroup("hidden", tuple(hidden), split=True))
        regression = self.baseline_regressions()
        if regression:
            groups.append(VerdictGroup("regression", tuple(regression), split=self.config.partial_credit > 0))
        return groups

    def _grade(self, tree: dict[str, str]) -> Grade:
        refused = screen_patch(self.scenario.files, tree)
        if refused:
            return Grade(0.0, False, detail=f"refused without running: {refused}")
        groups = self.verdict_groups(tree)
        by_name = {group.name: group for group in groups}
        run = run_verdicts(tree, groups, self.config.sandbox, stop_after_fail=True)

        def passed(name: str) -> int:  # tests of a group that passed (node by node when it was split)
            group = by_name.get(name)
            if group is None:
                return 0
            if run.verdict(name) == "passed":
                return len(group.nodes)
            return sum(run.verdict(node) == "passed" for node in group.nodes) if group.split else 0

        target_verdict = run.verdict("target")
        hidden_total = len(by_name["hidden"].nodes) if "hidden" in by_name else 0
        regression_total = len(self.baseline_regressions())
        grade = Grade(0.0, False, target="passed" if target_verdict == "passed" else
                      "timed out" if target_verdict == "timed out" else "failed",
                      hidden_total=hidden_total, hidden_passed=passed("hidden"),
                      regression_total=regression_total, regression_passed=passed("regression"),
                      run_problem=run.problem)
        if run.problem:
            grade.detail = f"no test results: {run.problem}"
            return grade
        if not hidden_total and self.scenario.hidden_test_files():
            grade.detail = "the hidden tests did not run"
            return grade
        if target_verdict != "passed":
            grade.detail = f"the target test {self.scenario.target_test} {grade.target} ({target_verdict})"
            return grade
        if hidden_total and run.verdict("hidden") != "passed":
            grade.hidden_passed = min(grade.hidden_passed, hidden_total - 1)
            grade.detail = f"{hidden_total - grade.hidden_passed} of {hidden_total} hidden tests fail"
            return grade
        if not regression_total or run.verdict("regression") == "passed":
            grade.reward, grade.success = 1.0, True
            passing = "the target and hidden tests pass" if hidden_total else "the target test passes (no hidden tests)"
            grade.detail = f"{passing} and no regression test broke"
            return grade
        grade.regression_passed = min(grade.regression_passed, regression_total - 1)
        share = grade.regression_passed / max(regression_total, 1)
        grade.reward = round(self.config.partial_credit * share, 6)
        grade.detail = (f"the target passes but {regression_total - grade.regression_passed} regression "
                        f"test(s) broke (partial credit {grade.reward:g})")
        return grade

    def baseline_regressions(self) -> list[str]:
        """Node ids of the regression tests: every visible test but the target (the self-test guarantees they
        pass on the unpatched scenario)."""
        return [node for path in self.scenario.test_files for node in test_node_ids(path, self.scenario.files[path])
                if node != self.scenario.target_test]
