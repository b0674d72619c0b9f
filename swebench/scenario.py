"""The scenario format: one small Python repository with a bug, its tests and the oracle fix.

`pipeline/swebench/<capability>/scenarios_parsed.json` is a JSON list of objects:

    {"id": "semantic_logic_precision_0003",
     "capability": "semantic_logic_precision",
     "seed": 3,
     "files": {"tariffs/__init__.py": "...", "tariffs/rules.py": "...", "tests/test_rules.py": "...",
               "tests/test_hidden_rules.py": "..."},
     "test_files": ["tests/test_rules.py"],                 # visible tests (the agent may read and run them)
     "target_test": "tests/test_rules.py::test_boundary",   # fails before the oracle patch, passes after
     "oracle_patch": "--- a/tariffs/rules.py\\n+++ b/tariffs/rules.py\\n@@ ...",
     "problem_statement": "What a user reports: the symptom, a reproduction, the rule. No fix.",
     "metadata": {"mutations": [], "difficulty": {...},
                  "hidden_test_files": ["tests/test_hidden_rules.py"],
                  "shortcut_patch": "...optional: a patch that hard-codes the visible expectation"}}

Every test in a hidden test file is a *hidden target*: it fails before and passes after the oracle patch,
like `target_test`, but the agent never sees it (it guards against patches that only satisfy the visible
example). Every other test is a regression test: it passes before and after.

`load_scenarios(path)` validates each object and raises `ScenarioError` naming the file, the scenario and
the bad field, with what to write instead. `Scenario.buggy_files()` / `fixed_files()` give the two trees.

A file in the reference implementation's format (flat objects with module_code, test_code, oracle_search,
oracle_replace, ...; see swebench/reference_format.py for the mapping and its defaults) is
recognized by `load_scenarios`, converted with a note on stderr, and validated like ours. To store it in
ours:

    python -m swebench.scenario import-reference FILE [--capability NAME] [--out PATH]

(--capability defaults to FILE's folder when that names one, as in pipeline/swebench/<capability>/;
--out defaults to pipeline/swebench/<capability>/scenarios_parsed.json, which it will not replace unless
named; --out must not be FILE. Exit codes: 0 written, 2 bad input; nothing is written then.) Then
self-test the result with `python -m swebench.selftest PATH`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.cli import cli_entry, exit_code
from common.io import atomic_write_json, check_output_path, load_json
from common.paths import REPO_ROOT
from swebench import reference_format
from swebench.scenario_model import (CAPABILITIES, REQUIRED_FIELDS, Scenario, ScenarioError, _CAPABILITY,
                                     check_relative_path)

__all__ = ["CAPABILITIES", "REQUIRED_FIELDS", "Scenario", "ScenarioError", "check_relative_path", "load_scenarios",
           "save_scenarios", "default_scenarios_path", "ARTIFACTS_DIR", "main"]


def load_scenarios(path: str | Path, capability: str | None = None) -> list[Scenario]:
    """Read and validate a scenarios JSON file; ScenarioError / InputError name the file and the problem.

    A file in the reference format is converted (swebench/reference_format.py) with a note on stderr;
    `capability` names its capability when its folder does not (ignored for files in our format)."""
    data = load_json(path)
    if reference_format.is_reference_format(data):
        return reference_format.load_reference(path, data, capability)
    if not isinstance(data, list):
        raise ScenarioError(f"{path}: must hold a JSON list of scenarios, got {type(data).__name__}")
    if not data:
        raise ScenarioError(f"{path}: holds no scenario")
    scenarios = [Scenario.from_dict(item, f"{path}: scenario {index}") for index, item in enumerate(data)]
    seen: dict[str, int] = {}
    for index, scenario in enumerate(scenarios):
        if scenario.id in seen:
            raise ScenarioError(f"{path}: scenario {index}: id {scenario.id!r} repeats scenario {seen[scenario.id]}; "
                                "ids must be unique")
        seen[scenario.id] = index
    return scenarios


def save_scenarios(path: str | Path, scenarios: list[Scenario]) -> Path:
    """Write scenarios as a JSON list (atomically)."""
    return atomic_write_json(path, [s.to_dict() for s in scenarios])


def publish_scenarios(out: Path, scenarios: list[Scenario], what: str) -> str:
    """Write this run's `what` scenarios (kept, accepted) to `out`; returns a clause saying what became of `out`.
    With none, an earlier file there is removed instead: a scenarios file holds at least one scenario
    (load_scenarios refuses an empty list), the old one would pass for this run's result, and the later phases
    take a missing file for none."""
    if scenarios:
        save_scenarios(out, scenarios)
        return f"{what} scenarios -> {out}"
    if out.is_file():
        out.unlink()
        return f"no scenario {what}: removed the earlier {out}"
    return f"no scenario {what}: nothing written to {out}"


# Where Steps 1-2 hand SWE-bench artifacts on (docs/ARTIFACTS.md, the reference's layout): the selected list and
# each capability's calibrated scenarios stay under pipeline/swebench/ though the code lives in swebench/.
ARTIFACTS_DIR = REPO_ROOT / "pipeline" / "swebench"


def default_scenarios_path(capability: str) -> Path:
    """pipeline/swebench/<capability>/scenarios_parsed.json"""
    return ARTIFACTS_DIR / capability / "scenarios_parsed.json"


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swebench.scenario",
                                     description="Scenario files: convert the reference implementation's format.")
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import-reference", help="convert a reference-format scenarios file into ours",
                              description="Convert a reference-format scenarios JSON (module_code, test_code, "
                                          "oracle_search, ...) into our format; see swebench/"
                                          "reference_format.py for the mapping.")
    imp.add_argument("file", type=Path, help="the reference's scenarios JSON (a list)")
    imp.add_argument("--capability", default=None,
                     help="capability of the scenarios (default: FILE's folder, as in pipeline/swebench/<NAME>/)")
    imp.add_argument("--out", type=Path, default=None,
                     help="where to write (default pipeline/swebench/<capability>/scenarios_parsed.json)")
    args = parser.parse_args(argv)
    # The flags and the output first (the capability comes from the file's folder, not its content), then the file.
    capability = args.capability or reference_format.infer_capability(args.file)
    if capability is None:
        raise ScenarioError(f"{args.file}: its folder names no capability; pass --capability NAME")
    if not _CAPABILITY.fullmatch(capability):
        raise ScenarioError(f"--capability must be a snake_case name, got {capability!r}; e.g. "
                            f"{CAPABILITIES[0]}")
    out = args.out or default_scenarios_path(capability)
    if args.out is None and out.exists():
        raise ScenarioError(f"{out} exists (the capability's scenario set); pass --out {out} to replace it, "
                            "or --out another path")
    check_output_path(out, "--out", [("the file to convert", args.file)])
    data = load_json(args.file)
    if not reference_format.is_reference_format(data):
        raise ScenarioError(f"{args.file}: is not a list of reference-format scenarios (objects with "
                            f"{', '.join(reference_format.REFERENCE_REQUIRED)} and no files/oracle_patch)")
    scenarios = reference_format.convert_reference(data, capability, str(args.file))
    save_scenarios(out, scenarios)
    print(f"{len(scenarios)} {capability} scenario(s) from {args.file} -> {out} (no hidden tests; self-test them: "
          f"python -m swebench.selftest {out})")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
