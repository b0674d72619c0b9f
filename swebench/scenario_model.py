"""One scenario in memory: `Scenario` (a small repository with a bug, its tests and the oracle fix), its
validation (`ScenarioError` names the field and what to write instead) and the names it checks against.

The file format, loading and saving are swebench/scenario.py's (which re-exports these names); the reference
implementation's format converts into this one (swebench/reference_format.py). Kept apart so that both read
one definition without importing each other.
"""
from __future__ import annotations

import json
import keyword
import re
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from common.validation import InputError
from swebench.patches import PatchError, apply_patch, parse_patch

CAPABILITIES = ("deep_call_graph_traversal", "semantic_logic_precision")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_CAPABILITY = re.compile(r"[a-z][a-z0-9_]*")
REQUIRED_FIELDS = ("id", "capability", "seed", "files", "test_files", "target_test", "oracle_patch",
                   "problem_statement", "metadata")


class ScenarioError(InputError):
    """A scenario that breaks the format; the message names the scenario and the field."""


def _is_test_path(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def check_relative_path(path: Any) -> str | None:
    """Why `path` is not a safe relative POSIX path inside a scenario, or None."""
    if not isinstance(path, str) or not path:
        return "must be a non-empty string"
    if "\\" in path or "\x00" in path:
        return "must use '/' separators and no NUL"
    pure = PurePosixPath(path)
    if pure.is_absolute():
        return "must be relative (no leading '/')"
    if any(part in ("..", ".", "") for part in path.split("/")):
        return "must not contain '.', '..' or empty components"
    if path.split("/")[0] in (".trace", ".git"):
        return "must not start with .trace/ or .git/ (reserved)"
    return None


@dataclass
class Scenario:
    """One scenario (see the module docstring). Construction validates every field."""

    id: str
    capability: str
    seed: int
    files: dict[str, str]
    test_files: list[str]
    target_test: str
    oracle_patch: str
    problem_statement: str
    metadata: dict[str, Any] = field(default_factory=lambda: {"mutations": [], "difficulty": {}})

    def __post_init__(self) -> None:
        self._fail_unless(isinstance(self.id, str) and _ID.fullmatch(self.id or ""), "id",
                          f"must be a string of letters, digits, '_', '.', '-', got {self.id!r}",
                          "e.g. \"semantic_logic_precision_0003\"")
        self._fail_unless(isinstance(self.capability, str) and _CAPABILITY.fullmatch(self.capability or ""),
                          "capability", f"must be a snake_case name, got {self.capability!r}",
                          f"one of {', '.join(CAPABILITIES)}")
        self._fail_unless(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed",
                          f"must be an integer, got {self.seed!r}", "the generator seed, e.g. 3")
        self._check_files()
        self._check_tests()
        self._fail_unless(isinstance(self.problem_statement, str) and self.problem_statement.strip(),
                          "problem_statement", "must be a non-empty string",
                          "what a user reports: the symptom and how to reproduce it")
        self._check_metadata()
        self._check_oracle()

    # ---- checks ---------------------------------------------------------------------------------
    def _fail_unless(self, ok: Any, name: str, problem: str, fix: str) -> None:
        if not ok:
            ident = self.id if isinstance(self.id, str) and self.id else "?"
            raise ScenarioError(f"scenario {ident!r}: field {name!r} {problem}; fix: {fix}")

    def _check_files(self) -> None:
        self._fail_unless(isinstance(self.files, dict) and self.files, "files",
                          "must be a non-empty object {path: text}", "{\"pkg/mod.py\": \"...\", ...}")
        for path, text in self.files.items():
            problem = check_relative_path(path)
            self._fail_unless(problem is None, f"files[{path!r}]", f"path {problem}", "e.g. \"pkg/mod.py\"")
            self._fail_unless(isinstance(text, str), f"files[{path!r}]",
                              f"must be the file's text, got {type(text).__name__}", "a string")
        prefixes = {str(p) for path in self.files for p in PurePosixPath(path).parents}
        clash = sorted(prefixes & set(self.files))
        self._fail_unless(not clash, "files", f"uses {clash} both as a file and as a folder",
                          "give the file another name")

    def _check_tests(self) -> None:
        self._fail_unless(isinstance(self.test_files, list) and self.test_files, "test_files",
                          "must be a non-empty list of paths", "[\"tests/test_mod.py\"]")
        for path in self.test_files:
            self._fail_unless(isinstance(path, str) and path in self.files, "test_files",
                              f"names {path!r}, which is not in files", "list paths that are keys of files")
            self._fail_unless(_is_test_path(path), "test_files",
                              f"names {path!r}, which pytest would not collect", "name it test_*.py")
        self._fail_unless(len(set(self.test_files)) == len(self.test_files), "test_files", "has duplicates",
                          "list each test file once")
        target = self.target_test
        self._fail_unless(isinstance(target, str) and "::" in target, "target_test",
                          f"must be a pytest node id 'PATH::NAME', got {target!r}",
                          "e.g. \"tests/test_mod.py::test_boundary\"")
        path, _, name = target.partition("::")
        self._fail_unless(path in self.test_files, "target_test",
                          f"is in {path!r}, which is not one of test_files {self.test_files}",
                          "put the target test in a visible test file")
        self._fail_unless(all(part.isidentifier() and not keyword.iskeyword(part) for part in name.split("::")),
                          "target_test", f"names {name!r}, which is not a test function (or Class::method)",
                          "e.g. \"test_boundary\"")

    def _check_metadata(self) -> None:
        meta = self.metadata
        self._fail_unless(isinstance(meta, dict), "metadata", f"must be an object, got {type(meta).__name__}",
                          "{\"mutations\": [], \"difficulty\": {}}")
        self._fail_unless(isinstance(meta.get("mutations", []), list), "metadata.mutations",
                          "must be a list", "[] for an unmutated scenario")
        hidden = meta.get("hidden_test_files", [])
        self._fail_unless(isinstance(hidden, list), "metadata.hidden_test_files", "must be a list of paths",
                          "[\"tests/test_hidden_mod.py\"] or []")
        for path in hidden:
            self._fail_unless(isinstance(path, str) and path in self.files, "metadata.hidden_test_files",
                              f"names {path!r}, which is not in files", "list paths that are keys of files")
            self._fail_unless(path not in self.test_files and _is_test_path(path), "metadata.hidden_test_files",
                              f"names {path!r}, which is a visible test file or not a test_*.py file",
                              "keep hidden tests in their own test_*.py files, outside test_files")
        shortcut = meta.get("shortcut_patch")
        if shortcut is not None:
            self._fail_unless(isinstance(shortcut, str), "metadata.shortcut_patch", "must be a unified diff string",
                              "drop it, or give a patch")

    def _check_oracle(self) -> None:
        self._fail_unless(isinstance(self.oracle_patch, str) and self.oracle_patch.strip(), "oracle_patch",
                          "must be a non-empty unified diff", "diff the fixed files against the buggy ones")
        try:
            paths = [p.path for p in parse_patch(self.oracle_patch)]
            apply_patch(self.files, self.oracle_patch)
        except PatchError as err:
            self._fail_unless(False, "oracle_patch", f"does not apply to files: {err}",
                              "regenerate it with swebench.patches.make_patch(buggy, fixed)")
            return
        touched_tests = sorted(set(paths) & set(self.all_test_files()))
        self._fail_unless(not touched_tests, "oracle_patch", f"changes test files {touched_tests}",
                          "fix the code, not the tests")

    # ---- views ----------------------------------------------------------------------------------
    def hidden_test_files(self) -> list[str]:
        return list(self.metadata.get("hidden_test_files", []))

    def all_test_files(self) -> list[str]:
        return [*self.test_files, *self.hidden_test_files()]

    def source_files(self) -> list[str]:
        """Non-test files (what the agent may edit)."""
        tests = set(self.all_test_files())
        return sorted(path for path in self.files if path not in tests)

    def visible_files(self) -> list[str]:
        """Every file the agent may see (hidden tests left out)."""
        hidden = set(self.hidden_test_files())
        return sorted(path for path in self.files if path not in hidden)

    def buggy_files(self) -> dict[str, str]:
        return dict(self.files)

    def fixed_files(self) -> dict[str, str]:
        return apply_patch(self.files, self.oracle_patch)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, data: Any, where: str = "scenario") -> "Scenario":
        """Build from a parsed JSON object; a missing or unknown key raises ScenarioError naming it."""
        if not isinstance(data, dict):
            raise ScenarioError(f"{where}: must be a JSON object, got {type(data).__name__}")
        ident = data.get("id", "?")
        missing = [key for key in REQUIRED_FIELDS if key not in data]
        if missing:
            hint = ""
            if any(key in data for key in ("module_code", "oracle_search", "test_code")):
                hint = ("; it looks like the reference format (module_code, oracle_search, ...): a file holding "
                        "only such objects is converted by load_scenarios, or run `python -m "
                        "swebench.scenario import-reference FILE`")
            raise ScenarioError(f"{where} ({ident!r}): missing field(s) {missing}; every scenario needs "
                                f"{', '.join(REQUIRED_FIELDS)}{hint}")
        unknown = sorted(set(data) - set(REQUIRED_FIELDS))
        if unknown:
            raise ScenarioError(f"{where} ({ident!r}): unknown field(s) {unknown}; put extra facts under metadata")
        try:
            return cls(**{key: data[key] for key in REQUIRED_FIELDS})
        except ScenarioError as err:
            raise ScenarioError(f"{where}: {err}") from None
