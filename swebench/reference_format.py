"""Scenarios in the reference implementation's format, converted into ours (swebench/scenario.py).

The reference run (GitHub ScalingIntelligence/TRACE, swebench/qwen3.6_self_trace, phases 3 and 4) writes
`scenarios_parsed.json` as a JSON list of flat objects, one module and one test file each:

    {"name": "pid-autotuner-gain",                   # kebab-case id chosen by the synthesis model
     "module_filename": "mod.py",                    # the code under repair (written at the tree's root)
     "module_code": "...",
     "test_filename": "tests/test_mod.py",           # the one pytest file
     "test_code": "...",
     "target_test": "test_gain_schedule",            # a bare test name (pytest -v results keyed by it)
     "pr_description": "the symptom, no fix",
     "oracle_search": "...verbatim from module_code...",
     "oracle_replace": "...",                        # the fix: module_code.replace(search, replace, 1)
     "naive_fix_description": "the wrong fix a shallow solver tries",     # optional for its loader
     "hint_body": "names the buggy function, not the fix"}                # optional
    (its loader also reads an optional "domain" / "__domain")

Mapping into our format (`convert_reference`):

    files              {module_filename: module_code, test_filename: test_code}, plus an empty
                       `<test folder>/__init__.py` when the test file sits in a folder (the reference wrote
                       one before every pytest run)
    test_files         [test_filename]
    target_test        "<test_filename>::<name>", or "<test_filename>::<Class>::<name>" when the name is a
                       method of a Test* class; the name must match exactly one collected test
    oracle_patch       the unified diff of module_code -> module_code with oracle_search replaced by
                       oracle_replace; oracle_search must occur exactly once (the reference replaced the
                       first occurrence and never checked for a second)
    problem_statement  pr_description
    id                 "<name as [A-Za-z0-9_.-]>-<8 hex digits>", the digits the start of a SHA-256 of every
                       required field but pr_description (stable across runs and file order, distinct across
                       revisions that keep the name; rewording the issue keeps the id)
    seed               those 8 hex digits as an integer (the reference has no generator seed)
    capability         --capability, or the name of the file's folder when it is one of CAPABILITIES or sits in a
                       `swebench/` folder (`pipeline/swebench/<capability>/scenarios_parsed.json`)
    metadata           {"mutations": [], "difficulty": {}, "hidden_test_files": [],
                        "naive_fix_description": ..., "hint_body": ...,        (when given)
                        "reference": {"name", "target_test" (as written), "domain" (when given),
                                      "extra": {any other key}}}

What the reference lacks that ours requires, and the defaults chosen:
  - hidden tests: none. Every test but the target is a regression test, so a patch that hard-codes the
    visible target is not caught (metadata.hidden_test_files = [], no shortcut_patch). Add a hidden test
    file by hand to close that gap.
  - regression tests that fail before the fix: the reference tolerated tests other than the target failing
    on the unpatched code (it only kept the pre-passing ones as regressions); our self-test and grader treat
    every visible test but the target as a regression test that must pass before, so such scenarios are
    dropped by `python -m swebench.selftest` ("regression_not_passing_before"). Its minimum number
    of regression tests (--min-regression, 3) differs from the reference's (5 in phase 4, none in phase 3).
  - seed, capability, difficulty and mutations: see above; difficulty is {} and mutations [] (the
    reference's mutation rounds rewrote the scenario in place and left no record in it).
A converted scenario is validated like a native one: the Scenario constructor checks the format and that
the oracle applies, and the self-test proves it under pytest (the target fails before, everything passes
after).
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from swebench.patches import PatchError, make_patch
from swebench.scenario_model import (CAPABILITIES, Scenario, ScenarioError, _CAPABILITY, _is_test_path,
                                     check_relative_path)

REFERENCE_REQUIRED = ("name", "module_filename", "module_code", "test_filename", "test_code", "target_test",
                      "pr_description", "oracle_search", "oracle_replace")
REFERENCE_OPTIONAL = ("naive_fix_description", "hint_body", "domain", "__domain")
_MARKERS = ("module_code", "oracle_search", "oracle_replace", "test_code")  # keys only the reference writes
_NOT_ID = re.compile(r"[^A-Za-z0-9_.\-]+")
_noted: set[str] = set()


def looks_like_reference(item: Any) -> bool:
    """True for an object with reference-only keys and none of ours (`files`, `oracle_patch`)."""
    return (isinstance(item, dict) and any(key in item for key in _MARKERS)
            and "files" not in item and "oracle_patch" not in item)


def is_reference_format(data: Any) -> bool:
    """True when `data` (a parsed scenarios file) is a non-empty list of reference-format objects only."""
    return isinstance(data, list) and bool(data) and all(looks_like_reference(item) for item in data)


def infer_capability(path: str | Path) -> str | None:
    """The capability a reference file's location names (`.../swebench/<capability>/FILE` or a folder named
    like one of CAPABILITIES), else None."""
    folder = Path(path).resolve().parent
    if folder.name in CAPABILITIES or (folder.parent.name == "swebench" and _CAPABILITY.fullmatch(folder.name)):
        return folder.name
    return None


def _stable_digest(item: dict[str, Any]) -> str:
    defining = {key: item[key] for key in REFERENCE_REQUIRED if key != "pr_description"}
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode("utf-8")).hexdigest()[:8]


def _collected_tests(test_code: str) -> list[str]:
    """What pytest collects from one module, relative to it: test* functions and test* methods of Test*
    classes ("name" or "Class::name")."""
    tree = ast.parse(test_code)
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names += [f"{node.name}::{item.name}" for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test")]
    return names


def _fail(where: str, field: str, problem: str, fix: str) -> ScenarioError:
    return ScenarioError(f"{where}: reference field {field!r} {problem}; fix: {fix}")


def _target_node(item: dict[str, Any], where: str) -> str:
    """The pytest node id of the reference's `target_test` (see the module docstring)."""
    path, target = item["test_filename"], item["target_test"].strip()
    try:
        collected = _collected_tests(item["test_code"])
    except (SyntaxError, ValueError) as err:
        raise _fail(where, "test_code", f"is not valid Python ({err})", "fix the test module") from None
    if "[" in target:
        raise _fail(where, "target_test", f"names a parametrized case {target!r}; our target is a whole test "
                    "function", "move that case into its own test function and name it")
    relative = target[len(path) + 2:] if target.startswith(f"{path}::") else target
    if "::" in relative:
        matches = [name for name in collected if name == relative]
    else:
        matches = [name for name in collected if name.split("::")[-1] == relative]
    if not matches:
        raise _fail(where, "target_test", f"names {target!r}, which is no test in {path} (tests there: "
                    f"{collected[:8]}{' ...' if len(collected) > 8 else ''})", "name a test function of test_code")
    if len(matches) > 1:
        raise _fail(where, "target_test", f"names {target!r}, which matches {matches}",
                    "give it as 'Class::name' to pick one")
    return f"{path}::{matches[0]}"


def _check_fields(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ScenarioError(f"{where}: must be a JSON object, got {type(item).__name__}")
    missing = [key for key in REFERENCE_REQUIRED if key not in item]
    if missing:
        raise ScenarioError(f"{where}: missing reference field(s) {missing}; a reference-format scenario needs "
                            f"{', '.join(REFERENCE_REQUIRED)} (optional: {', '.join(REFERENCE_OPTIONAL)})")
    for key in (*REFERENCE_REQUIRED, *REFERENCE_OPTIONAL):
        if key in item and not isinstance(item[key], str):
            raise _fail(where, key, f"must be a string, got {type(item[key]).__name__}", "give text")
    for key in ("name", "module_filename", "module_code", "test_filename", "test_code", "target_test",
                "pr_description", "oracle_search"):
        if not item[key].strip():
            raise _fail(where, key, "is empty", "fill it in (only oracle_replace may be empty)")
    for key in ("module_filename", "test_filename"):
        problem = check_relative_path(item[key])
        if problem:
            raise _fail(where, key, f"path {problem}", "e.g. \"mod.py\" / \"tests/test_mod.py\"")
    if not item["module_filename"].endswith(".py") or _is_test_path(item["module_filename"]):
        raise _fail(where, "module_filename", f"is {item['module_filename']!r}, not a non-test Python module",
                    "e.g. \"mod.py\"")
    if not _is_test_path(item["test_filename"]):
        raise _fail(where, "test_filename", f"is {item['test_filename']!r}, which pytest would not collect",
                    "name it test_*.py, e.g. \"tests/test_mod.py\"")


def from_reference(item: Any, capability: str, where: str = "reference scenario") -> Scenario:
    """One reference-format object as a Scenario (see the module docstring); ScenarioError names `where`, the
    reference scenario's name and the field."""
    _check_fields(item, where)
    where = f"{where} ({item['name']!r})"
    module, code = item["module_filename"], item["module_code"]
    search, replace = item["oracle_search"], item["oracle_replace"]
    count = code.count(search)
    if count != 1:
        raise _fail(where, "oracle_search", f"occurs {count} times in module_code {module}, not exactly once",
                    "copy the buggy lines verbatim from module_code, with enough context to be unique")
    fixed_code = code.replace(search, replace, 1)
    if fixed_code == code:
        raise _fail(where, "oracle_replace", "equals oracle_search, so the oracle changes nothing",
                    "give the fixed lines")
    files = {module: code, item["test_filename"]: item["test_code"]}
    if len(files) < 2:
        raise _fail(where, "test_filename", f"is the module {module!r} itself", "keep the tests in their own file")
    folder = str(PurePosixPath(item["test_filename"]).parent)
    if folder != "." and f"{folder}/__init__.py" not in files:
        files[f"{folder}/__init__.py"] = ""
    try:
        patch = make_patch(files, {**files, module: fixed_code})
    except PatchError as err:
        raise _fail(where, "oracle_search", f"gives no usable patch ({err})", "check oracle_search") from None
    digest = _stable_digest(item)
    slug = _NOT_ID.sub("-", item["name"]).strip("-_.")[:60] or "scenario"
    reference: dict[str, Any] = {"name": item["name"], "target_test": item["target_test"]}
    domain = item.get("domain", item.get("__domain"))
    if domain is not None:
        reference["domain"] = domain
    extra = {key: value for key, value in item.items() if key not in (*REFERENCE_REQUIRED, *REFERENCE_OPTIONAL)}
    if extra:
        reference["extra"] = extra
    metadata: dict[str, Any] = {"mutations": [], "difficulty": {}, "hidden_test_files": []}
    for key in ("naive_fix_description", "hint_body"):
        if item.get(key, "").strip():
            metadata[key] = item[key]
    metadata["reference"] = reference
    try:
        return Scenario(id=f"{slug}-{digest}", capability=capability, seed=int(digest, 16), files=files,
                        test_files=[item["test_filename"]], target_test=_target_node(item, where),
                        oracle_patch=patch, problem_statement=item["pr_description"], metadata=metadata)
    except ScenarioError as err:
        raise ScenarioError(f"{where}: {err}") from None


def convert_reference(data: Any, capability: str, where: str = "reference file") -> list[Scenario]:
    """Every object of a reference-format list as a Scenario; ids must come out unique (identical scenarios
    twice in one file are refused)."""
    if not isinstance(capability, str) or not _CAPABILITY.fullmatch(capability):
        raise ScenarioError(f"{where}: capability must be a snake_case name, got {capability!r}; fix: pass one "
                            f"of {', '.join(CAPABILITIES)} (or a new capability's name)")
    if not isinstance(data, list) or not data:
        raise ScenarioError(f"{where}: must hold a non-empty JSON list of reference scenarios, got "
                            f"{type(data).__name__ if not isinstance(data, list) else 'an empty list'}")
    scenarios = [from_reference(item, capability, f"{where}: scenario {index}") for index, item in enumerate(data)]
    seen: dict[str, int] = {}
    for index, scenario in enumerate(scenarios):
        if scenario.id in seen:
            raise ScenarioError(f"{where}: scenario {index} is the same scenario as scenario {seen[scenario.id]} "
                                f"(id {scenario.id!r}); drop one")
        seen[scenario.id] = index
    return scenarios


def load_reference(path: str | Path, data: Any, capability: str | None = None, note: bool = True) -> list[Scenario]:
    """`data` (parsed from `path`, a reference-format file) converted; the capability comes from `capability`
    or the file's folder (`infer_capability`). With `note`, says once per file on stderr that it converted."""
    chosen = capability or infer_capability(path)
    if chosen is None:
        raise ScenarioError(f"{path}: is in the reference format (module_code/oracle_search) and its folder "
                            "names no capability; fix: convert it with `python -m swebench.scenario "
                            f"import-reference {path} --capability NAME`, or keep it at "
                            "pipeline/swebench/<capability>/scenarios_parsed.json")
    scenarios = convert_reference(data, chosen, str(path))
    key = str(Path(path).resolve())
    if note and key not in _noted:
        _noted.add(key)
        print(f"note: {path} is in the reference format; converted {len(scenarios)} scenario(s) as capability "
              f"{chosen!r} (no hidden tests; every test but the target is a regression test). Store it in ours "
              f"with: python -m swebench.scenario import-reference {path} --out FILE", file=sys.stderr)
    return scenarios
