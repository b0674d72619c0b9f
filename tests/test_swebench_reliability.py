"""Reliability of the SWE-bench path: calibration never reads another run's rollouts, the self-test never leaves
another run's scenarios at --out, and a scenario without hidden tests is graded as having none.

The calibration tests run `swebench.calibrate.main` end to end with the model stack stubbed (no torch import, no
model: the stub `collect` plays nothing and says which scenarios were solved) and the self-test stubbed to keep
every candidate (the self-test is not what they check); each takes well under a second.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from swebench import calibrate, selftest
from swebench.grading import Grader, GradeConfig
from swebench.patches import make_patch
from swebench.sandbox import SandboxConfig
from swebench.scenario import Scenario, load_scenarios, save_scenarios

CAPABILITY = "semantic_logic_precision"


# --------------------------------------------------------------------------------------------------
# Calibration: rollouts of one calibration only
# --------------------------------------------------------------------------------------------------
class StubCollect:
    """Stands in for train.collect_rollouts.collect: every sample of a scenario succeeds when `solved`."""

    def __init__(self, solved: bool):
        self.solved = solved
        self.calls: list[int] = []  # the number of scenarios of each call

    def __call__(self, spec, backend, chat, *, seeds, samples, temperature, max_episode_tokens, game_overrides):
        self.calls.append(len(seeds))
        assert len(load_scenarios(game_overrides["scenarios_path"])) == len(seeds)
        return [{"id": f"{seed}-{sample}", "task_id": seed, "messages": [],
                 "reward_info": {"success": self.solved, "reward": float(self.solved)}}
                for seed in seeds for sample in range(samples)]


@pytest.fixture
def model_stack(monkeypatch):
    """Replace what trainer_rollouts imports (torch, the model loader, the backends, collect) with stubs;
    returns a function that installs a StubCollect and gives it back (its `loads` lists the models loaded)."""
    loads: list[str] = []

    def module(name: str, **attributes) -> None:
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attributes))

    def load_base_model(model: str):
        loads.append(model)
        return object(), types.SimpleNamespace(pad_token_id=0)

    module("torch", manual_seed=lambda seed: None)
    module("train.policy", load_base_model=load_base_model)
    module("train.vllm_backend", backend_from_env=lambda folder, seed: None)
    module("train.backends", HFBackend=lambda model, pad_token_id, seed: object())
    module("train.episodes", ChatTokenizer=lambda tokenizer: object())
    module("peft", PeftModel=types.SimpleNamespace(from_pretrained=lambda model, adapter: model))
    monkeypatch.setattr(calibrate, "self_test_many", lambda scenarios, *args, **kwargs: [
        selftest.SelfTestResult(s.id, ok=True) for s in scenarios])

    def install(solved: bool) -> StubCollect:
        collect = StubCollect(solved)
        collect.loads = loads
        module("train.collect_rollouts", collect=collect)
        return collect

    return install


def run_calibrate(work: Path, out: Path, *flags: str) -> int:
    return calibrate.main(["--capability", CAPABILITY, "--model", "some/model", "--rounds", "0", "--samples", "2",
                           "--work-dir", str(work), "--out", str(out), *flags])


@pytest.mark.parametrize("first, second", [(2, 2), (3, 2)], ids=["same_count", "fewer_scenarios"])
def test_a_new_calibration_never_reads_the_rollouts_of_an_earlier_one(first, second, model_stack, tmp_path,
                                                                         capsys):
    # Before: after deleting state.json (as the refusal of changed settings advises), round_0_rollouts.json of
    # the earlier calibration gave the new scenarios their success rates (all accepted though never played);
    # with more scenarios in the earlier round, rates[task_id] raised IndexError.
    work, out = tmp_path / "work", tmp_path / "out.json"
    model_stack(solved=False)
    assert run_calibrate(work, out, "--candidates", str(first), "--target", str(first)) == 0
    (work / "state.json").unlink()
    collect = model_stack(solved=True)
    assert run_calibrate(work, tmp_path / "out2.json", "--seed", "10", "--candidates", str(second), "--target",
                         str(second)) == 1
    assert collect.calls == [second]  # the new scenarios were played
    state = json.loads((work / "state.json").read_text())
    assert state["accepted"] == [] and len(state["rejected"]) == second
    assert sorted(p.name for p in (work / "superseded_0").iterdir()) == ["round_0_rollouts.json",
                                                                         "round_0_scenarios.json"]
    assert "round file(s) of an earlier one moved to" in capsys.readouterr().out


def test_a_calibration_accepting_nothing_leaves_no_earlier_scenarios_at_out(model_stack, tmp_path, capsys):
    # Before: "(none written)", and the earlier calibration's file stayed at --out for the next phase to read.
    out = tmp_path / "out.json"
    model_stack(solved=False)  # every sample fails: hard enough, accepted
    assert run_calibrate(tmp_path / "work", out, "--candidates", "2", "--target", "2") == 0
    assert len(load_scenarios(out)) == 2
    model_stack(solved=True)  # every sample succeeds: too easy, none accepted
    capsys.readouterr()
    assert run_calibrate(tmp_path / "work2", out, "--candidates", "2", "--target", "2") == 1
    assert not out.exists() and f"no scenario accepted: removed the earlier {out}" in capsys.readouterr().out


@pytest.mark.parametrize("flag, value", [("--model", "other/model"), ("--adapter", "some-adapter"),
                                         ("--temperature", "0.5"), ("--max-episode-tokens", "4096")])
def test_a_rerun_with_another_model_or_sampling_setting_is_refused(flag, value, model_stack, tmp_path, capsys):
    # Before: the model, adapter, temperature and episode budget were not in state.json's config: the rerun
    # resumed (and reused) the first model's rounds and reported them as its own.
    work, out = tmp_path / "work", tmp_path / "out.json"
    model_stack(solved=False)
    assert run_calibrate(work, out, "--candidates", "2", "--target", "2") == 0
    collect = model_stack(solved=True)
    capsys.readouterr()
    collect.loads.clear()
    # the flag given last wins (argparse), so "--model other/model" replaces run_calibrate's own --model
    assert run_calibrate(work, out, "--candidates", "2", "--target", "2", flag, value) == 2
    assert "was written with other settings" in capsys.readouterr().err
    assert collect.calls == [] and collect.loads == []  # refused before the model loads


def test_a_round_is_reused_only_when_sampled_for_the_same_scenarios_and_settings(model_stack, tmp_path, capsys):
    scenarios_file = tmp_path / "round_0_scenarios.json"
    from swebench.generators import generate_one

    save_scenarios(scenarios_file, [generate_one(CAPABILITY, seed) for seed in (0, 1)])
    collect = model_stack(solved=True)

    def rollouts(temperature: float = 1.0):
        return calibrate.trainer_rollouts(CAPABILITY, "some/model", None, 2, temperature, 4096, tmp_path)

    assert rollouts()(scenarios_file, 2, 0) == [1.0, 1.0] and collect.calls == [2]
    assert rollouts()(scenarios_file, 2, 0) == [1.0, 1.0] and collect.calls == [2]  # resumed: not sampled again
    # Before: any file at round_0_rollouts.json was reused, whatever it was sampled with (here, as an older
    # version wrote it: no hash of the scenarios, and another temperature).
    stale = tmp_path / "round_0_rollouts.json"
    document = json.loads(stale.read_text())
    document["info"] = {"capability": CAPABILITY, "model": "some/model", "round": 0, "temperature": 0.5, "samples": 2}
    for sim in document["simulations"]:
        sim["reward_info"] = {"success": False, "reward": 0.0}
    stale.write_text(json.dumps(document))
    assert rollouts()(scenarios_file, 2, 0) == [1.0, 1.0] and collect.calls == [2, 2]
    assert (tmp_path / "superseded_0" / "round_0_rollouts.json").is_file()
    assert "round_0_rollouts.json was sampled for other scenarios or settings" in capsys.readouterr().out
    assert rollouts(temperature=0.5)(scenarios_file, 2, 0) == [1.0, 1.0] and collect.calls == [2, 2, 2]


# --------------------------------------------------------------------------------------------------
# Self-test: --out never keeps another run's scenarios
# --------------------------------------------------------------------------------------------------
CORE = "def value():\n    return 1\n"
TESTS = ("from pkg.core import value\n\n\n"
         "def test_target():\n    assert value() == 2\n\n\n"
         "def test_one():\n    assert 1 + 1 == 2\n\n\n"
         "def test_two():\n    assert value() >= 1\n\n\n"
         "def test_three():\n    assert 'a' < 'b'\n")


def small_scenario(tests: str = TESTS) -> Scenario:
    """A four-test scenario without hidden tests: value() returns 1, the target wants 2."""
    files = {"pkg/__init__.py": "", "pkg/core.py": CORE, "tests/test_core.py": tests}
    fixed = {**files, "pkg/core.py": CORE.replace("return 1", "return 2")}
    return Scenario(id="no_hidden_0000", capability=CAPABILITY, seed=0, files=files, test_files=["tests/test_core.py"],
                    target_test="tests/test_core.py::test_target", oracle_patch=make_patch(files, fixed),
                    problem_statement="value() should be 2", metadata={})


def test_selftest_with_nothing_kept_leaves_no_earlier_scenarios_at_out(tmp_path, capsys):
    # Before: with no scenario passing, --out kept the previous run's scenarios while --report said kept: [].
    already_passing = small_scenario(TESTS.replace("value() == 2", "value() == 1"))  # target passes before the fix
    scenarios, out, report = tmp_path / "s.json", tmp_path / "kept.json", tmp_path / "report.json"
    save_scenarios(scenarios, [already_passing])
    save_scenarios(out, [small_scenario()])  # an earlier run's result
    assert selftest.main([str(scenarios), "--out", str(out), "--report", str(report), "--no-progress"]) == 1
    assert not out.exists()
    assert json.loads(report.read_text())["kept"] == []
    assert f"no scenario kept: removed the earlier {out}" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# Grading: no hidden tests is 0 of 0
# --------------------------------------------------------------------------------------------------
def test_a_scenario_without_hidden_tests_is_graded_zero_of_zero():
    # Before: hidden_total was max(count, 1): every graded episode's record said 0 of 1 hidden tests passed.
    scenario = small_scenario()
    grader = Grader(scenario, GradeConfig(sandbox=SandboxConfig(timeout_s=20.0, cpu_s=20), cache_size=0))
    fixed = grader.grade(scenario.fixed_files())
    assert (fixed.reward, fixed.success, fixed.hidden_passed, fixed.hidden_total) == (1.0, True, 0, 0)
    assert fixed.regression_passed == fixed.regression_total == 3
    assert fixed.detail == "the target test passes (no hidden tests) and no regression test broke"
    unfixed = grader.grade(scenario.buggy_files())
    assert (unfixed.reward, unfixed.success, unfixed.hidden_total) == (0.0, False, 0)
