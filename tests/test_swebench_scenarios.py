"""Scenario format, loader, patches and the seeded generators (no pytest runs here: see test_swebench_sandbox)."""
from __future__ import annotations

import json

import pytest

from swebench.generate import main as generate_main
from swebench.generators import GENERATORS, generate_many, generate_one
from swebench.generators.semantic_logic import TEMPLATES
from swebench.patches import PatchError, apply_patch, make_patch, replacements
from swebench.scenario import Scenario, ScenarioError, load_scenarios, save_scenarios

CAPABILITIES = sorted(GENERATORS)


def tiny_scenario(**changes) -> dict:
    files = {"pkg/__init__.py": "", "pkg/core.py": "def value():\n    return 1\n",
             "tests/test_core.py": "from pkg.core import value\n\n\ndef test_value():\n    assert value() == 2\n"}
    fixed = {**files, "pkg/core.py": "def value():\n    return 2\n"}
    data = {"id": "tiny_0001", "capability": "semantic_logic_precision", "seed": 1, "files": files,
            "test_files": ["tests/test_core.py"], "target_test": "tests/test_core.py::test_value",
            "oracle_patch": make_patch(files, fixed), "problem_statement": "value() returns 1, expected 2.",
            "metadata": {"mutations": [], "difficulty": {}}}
    data.update(changes)
    return data


# --------------------------------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------------------------------
def test_patch_round_trip_and_strict_context():
    before = {"a.py": "one\ntwo\nthree\nfour\nfive\nsix\nseven\n", "b.py": "x\n"}
    after = {"a.py": "one\nTWO\nthree\nfour\nfive\nsix\nSEVEN\n", "b.py": "x\n"}
    patch = make_patch(before, after)
    assert patch.startswith("--- a/a.py\n+++ b/a.py\n")
    assert apply_patch(before, patch) == after
    with pytest.raises(PatchError, match="a.py: hunk 1"):
        apply_patch({**before, "a.py": before["a.py"].replace("three", "3")}, patch)
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch({"b.py": "x\n"}, patch)
    with pytest.raises(PatchError, match="create or delete"):
        apply_patch(before, "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n")


def test_patch_without_final_newline():
    before, after = {"a.py": "x = 1"}, {"a.py": "x = 2"}
    assert apply_patch(before, make_patch(before, after)) == after


def test_replacements_are_unique_and_reproduce_the_target():
    before = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
    after = "def f():\n    return 2\n\n\ndef g():\n    return 1\n"
    edits = replacements(before, after)
    text = before
    for old, new in edits:
        assert text.count(old) == 1
        text = text.replace(old, new)
    assert text == after
    assert "def f" in edits[0][0]  # "return 1" alone is ambiguous: context was added


# --------------------------------------------------------------------------------------------------
# The loader names the bad field
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, field", [
    ({"id": ""}, "'id'"),
    ({"capability": "Bad Name"}, "'capability'"),
    ({"seed": "3"}, "'seed'"),
    ({"files": {"../escape.py": ""}}, "files['../escape.py']"),
    ({"test_files": ["tests/missing.py"]}, "'test_files'"),
    ({"target_test": "tests/test_core.py"}, "'target_test'"),
    ({"target_test": "tests/other.py::test_value"}, "'target_test'"),
    ({"oracle_patch": "--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1,2 +1,2 @@\n def nope():\n-    return 1\n+    return 2\n"},
     "'oracle_patch'"),
    ({"problem_statement": "  "}, "'problem_statement'"),
    ({"metadata": {"mutations": "rename"}}, "'metadata.mutations'"),
    ({"metadata": {"hidden_test_files": ["tests/test_core.py"]}}, "'metadata.hidden_test_files'"),
])
def test_loader_names_the_bad_field(tmp_path, change, field):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([tiny_scenario(), tiny_scenario(**{"id": "tiny_0002", **change})]))
    with pytest.raises(ScenarioError) as err:
        load_scenarios(path)
    message = str(err.value)
    assert "scenario 1" in message and field in message and "fix:" in message


def test_oracle_that_edits_a_test_is_refused():
    data = tiny_scenario()
    fixed_tests = {**data["files"], "tests/test_core.py": data["files"]["tests/test_core.py"].replace("2", "1")}
    data["oracle_patch"] = make_patch(data["files"], fixed_tests)
    with pytest.raises(ScenarioError, match="changes test files"):
        Scenario.from_dict(data)


def test_loader_refuses_missing_unknown_and_duplicate(tmp_path):
    path = tmp_path / "s.json"
    broken = tiny_scenario()
    del broken["oracle_patch"]
    path.write_text(json.dumps([broken]))
    with pytest.raises(ScenarioError, match=r"missing field\(s\) \['oracle_patch'\]"):
        load_scenarios(path)
    path.write_text(json.dumps([tiny_scenario(hint="x")]))
    with pytest.raises(ScenarioError, match="unknown field.*hint.*metadata"):
        load_scenarios(path)
    path.write_text(json.dumps([tiny_scenario(), tiny_scenario()]))
    with pytest.raises(ScenarioError, match="repeats scenario 0"):
        load_scenarios(path)
    path.write_text(json.dumps({"id": "x"}))
    with pytest.raises(ScenarioError, match="JSON list"):
        load_scenarios(path)


def test_save_and_load_round_trip(tmp_path):
    scenarios = [generate_one(c, 0) for c in CAPABILITIES]
    save_scenarios(tmp_path / "s.json", scenarios)
    assert load_scenarios(tmp_path / "s.json") == scenarios


# --------------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_generators_are_deterministic_per_seed(capability):
    first = [s.to_dict() for s in generate_many(capability, 6, seed=100)]
    again = [s.to_dict() for s in generate_many(capability, 6, seed=100)]
    assert first == again
    assert len({json.dumps(s["files"], sort_keys=True) for s in first}) == 6  # seeds give different scenarios
    assert [s["seed"] for s in first] == list(range(100, 106))


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_generated_scenarios_have_the_documented_shape(capability):
    for scenario in generate_many(capability, 12, seed=0):
        hidden = scenario.hidden_test_files()
        assert hidden and set(hidden).isdisjoint(scenario.test_files)
        assert scenario.capability == capability
        assert scenario.metadata["difficulty"] and scenario.metadata["mutations"] == []
        assert "shortcut_patch" in scenario.metadata
        fixed = scenario.fixed_files()
        changed = [p for p in fixed if fixed[p] != scenario.files[p]]
        assert changed and not set(changed) & set(scenario.all_test_files())
        # the issue describes the symptom, never the fix
        assert scenario.oracle_patch not in scenario.problem_statement
        for _, new in [l for path in changed for l in replacements(scenario.files[path], fixed[path])]:
            assert new.strip() not in scenario.problem_statement


def test_deep_call_graph_knobs_set_the_depth():
    for depth in (3, 4, 5):
        scenario = generate_one("deep_call_graph_traversal", 7, call_depth=depth)
        assert scenario.metadata["difficulty"]["call_depth"] == depth
        hops = [p for p in scenario.files if p.split("/")[-1] in ("extract.py", "resolve.py", "adapters.py",
                                                                   "fieldmap.py")]
        assert len(hops) == depth - 3
    with pytest.raises(ValueError, match="call_depth"):
        generate_one("deep_call_graph_traversal", 7, call_depth=9)


def test_every_semantic_template_generates():
    keys = {generate_one("semantic_logic_precision", seed, template=t.key).metadata["difficulty"]["template"]
            for seed, t in enumerate(TEMPLATES)}
    assert keys == {t.key for t in TEMPLATES}


def test_generate_cli(tmp_path, capsys):
    out = tmp_path / "set" / "scenarios_parsed.json"
    assert generate_main(["--capability", "semantic_logic_precision", "--n", "3", "--seed", "5", "--out", str(out),
                          "--no-progress"]) == 0
    scenarios = load_scenarios(out)
    assert [s.seed for s in scenarios] == [5, 6, 7]
    assert "3 semantic_logic_precision scenarios" in capsys.readouterr().out
    assert generate_main(["--capability", "deep_call_graph_traversal", "--n", "1", "--out", str(tmp_path),
                          "--no-progress"]) == 2
    assert "is a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate_main(["--capability", "nope", "--n", "1", "--out", str(out)])
    with pytest.raises(SystemExit):
        generate_main(["--capability", "semantic_logic_precision", "--n", "1", "--out", str(out), "--call-depth", "4"])
