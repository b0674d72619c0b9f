"""Scenarios that test the capability (issue 26 point 4): the issue describes the symptom only, docstrings
agree with the code, a fix that masks the deep-call-graph bug above its root fails, the size knob reaches the
reference's 300-600 lines, issue-text mutations never stack, and calibration mutates what a model solves."""
from __future__ import annotations

import ast
import doctest
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from game_registry import render_tool_call
from swebench._inmemory import InMemoryPackages
from swebench.calibrate import CalibrationConfig, calibrate
from swebench.game import make_spec
from swebench.generators import generate_one
from swebench.generators.filler import MAX_LINES, source_lines
from swebench.generators.semantic_logic import TEMPLATES
from swebench.mutations import _pair_of, apply_primitives, buggy_functions, mutate_rounds
from swebench.patches import make_patch, replacements
from swebench.sandbox import SandboxConfig
from swebench.scenario import Scenario, load_scenarios, save_scenarios

DEEP, SEMANTIC = "deep_call_graph_traversal", "semantic_logic_precision"
SEEDS = range(50)
MIN_NAME = 3
SANDBOX = SandboxConfig(timeout_s=20)


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", re.IGNORECASE)


def reproduction(problem: str) -> ast.Module:
    blocks = re.findall(r"```python\n(.*?)```", problem, re.S)
    assert len(blocks) == 1, f"the issue needs exactly one python reproduction block:\n{problem}"
    return ast.parse(blocks[0])


def named_internals(scenario: Scenario) -> set[str]:
    """The identifiers of the scenario's package that its problem statement names.

    Defined in the package: every name bound in a non-test source file of the buggy version (function, method
    and class names; parameters; module, class and local assignment targets, loop and comprehension
    variables, dataclass fields; attributes assigned as `obj.name = ...`) and every module's file name.
    Allowed (the public entry points the issue needs): the names the reproduction block imports and the
    package / module path it imports them from; every function or method the block calls and the parameters
    of the package's definitions of those names (constructors: `__init__`'s parameters), i.e. the public
    signature the reporter uses; and the names the block assigns itself; a defined name spelled like an
    allowed one but for case (DAYS_IN_MONTH beside days_in_month) counts as that one. Names shorter than MIN_NAME (3)
    characters are ignored (`k`, `v`, `a`: English words). A name counts as named when it occurs as a whole
    word (letters, digits and `_` bound it), case-insensitively, anywhere in the statement, code included.
    """
    tests = set(scenario.all_test_files())
    sources = {p: ast.parse(t) for p, t in scenario.files.items() if p.endswith(".py") and p not in tests}
    defined: set[str] = set()
    params_of: dict[str, set[str]] = {}
    for path, tree in sources.items():
        stem = path.rsplit("/", 1)[-1][:-3]
        if stem != "__init__":
            defined.add(stem)
        defined.update(path.split("/")[:-1])
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
                args = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
                params_of.setdefault(node.name, set()).update(args)
            elif isinstance(node, ast.ClassDef):
                defined.add(node.name)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        params_of.setdefault(node.name, set()).update(a.arg for a in item.args.args)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
    block = reproduction(scenario.problem_statement)
    allowed: set[str] = set()
    for node in ast.walk(block):
        if isinstance(node, ast.ImportFrom):
            allowed.update((node.module or "").split("."))
            allowed.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name:
                allowed.add(name)
                allowed |= params_of.get(name, set())
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            allowed.add(node.id)
    allowed = {n.casefold() for n in allowed - {"self", "cls"}}
    forbidden = {n for n in defined if n.casefold() not in allowed and len(n) >= MIN_NAME}
    return {n for n in forbidden if _word(n).search(scenario.problem_statement)}


# The default suite keeps call depth 3 small; the rest of the deep grid runs with `-m slow`.
SLOW_GRID = {(3, "large"), (4, "small"), (4, "large"), (5, "small"), (5, "large")}


def scenario_grid() -> list:
    grid = [pytest.param(DEEP, {"call_depth": depth, "size": size},
                         marks=[pytest.mark.slow] if (depth, size) in SLOW_GRID else [])
            for depth in (3, 4, 5) for size in ("small", "large")]
    grid += [(SEMANTIC, {"size": size}) for size in ("small", "large")]
    return grid


# --------------------------------------------------------------------------------------------------
# 1. The issue describes the symptom, never the location
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("capability, options", scenario_grid(), ids=lambda v: str(v))
def test_issue_text_names_no_internal_identifier(capability, options):
    """50 seeds per setting: the problem statement names only the public entry points it calls."""
    bad = {}
    for seed in SEEDS:
        scenario = generate_one(capability, seed, **options)
        named = named_internals(scenario)
        if named:
            bad[scenario.id] = sorted(named)
        for path in scenario.source_files():
            if path.rsplit("/", 1)[-1] != "__init__.py":
                assert path not in scenario.problem_statement, (scenario.id, path)
    assert bad == {}


@pytest.mark.slow  # ~15 s: 10 seeds of each capability, mutated 5 rounds (make test stays under 5 minutes)
def test_issue_text_of_mutated_scenarios_names_no_internal_identifier():
    bad = {}
    for capability in (DEEP, SEMANTIC):
        for seed in range(10):
            scenario = mutate_rounds(generate_one(capability, seed), 5)
            if named_internals(scenario):
                bad[scenario.id] = sorted(named_internals(scenario))
    assert bad == {}


def test_the_identifier_check_sees_a_named_field():
    """The check itself: naming the buggy helper's fields (as the old deep_call_graph issue did) is caught."""
    scenario = generate_one(DEEP, 3)
    path, qualified = buggy_functions(_pair_of(scenario))[0]
    function = next(n for n in ast.walk(ast.parse(scenario.files[path])) if isinstance(n, ast.FunctionDef)
                    and n.name == qualified)
    fields = [a.arg for a in function.args.args]
    leaky = Scenario.from_dict({**scenario.to_dict(), "problem_statement": scenario.problem_statement +
                                f"\nThis is about the `{fields[0]}` and `{fields[1]}` fields.\n"})
    assert set(fields) <= named_internals(leaky)
    leaky = Scenario.from_dict({**scenario.to_dict(), "problem_statement": scenario.problem_statement +
                                f"\nThe bug is in {qualified}.\n"})
    assert qualified in named_internals(leaky)


# --------------------------------------------------------------------------------------------------
# 2. Docstrings agree with the code (unless a recorded mutation misleads on purpose)
# --------------------------------------------------------------------------------------------------
def run_doctests(files: dict[str, str], sources: list[str]) -> tuple[int, list[str]]:
    """(examples run, failures) of the doctests in `sources`, imported from `files` in this process (our own
    generated code)."""
    failures, attempted = [], 0
    with InMemoryPackages(files) as packages:
        for path in sources:
            module = packages.module(path[:-3].replace("/", ".").removesuffix(".__init__"))
            runner = doctest.DocTestRunner(verbose=False, optionflags=doctest.ELLIPSIS)
            for test in doctest.DocTestFinder(exclude_empty=True).find(module):
                result = runner.run(test, out=lambda _: None)
                attempted += result.attempted
                if result.failed:
                    failures.append(f"{path}: {test.name}")
    return attempted, failures


MISLEADING = ("Verified against the specification", "Known issue:")


@pytest.mark.parametrize("capability", [DEEP, SEMANTIC])
def test_docstrings_hold_for_the_shipped_code(capability):
    """Every doctest in the package passes on the buggy and on the fixed code (the helpers document themselves
    with inputs the bug does not touch); the oracle patch changes code, never a docstring; no unmutated
    scenario carries the misleading sentences of the mutations."""
    examples = 0
    for seed in range(12):
        scenario = generate_one(capability, seed)
        fixed = scenario.fixed_files()
        sources = [p for p in scenario.source_files() if p.endswith(".py")]
        for files in (scenario.files, fixed):
            attempted, failures = run_doctests(files, sources)
            assert failures == [], (scenario.id, failures)
            examples += attempted
        for path, qualified in buggy_functions(_pair_of(scenario)):
            docs = []
            for files in (scenario.files, fixed):
                tree = ast.parse(files[path])
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        for item in node.body:
                            if isinstance(item, ast.FunctionDef) and f"{node.name}.{item.name}" == qualified:
                                docs.append(ast.get_docstring(item))
                    elif isinstance(node, ast.FunctionDef) and node.name == qualified:
                        docs.append(ast.get_docstring(node))
            assert docs and docs[0] == docs[-1], (scenario.id, qualified)
        text = "\n".join(scenario.files[p] for p in sources)
        assert not any(sentence in text for sentence in MISLEADING), scenario.id
    if capability == DEEP:
        assert examples >= 12 * 2  # each helper and sibling carries one


def test_misleading_docstrings_are_recorded():
    scenario = mutate_rounds(generate_one(SEMANTIC, 4), 2)
    text = "\n".join(scenario.files[p] for p in scenario.source_files())
    applied = [a["name"] for m in scenario.metadata["mutations"] for a in m["applied"]]
    assert any(sentence in text for sentence in MISLEADING) and "misleading_docstrings" in applied


# --------------------------------------------------------------------------------------------------
# 3. deep_call_graph: a fix that masks the bug above its root does not score 1
# --------------------------------------------------------------------------------------------------
def masking_patch(scenario: Scenario, site: str) -> str:
    """A patch that leaves the buggy helper alone and makes `site` ("measure", or "hop": the first function
    between measure and the helper) compute the fixed formula itself: the aggregations come out right."""
    path, helper = buggy_functions(_pair_of(scenario))[0]
    fixed_tree = ast.parse(scenario.fixed_files()[path])
    fixed_def = next(n for n in fixed_tree.body if isinstance(n, ast.FunctionDef) and n.name == helper)
    fixed_def.name = "_corrected"
    params = [a.arg for a in fixed_def.args.args]
    pkg = path.split("/")[0]
    if site == "measure":
        target = f"{pkg}/measure.py"
    else:
        hops = [p for p in scenario.source_files() if p.rsplit("/", 1)[-1][:-3] in ("extract", "resolve", "adapters",
                                                                                      "fieldmap")]
        target = next(p for p in hops if f"import {helper}" in scenario.files[p])
    tree = ast.parse(scenario.files[target])
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    call = ast.parse(f"_corrected({', '.join(f'record.{p}' for p in params)})", mode="eval").body
    for node in ast.walk(function):  # the call of the next function down becomes the corrected formula
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id != "ValueError":
                setattr(node, name, call)
    tree.body.append(fixed_def)
    needs_math = "math." in ast.unparse(fixed_def)
    text = ("import math\n" if needs_math else "") + ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return make_patch(scenario.files, {**scenario.files, target: text})


def pytest_outcomes(files: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """{node id: passed|failed} of every test in `files` (our own generated code, run in a plain subprocess)."""
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    outcomes = {}
    for line in done.stdout.splitlines():
        match = re.match(r"(PASSED|FAILED|ERROR) (\S+)", line)
        if match:
            outcomes[match.group(2)] = match.group(1).lower()
    assert outcomes, done.stdout[-2000:] + done.stderr[-2000:]
    return outcomes


def score(scenario: Scenario, outcomes: dict[str, str]) -> float:
    """The game's reward rule: 1 when the target and every hidden test pass and no other test broke."""
    return float(all(v == "passed" for v in outcomes.values()) and scenario.target_test in outcomes)


@pytest.mark.parametrize("seed, depth, site", [(1, 3, "measure"), (2, 4, "measure"),
                                                pytest.param(3, 5, "measure", marks=pytest.mark.slow),
                                                (4, 4, "hop"), pytest.param(5, 5, "hop", marks=pytest.mark.slow),
                                                pytest.param(6, 3, "measure", marks=pytest.mark.slow)])
def test_a_fix_that_masks_the_bug_above_its_root_scores_below_one(tmp_path, seed, depth, site):
    scenario = generate_one(DEEP, seed, call_depth=depth, size="small")
    from swebench.patches import apply_patch

    masked = apply_patch(scenario.files, masking_patch(scenario, site))
    outcomes = pytest_outcomes(masked, tmp_path / "masked")
    assert outcomes[scenario.target_test] == "passed"  # the mask does fix the reported symptom
    hidden = {node: v for node, v in outcomes.items() if node.startswith(tuple(scenario.hidden_test_files()))}
    aggregations = {n: v for n, v in hidden.items() if "totals_by_" in n or "grand_total" in n}
    assert aggregations and set(aggregations.values()) == {"passed"}  # and the aggregations it feeds
    failing = sorted(n for n, v in hidden.items() if v == "failed")
    assert failing and all("describe_" in n or "_directly" in n for n in failing), failing
    assert score(scenario, outcomes) < 1.0
    fixed = pytest_outcomes(scenario.fixed_files(), tmp_path / "oracle")
    assert score(scenario, fixed) == 1.0


def test_no_semantic_template_names_an_internal_identifier():
    """Every template, 10 large seeds each (the 50-seed test above draws templates at random)."""
    bad = {(t.key, seed): sorted(named) for t in TEMPLATES for seed in range(10)
           if (named := named_internals(generate_one(SEMANTIC, seed, template=t.key, size="large")))}
    assert bad == {}


# --------------------------------------------------------------------------------------------------
# 4. The size knob: 300-600 source lines of realistic code, a small oracle, still self-testing
# --------------------------------------------------------------------------------------------------
def oracle_size(scenario: Scenario) -> int:
    return sum(1 for line in scenario.oracle_patch.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


@pytest.mark.parametrize("capability, options", [(DEEP, {"call_depth": d}) for d in (3, 4, 5)] +
                         [(SEMANTIC, {"template": t.key}) for t in TEMPLATES], ids=lambda v: str(v))
def test_large_scenarios_reach_the_reference_size_with_a_small_oracle(capability, options):
    for seed in range(8):
        large = generate_one(capability, seed, size="large", **options)
        small = generate_one(capability, seed, size="small", **options)
        lines = source_lines(large.files, set(large.all_test_files()))
        assert 300 <= lines <= MAX_LINES, (large.id, lines)
        assert large.metadata["difficulty"]["source_lines"] == lines
        assert source_lines(small.files, set(small.all_test_files())) < 300
        assert oracle_size(large) <= 6 and oracle_size(large) == oracle_size(small), large.id
        names = {n.name for p in large.source_files() for n in ast.walk(ast.parse(large.files[p]))
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not any(re.fullmatch(r"(fn_[a-z]+|v\d+|K\d+|Kind\d+)", n) for n in names)  # real names
        assert len(names) >= 20


@pytest.mark.slow  # ~3 s: the self-test CLI in a subprocess on eight large scenarios
def test_large_scenarios_pass_the_selftest_cli(tmp_path):
    scenarios = [generate_one(DEEP, s, size="large") for s in range(200, 204)]
    scenarios += [generate_one(SEMANTIC, s, size="large") for s in range(200, 204)]
    save_scenarios(tmp_path / "s.json", scenarios)
    done = subprocess.run([sys.executable, "-m", "swebench.selftest", str(tmp_path / "s.json"),
                           "--report", str(tmp_path / "r.json"), "--no-progress", "--timeout", "30"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(json.loads((tmp_path / "r.json").read_text())["kept"]) == len(scenarios)


# --------------------------------------------------------------------------------------------------
# 5. Mutations may rewrite the issue, and never stack text
# --------------------------------------------------------------------------------------------------
def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def docstrings(scenario: Scenario) -> list[str]:
    out = []
    for path in scenario.source_files():
        for node in ast.walk(ast.parse(scenario.files[path])):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and ast.get_docstring(node):
                out.append(ast.get_docstring(node))
    return out


@pytest.mark.parametrize("capability", [DEEP, SEMANTIC])
def test_issue_and_docstring_mutations_do_not_stack(capability):
    for seed in range(2):  # each seed plays 5 mutation rounds (~2 s)
        base = generate_one(capability, seed)
        once = apply_primitives(base, ("misleading_symptom", "misleading_docstrings"), "t")
        assert once.problem_statement != base.problem_statement
        added = [p for p in paragraphs(once.problem_statement) if p not in paragraphs(base.problem_statement)]
        assert len(added) == 1
        for again in (apply_primitives(once, ("misleading_symptom", "misleading_docstrings"), "t"),
                      apply_primitives(once, ("misleading_symptom", "misleading_docstrings"), "other seed"),
                      mutate_rounds(base, 5)):
            statement = paragraphs(again.problem_statement)
            assert len(statement) == len(set(statement)) == len(paragraphs(once.problem_statement))
            for doc in docstrings(again):
                for sentence in MISLEADING:
                    assert doc.count(sentence) <= 1, doc
        twice = apply_primitives(once, ("misleading_symptom", "misleading_docstrings"), "t")
        assert [doc.count(MISLEADING[0]) for doc in docstrings(twice)] == \
            [doc.count(MISLEADING[0]) for doc in docstrings(once)]
        record = once.metadata["mutations"][-1]["applied"]
        assert {a["name"] for a in record} == {"misleading_symptom", "misleading_docstrings"}
        assert record[0]["issue_paragraph"] in once.problem_statement


def test_a_rounding_guess_is_added_only_where_the_result_is_numbers():
    """The reporter's wrong guess must still be a guess a reporter could make: "the numbers are a little off"
    for a file name or a ranking would give the guess away as planted."""
    from swebench.mutations import _ROUNDING

    guesses: dict[bool, set[str]] = {True: set(), False: set()}
    for template in ("suffix_strip", "tiebreak_ranking", "tiered_tariff", "even_median"):
        for seed in range(12):
            base = generate_one(SEMANTIC, seed, template=template, size="small")
            numeric = template in ("tiered_tariff", "even_median")
            mutated = apply_primitives(base, ("misleading_symptom",), f"guess{seed}")
            guesses[numeric].add(mutated.metadata["mutations"][-1]["applied"][0]["issue_paragraph"])
    assert _ROUNDING in guesses[True] and _ROUNDING not in guesses[False]
    assert len(guesses[False]) >= 2  # the other guesses stay available


# --------------------------------------------------------------------------------------------------
# 6. Calibration: a model that solves a scenario sees it mutated, fails, and the mutated one is accepted
# --------------------------------------------------------------------------------------------------
class MemorizingAgent:
    """Plays the scenario game with the edit that fixed the *unmutated* scenario of the same seed (as a model
    that learned the original by heart would): view the file, replace the old text, submit. It solves the
    original; once a mutation rewrites the code, the remembered text is gone and it fails."""

    def __init__(self, capability: str):
        self.capability = capability
        self.rounds: list[list[float]] = []

    def edit(self, seed: int) -> tuple[str, str, str]:
        original = generate_one(self.capability, seed)
        fixed = original.fixed_files()
        path = next(p for p in original.source_files() if fixed[p] != original.files[p])
        old, new = replacements(original.files[path], fixed[path])[0]
        return path, old, new

    def __call__(self, scenarios_file: Path, count: int, round_index: int) -> list[float]:
        spec = make_spec(self.capability, interface="tools")  # it plays with tool calls
        scenarios = load_scenarios(scenarios_file)
        rates = []
        for index, scenario in enumerate(scenarios):
            game = spec.make(scenarios_path=str(scenarios_file))
            game.reset(index)
            path, old, new = self.edit(scenario.seed)
            for name, arguments in (("view_file", {"path": path}), ("replace_in_file", {"path": path, "old": old,
                                                                                         "new": new}),
                                    ("submit", {})):
                if game.done:
                    break
                game.step(spec.extract_action(render_tool_call(name, arguments)))
            rates.append(1.0 if game.get_summary()["success"] else 0.0)
        assert len(rates) == count
        self.rounds.append(rates)
        return rates


def test_calibration_mutates_what_the_model_solves_until_it_fails(tmp_path):
    config = CalibrationConfig(SEMANTIC, target=2, candidates=2, samples=1, rounds=2, sandbox=SANDBOX)
    agent = MemorizingAgent(SEMANTIC)
    state = calibrate(config, agent, tmp_path, log=lambda _: None)
    assert agent.rounds == [[1.0, 1.0], [0.0, 0.0]]  # solved as generated, failed once mutated (round A)
    accepted = {s["id"]: [m["strategy"] for m in s["metadata"]["mutations"]] for s in state["accepted"]}
    assert accepted == {f"{SEMANTIC}_0000": ["A"], f"{SEMANTIC}_0001": ["A"]}
    report = json.loads((tmp_path / "calibration.json").read_text())
    assert report["metrics"]["success_rate_per_round"] == {f"{SEMANTIC}_0000": [1.0, 0.0],
                                                            f"{SEMANTIC}_0001": [1.0, 0.0]}
    assert "mutate with A" in (tmp_path / "calibration_log.md").read_text()
