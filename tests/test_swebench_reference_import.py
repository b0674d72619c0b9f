"""Scenarios in the reference implementation's format (swebench/reference_format.py) load, convert
faithfully, self-test and round-trip; broken ones are refused with the scenario and the field named."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from swebench.reference_format import (REFERENCE_REQUIRED, convert_reference, infer_capability,
                                                is_reference_format, load_reference)
from swebench.sandbox import SandboxConfig
from swebench.scenario import Scenario, ScenarioError, load_scenarios, main, save_scenarios
from swebench.selftest import self_test_many


FIXTURE = (Path(__file__).parent / "fixtures" / "swebench_reference" / "semantic_logic_precision"
           / "scenarios_parsed.json")


def reference_items() -> list[dict]:
    return json.loads(FIXTURE.read_text())


def write_reference(folder: Path, items: list[dict], capability: str = "semantic_logic_precision") -> Path:
    path = folder / capability / "scenarios_parsed.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items))
    return path


def test_fixture_loads_with_the_documented_mapping():
    items = reference_items()
    assert is_reference_format(items)
    scenarios = load_scenarios(FIXTURE)
    assert [s.capability for s in scenarios] == ["semantic_logic_precision"] * 2
    tide, freight = scenarios
    assert tide.target_test == "tests/test_mod.py::test_mean_uses_the_last_size_readings"
    assert freight.target_test == "tests/test_mod.py::TestPlan::test_fragile_general_cargo_stays_general"
    for scenario, item in zip(scenarios, items):
        assert scenario.files == {"mod.py": item["module_code"], "tests/test_mod.py": item["test_code"],
                                  "tests/__init__.py": ""}
        assert scenario.test_files == ["tests/test_mod.py"] and scenario.hidden_test_files() == []
        assert scenario.problem_statement == item["pr_description"]
        assert scenario.fixed_files()["mod.py"] == item["module_code"].replace(item["oracle_search"],
                                                                               item["oracle_replace"])
        assert scenario.source_files() == ["mod.py", "tests/__init__.py"]
        assert scenario.metadata["hint_body"] == item["hint_body"]
        assert scenario.metadata["naive_fix_description"] == item["naive_fix_description"]
        assert scenario.metadata["reference"]["name"] == item["name"]
        assert scenario.metadata["reference"]["target_test"] == item["target_test"]
        assert scenario.id.startswith(item["name"] + "-") and scenario.seed == int(scenario.id[-8:], 16)
        assert "shortcut_patch" not in scenario.metadata
    assert freight.metadata["reference"]["domain"] == "freight loadplan"
    # ids and seeds are stable: the same on every conversion and whatever the order of the file
    again = convert_reference(list(reversed(items)), "semantic_logic_precision")
    assert [(s.id, s.seed) for s in reversed(again)] == [(s.id, s.seed) for s in scenarios]


def test_loading_says_once_that_it_converted(tmp_path, capsys):
    path = write_reference(tmp_path, reference_items())
    load_scenarios(path)
    load_scenarios(path)
    err = capsys.readouterr().err
    assert err.count("is in the reference format; converted 2 scenario(s)") == 1
    assert "import-reference" in err


def test_fixture_passes_the_self_test():
    results = self_test_many(load_scenarios(FIXTURE), SandboxConfig(timeout_s=20), workers=2, progress=False)
    assert [(r.ok, r.reason) for r in results] == [(True, "")] * 2
    assert all(r.before and r.after for r in results)


def test_import_save_load_round_trip(tmp_path, capsys):
    out = tmp_path / "ours" / "scenarios.json"
    assert main(["import-reference", str(FIXTURE), "--out", str(out)]) == 0
    assert "2 semantic_logic_precision scenario(s)" in capsys.readouterr().out
    assert not is_reference_format(json.loads(out.read_text()))  # written in our format
    imported = load_scenarios(out)
    assert imported == load_scenarios(FIXTURE)
    save_scenarios(tmp_path / "again.json", imported)
    assert load_scenarios(tmp_path / "again.json") == imported
    assert [Scenario.from_dict(s.to_dict()) for s in imported] == imported


def test_import_cli_refuses_bad_input(tmp_path, capsys):
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps(reference_items()))
    assert main(["import-reference", str(loose), "--out", str(tmp_path / "o.json")]) == 2
    assert "names no capability; pass --capability" in capsys.readouterr().err
    assert main(["import-reference", str(loose), "--capability", "../up", "--out", str(tmp_path / "o.json")]) == 2
    assert "snake_case" in capsys.readouterr().err
    assert main(["import-reference", str(loose), "--capability", "semantic_logic_precision", "--out", str(loose)]) == 2
    assert "is also the file to convert" in capsys.readouterr().err
    assert json.loads(loose.read_text()) == reference_items()  # untouched
    assert main(["import-reference", str(FIXTURE), "--capability", "deep_call_graph_traversal",
                 "--out", str(tmp_path / "d.json")]) == 0
    assert {s.capability for s in load_scenarios(tmp_path / "d.json")} == {"deep_call_graph_traversal"}
    save_scenarios(tmp_path / "ours.json", load_scenarios(FIXTURE))
    assert main(["import-reference", str(tmp_path / "ours.json"), "--capability", "semantic_logic_precision", "--out",
                 str(tmp_path / "x.json")]) == 2
    assert "is not a list of reference-format scenarios" in capsys.readouterr().err


def test_import_cli_default_out_never_replaces_a_set(tmp_path, monkeypatch, capsys):
    import swebench.scenario as scenario_module

    default = tmp_path / "semantic_logic_precision" / "scenarios_parsed.json"
    monkeypatch.setattr(scenario_module, "default_scenarios_path", lambda capability: tmp_path / capability /
                        "scenarios_parsed.json")
    assert main(["import-reference", str(FIXTURE)]) == 0
    assert len(load_scenarios(default)) == 2
    default.write_text("[]")
    assert main(["import-reference", str(FIXTURE)]) == 2
    assert "exists (the capability's scenario set); pass --out" in capsys.readouterr().err
    assert default.read_text() == "[]"
    assert main(["import-reference", str(FIXTURE), "--out", str(default)]) == 0
    assert len(load_scenarios(default)) == 2


def test_capability_comes_from_the_folder_or_the_caller(tmp_path):
    assert infer_capability(FIXTURE) == "semantic_logic_precision"
    assert infer_capability(tmp_path / "swebench" / "new_capability" / "scenarios_parsed.json") == "new_capability"
    loose = tmp_path / "env" / "scenarios_parsed.json"
    loose.parent.mkdir()
    loose.write_text(json.dumps(reference_items()))
    assert infer_capability(loose) is None
    with pytest.raises(ScenarioError, match="names no capability.*--capability NAME"):
        load_scenarios(loose)
    assert {s.capability for s in load_scenarios(loose, capability="deep_call_graph_traversal")} == {
        "deep_call_graph_traversal"}


@pytest.mark.parametrize("how", ["absent", "twice"])
def test_oracle_search_must_occur_exactly_once(tmp_path, how):
    items = reference_items()
    first = items[0]
    if how == "absent":
        first["oracle_search"] = first["oracle_search"].replace("size - 1", "size + 1")
    else:
        first["module_code"] += "\n\n\ndef _legacy_recent(self):\n" + first["oracle_search"]
    with pytest.raises(ScenarioError) as err:
        load_scenarios(write_reference(tmp_path, items))
    message = str(err.value)
    count = 0 if how == "absent" else 2
    assert "scenario 0 ('tide-gauge-window-span')" in message
    assert f"reference field 'oracle_search' occurs {count} times in module_code mod.py, not exactly once" in message


def test_oracle_that_changes_nothing_is_refused():
    items = reference_items()
    items[1]["oracle_replace"] = items[1]["oracle_search"]
    with pytest.raises(ScenarioError, match=r"scenario 1 \('freight-loadplan-hazmat-routing'\).*'oracle_replace'.*"
                                            "changes nothing"):
        convert_reference(items, "semantic_logic_precision")


@pytest.mark.parametrize("missing", REFERENCE_REQUIRED)
def test_a_missing_reference_field_is_named(tmp_path, missing):
    items = reference_items()
    del items[1][missing]
    with pytest.raises(ScenarioError, match=rf"scenario 1: missing reference field\(s\) \['{missing}'\]"):
        load_scenarios(write_reference(tmp_path, items))


@pytest.mark.parametrize("change, field, problem", [
    ({"target_test": "test_nothing_like_it"}, "target_test", "which is no test in tests/test_mod.py"),
    ({"target_test": "test_mean_uses_the_last_size_readings[3]"}, "target_test", "parametrized case"),
    ({"test_code": "def test_broken(:\n"}, "test_code", "is not valid Python"),
    ({"test_filename": "tests/checks.py"}, "test_filename", "which pytest would not collect"),
    ({"module_filename": "../mod.py"}, "module_filename", "path must not contain"),
    ({"module_code": 42}, "module_code", "must be a string, got int"),
    ({"pr_description": "  "}, "pr_description", "is empty"),
])
def test_bad_reference_fields_are_named(change, field, problem):
    items = reference_items()
    items[0].update(change)
    with pytest.raises(ScenarioError) as err:
        convert_reference(items, "semantic_logic_precision", "ref.json")
    message = str(err.value)
    assert message.startswith("ref.json: scenario 0") and f"reference field {field!r}" in message
    assert problem in message and "fix:" in message


def test_target_given_as_a_node_id_and_an_ambiguous_name():
    items = reference_items()
    items[1]["target_test"] = "tests/test_mod.py::TestPlan::test_fragile_general_cargo_stays_general"
    items[0]["target_test"] = "TestWindow::test_mean_uses_the_last_size_readings"
    with pytest.raises(ScenarioError, match="target_test.*which is no test"):
        convert_reference(items, "semantic_logic_precision")
    items[0]["target_test"] = "test_mean_uses_the_last_size_readings"
    converted = convert_reference(items, "semantic_logic_precision")
    assert converted[1].target_test == "tests/test_mod.py::TestPlan::test_fragile_general_cargo_stays_general"
    items[1]["test_code"] += ("\n\n\nclass TestOther:\n    def test_fragile_general_cargo_stays_general(self):\n"
                              "        assert True\n")
    items[1]["target_test"] = "test_fragile_general_cargo_stays_general"
    with pytest.raises(ScenarioError, match=r"matches \['TestPlan::.*', 'TestOther::.*'\].*Class::name"):
        convert_reference(items, "semantic_logic_precision")


def test_duplicates_and_mixed_files_are_refused(tmp_path):
    items = reference_items()
    with pytest.raises(ScenarioError, match="scenario 2 is the same scenario as scenario 0"):
        convert_reference([*items, copy.deepcopy(items[0])], "semantic_logic_precision")
    ours = load_scenarios(FIXTURE)[0].to_dict()
    path = write_reference(tmp_path, [ours, items[0]])
    with pytest.raises(ScenarioError, match="scenario 1.*missing field.*looks like the reference format"):
        load_scenarios(path)
    with pytest.raises(ScenarioError, match="non-empty JSON list"):
        load_reference(path, {"scenarios": items}, "semantic_logic_precision")
