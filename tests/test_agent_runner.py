"""Tests for `render_pipeline.py --run AGENT` (pipeline/agent_runner.py) with stand-in agent scripts.

The agents in tests/fake_agents/ are real processes started from an agents file, fed the rendered
prompt on stdin: good_agent.py writes the stage's artifact as the prompt asks (a selection exported by
the real aggregation; a tiny game that passes validate_game, marked DONE), broken_agent.py fails in a
chosen way. Everything happens in temporary folders: the work folder is a tmp dir and new games go to
a tmp folder named in TRACE_GAMES_DIRS, so nothing is written into the repository.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

import render_pipeline
from pipeline import agent_runner
from pipeline.aggregate_capabilities import selected_entries
from pipeline.capabilities import load_selected

AGENTS = REPO / "tests" / "fake_agents"
CAPABILITY_CONFIG = REPO / "configs" / "capability_selection.yaml"
ENVIRONMENT_CONFIG = REPO / "configs" / "environment_generation.yaml"
RUN_NAME = "my_benchmark"  # run_name of both general configs
SEEDS = ["--validate-seeds", "12"]


@pytest.fixture()
def world(tmp_path, monkeypatch):
    """A work folder, a games folder on TRACE_GAMES_DIRS and an agents file with the stand-ins."""
    workdir = tmp_path / "work"
    games = tmp_path / "games"
    workdir.mkdir()
    games.mkdir()
    monkeypatch.setenv("TRACE_GAMES_DIRS", str(games))
    agents = {"agents": {
        "good": {"command": [sys.executable, str(AGENTS / "good_agent.py")], "stdin": True},
        "broken": {"command": [sys.executable, str(AGENTS / "broken_agent.py")]},
        "lazy": {"command": [sys.executable, str(AGENTS / "broken_agent.py")], "env": {"FAKE_AGENT_MODE": "nothing"}},
        "stuck": {"command": [sys.executable, str(AGENTS / "broken_agent.py")], "env": {"FAKE_AGENT_MODE": "not_done"}},
        "wrong_target": {"command": [sys.executable, str(AGENTS / "broken_agent.py")],
                         "env": {"FAKE_AGENT_MODE": "bad_target"}},
        "crash": {"command": [sys.executable, str(AGENTS / "broken_agent.py")], "env": {"FAKE_AGENT_MODE": "crash"}},
        "slow": {"command": [sys.executable, str(AGENTS / "broken_agent.py")], "env": {"FAKE_AGENT_MODE": "sleep"},
                 "timeout_s": 1},
        "missing": {"command": ["no-such-agent-binary-xyz", "{prompt_file}"]},
    }}
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(yaml.safe_dump(agents), encoding="utf-8")
    return {"work": workdir, "games": games, "agents": agents_file, "tmp": tmp_path}


def _run(world, stage, agent, *extra):
    config = CAPABILITY_CONFIG if stage == "capability" else ENVIRONMENT_CONFIG
    return render_pipeline.main([str(config), "--stage", stage, "--out", str(world["tmp"] / f"{stage}.md"),
                                 "--run", agent, "--agents", str(world["agents"]), "--workdir", str(world["work"]),
                                 *extra])


def _write_selection(world, names, statuses=None):
    """A selected list as the aggregation exports it, every entry PENDING unless `statuses` ({name: status})."""
    path = world["work"] / "pipeline" / "selected_capabilities.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [{"skill": name, "description": f"{name} skill", "mean_cov": 0.5, "std_cov": 0.0,
                "mean_delta": 0.9 - i / 10, "std_delta": 0.0, "n_runs_passed": 2, "n_runs_total": 2,
                "passes_consistency": True, "example_failed_cases": [], "status": (statuses or {}).get(name, "PENDING")}
               for i, name in enumerate(names)]
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def _logs(world):
    return sorted((world["work"] / "runs" / RUN_NAME / "agent_logs").glob("*.log"))


# ----------------------------------------------------------------------------------------------
# Step 1
# ----------------------------------------------------------------------------------------------

def test_capability_stage_accepts_a_fresh_valid_export(world, capsys):
    assert _run(world, "capability", "good") == 0
    err = capsys.readouterr().err
    selected = world["work"] / "pipeline" / "selected_capabilities.json"
    assert sorted(e["skill"] for e in load_selected(selected)) == ["echo_back", "repeat_code"]
    assert "2 selected" in err and "repeat_code" in err
    [log] = _logs(world)
    text = log.read_text()
    assert "capability" in log.name and "good_agent.py" in text and "read " in text and "# exit code: 0" in text
    # The runner's schema is the aggregation's: the keys of a real export are exactly the ones it demands.
    assert set(agent_runner.EXPORT_FIELDS) == set(json.loads(selected.read_text())[0])


def test_export_fields_match_selected_entries():
    entry = {"skill": "x", "description": "", "mean_cov": 0.1, "std_cov": 0.0, "mean_delta": 0.3, "std_delta": 0.0,
             "n_runs_passed": 1, "n_runs_total": 1, "example_failed_cases": [], "selected": True}
    assert set(selected_entries({"capabilities": [entry]})[0]) == set(agent_runner.EXPORT_FIELDS)


def test_capability_stage_rejects_a_broken_export(world, capsys):
    assert _run(world, "capability", "broken") == 1
    err = capsys.readouterr().err
    assert "repeat_code" in err and "lacks description" in err


def test_capability_stage_rejects_a_stale_export(world, capsys):
    _write_selection(world, ["old_one"])  # left over from an earlier run: not this agent's work
    assert _run(world, "capability", "lazy") == 1
    assert "is unchanged" in capsys.readouterr().err


def test_selected_names_the_list_the_prompt_exports_and_the_run_checks(world, capsys):
    chosen = world["tmp"] / "elsewhere" / "my_selection.json"  # --selected: not the config's path
    assert _run(world, "capability", "good", "--selected", str(chosen)) == 0, capsys.readouterr().err
    assert str(chosen) in (world["tmp"] / "capability.md").read_text()
    assert sorted(e["skill"] for e in load_selected(chosen)) == ["echo_back", "repeat_code"]
    assert not (world["work"] / "pipeline" / "selected_capabilities.json").exists()
    assert _run(world, "environment", "good", "--selected", str(chosen), *SEEDS) == 0, capsys.readouterr().err
    assert [e["status"] for e in load_selected(chosen)] == ["DONE", "PENDING"]


# ----------------------------------------------------------------------------------------------
# Step 2
# ----------------------------------------------------------------------------------------------

def test_environment_stage_validates_the_new_game_and_needs_done(world, capsys):
    selected = _write_selection(world, ["repeat_code", "echo_back"])
    assert _run(world, "environment", "good", *SEEDS) == 0
    err = capsys.readouterr().err
    assert "capability repeat_code: DONE" in err and "passes validate_game" in err
    assert (world["games"] / "capability_repeat_code_game.py").exists()
    assert [e["status"] for e in load_selected(selected)] == ["DONE", "PENDING"]  # one capability per run
    [log] = _logs(world)
    assert "repeat_code" in log.name and "validate_game exit code: 0" in log.read_text()
    [report] = log.parent.glob("*_validate.json")
    # The game's target is the prompt's relative schemas path, which the agent wrote in its work folder: compared.
    assert json.loads(report.read_text())["checks"]["tool_schemas"]["status"] == "PASS"


def test_environment_all_loops_over_pending_capabilities(world, capsys):
    selected = _write_selection(world, ["repeat_code", "echo_back"])
    assert _run(world, "environment", "good", "--all", *SEEDS) == 0
    assert [e["status"] for e in load_selected(selected)] == ["DONE", "DONE"]
    assert len(_logs(world)) == 2
    assert sorted(p.name for p in world["games"].iterdir()) == ["capability_echo_back_game.py",
                                                               "capability_repeat_code_game.py"]
    capsys.readouterr()
    assert _run(world, "environment", "good", "--all", *SEEDS) == 0  # nothing left: no agent started
    assert "no PENDING capability left" in capsys.readouterr().err and len(_logs(world)) == 2
    assert _run(world, "environment", "good", *SEEDS) == 1  # a single run with nothing to do says so
    assert "nothing to do" in capsys.readouterr().err


def test_environment_stage_rejects_a_game_that_fails_validation(world, capsys):
    selected = _write_selection(world, ["repeat_code", "echo_back"])
    assert _run(world, "environment", "broken", "--all", *SEEDS) == 1
    err = capsys.readouterr().err
    assert "validate_game capability_repeat_code failed" in err and "oracle" in err
    assert len(_logs(world)) == 1  # --all stops at the first failure
    # The agent marked it DONE; the runner puts it back, so a rerun takes it again (before: skipped, exit 0).
    assert "repeat_code was put back from DONE to PENDING" in err
    assert [e["status"] for e in load_selected(selected)] == ["PENDING", "PENDING"]
    assert _run(world, "environment", "good", *SEEDS) == 0  # the rerun takes it again
    assert [e["status"] for e in load_selected(selected)] == ["DONE", "PENDING"]
    assert "capability repeat_code: DONE" in capsys.readouterr().err


def test_environment_stage_needs_the_capability_done(world, capsys):
    selected = _write_selection(world, ["repeat_code"])
    assert _run(world, "environment", "stuck", *SEEDS) == 1
    err = capsys.readouterr().err
    assert "is IN_PROGRESS, not DONE" in err and "put back from IN_PROGRESS to PENDING" in err
    assert load_selected(selected)[0]["status"] == "PENDING"  # before: left IN_PROGRESS, skipped by every rerun


def test_validation_runs_in_the_work_folder(world, capsys):
    """The game's target schemas file is the prompt's relative path, written by the agent in --workdir: the
    validation must read that one (before: it ran in the repository root, found none and skipped the check)."""
    selected = _write_selection(world, ["repeat_code"])
    assert _run(world, "environment", "wrong_target", *SEEDS) == 1
    err = capsys.readouterr().err
    assert "validate_game capability_repeat_code failed" in err and "must be a JSON list" in err
    assert load_selected(selected)[0]["status"] == "PENDING"


def test_interrupt_puts_the_capability_back_and_says_so(world, capsys, monkeypatch):
    """Ctrl-C after the agent claimed its capability: the list is put back and the message says what it holds
    (before: "nothing was saved by this run", with the capability left IN_PROGRESS)."""
    from common.cli import exit_code

    selected = _write_selection(world, ["repeat_code"])
    real_launch = agent_runner.launch

    def launch_then_ctrl_c(*args, **kwargs):
        real_launch(*args, **kwargs)  # the stand-in marks repeat_code IN_PROGRESS and exits
        raise KeyboardInterrupt

    monkeypatch.setattr(agent_runner, "launch", launch_then_ctrl_c)
    argv = [str(ENVIRONMENT_CONFIG), "--stage", "environment", "--out", str(world["tmp"] / "e.md"), "--run", "stuck",
            "--agents", str(world["agents"]), "--workdir", str(world["work"]), *SEEDS]
    assert exit_code(render_pipeline.main, argv) == 130
    err = capsys.readouterr().err
    assert "nothing was saved" not in err and "interrupted; agent 'stuck' was stopped" in err
    assert "repeat_code was put back from IN_PROGRESS to PENDING" in err
    assert load_selected(selected)[0]["status"] == "PENDING"


def test_interrupted_capability_stage_does_not_claim_nothing_was_saved(world, capsys, monkeypatch):
    from common.cli import exit_code

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(agent_runner, "launch", ctrl_c)
    argv = [str(CAPABILITY_CONFIG), "--stage", "capability", "--out", str(world["tmp"] / "c.md"), "--run", "good",
            "--agents", str(world["agents"]), "--workdir", str(world["work"])]
    assert exit_code(render_pipeline.main, argv) == 130
    err = capsys.readouterr().err
    assert "nothing was saved" not in err and "what it wrote so far is kept, unchecked" in err


@pytest.mark.parametrize("extra", [[], ["--all"]])
def test_a_capability_left_in_progress_is_not_skipped(world, capsys, extra):
    """IN_PROGRESS left by a runner that was killed: refused with the reset command (before: --all skipped it
    and said "no PENDING capability left", exit 0; a single run started the next one)."""
    selected = _write_selection(world, ["repeat_code", "echo_back"],
                                {"repeat_code": "IN_PROGRESS", "echo_back": "PENDING" if not extra else "DONE"})
    assert _run(world, "environment", "good", *extra, *SEEDS) == 2
    err = capsys.readouterr().err
    assert f"mark repeat_code PENDING --file {selected}" in err and len(err.strip().splitlines()) == 1
    assert not _logs(world)  # no agent started


def test_environment_stage_needs_a_new_game_file(world, capsys):
    _write_selection(world, ["repeat_code"])
    assert _run(world, "environment", "lazy", *SEEDS) == 1
    assert "no new capability_repeat_code_game.py" in capsys.readouterr().err


def test_environment_stage_without_selection_exits_2(world, capsys):
    assert _run(world, "environment", "good") == 2
    assert "run Step 1 first" in capsys.readouterr().err and not _logs(world)


# ----------------------------------------------------------------------------------------------
# Agent process and flags
# ----------------------------------------------------------------------------------------------

def test_agent_exit_code_timeout_and_missing_binary(world, capsys):
    _write_selection(world, ["repeat_code"])
    assert _run(world, "environment", "crash") == 1
    err = capsys.readouterr().err
    assert "exited with code 5" in err and "stand-in agent: boom" in err  # streamed to stderr...
    assert "stand-in agent: boom" in _logs(world)[0].read_text()  # ...and to the log
    assert _run(world, "environment", "slow") == 1
    assert "timed out after 1s" in capsys.readouterr().err
    assert _run(world, "capability", "missing") == 1
    assert "'no-such-agent-binary-xyz' not found" in capsys.readouterr().err


@pytest.mark.parametrize("argv_extra, expected", [
    (["--run", "nobody"], "no agent 'nobody'; known: broken, crash, good"),
    (["--all"], "--all only apply with --run AGENT"),
    (["--run", "good", "--all"], "--all loops over PENDING capabilities"),
])
def test_bad_agent_flags_exit_2(world, capsys, argv_extra, expected):
    out = world["tmp"] / "p.md"
    code = render_pipeline.main([str(CAPABILITY_CONFIG), "--stage", "capability", "--out", str(out),
                                 "--agents", str(world["agents"]), *argv_extra] if "--run" in argv_extra else
                                [str(CAPABILITY_CONFIG), "--stage", "capability", "--out", str(out), *argv_extra])
    assert code == 2
    assert expected in capsys.readouterr().err


def test_agents_file_problems_are_named(tmp_path):
    bad = tmp_path / "agents.yaml"
    bad.write_text("agents:\n  x: {command: [], stdin: yes-please}\n", encoding="utf-8")
    with pytest.raises(agent_runner.InputError, match="agents.x.command must be a non-empty list"):
        agent_runner.load_agents(bad)
    bad.write_text("agents:\n  x: {command: [a], shell: true}\n", encoding="utf-8")
    with pytest.raises(agent_runner.InputError, match="unknown key"):
        agent_runner.load_agents(bad)
    with pytest.raises(agent_runner.InputError, match="agents file not found"):
        agent_runner.load_agents(tmp_path / "nope.yaml")


@pytest.mark.parametrize("entry, expected", [
    ("{command: \"claude -p 'oops\"}", r"agents.x.command .* cannot be split .*No closing quotation.*close the quote"),
    ("{command: [a], timeout_s: .inf}", "agents.x.timeout_s must be a finite positive number"),
    ("{command: [a], timeout_s: .nan}", "agents.x.timeout_s must be a finite positive number"),
    ("{command: [a], timeout_s: 0}", "agents.x.timeout_s must be a finite positive number"),
])
def test_agents_file_bad_command_string_and_timeout(tmp_path, entry, expected):
    """Before: a traceback (ValueError) for the unclosed quote; .inf passed and the timer thread died
    (OverflowError), leaving the agent without a timeout."""
    bad = tmp_path / "agents.yaml"
    bad.write_text(f"agents:\n  x: {entry}\n", encoding="utf-8")
    with pytest.raises(agent_runner.InputError, match=expected):
        agent_runner.load_agents(bad)


def test_shipped_agents_file_parses_and_fills_placeholders():
    agents = agent_runner.load_agents(agent_runner.DEFAULT_AGENTS_FILE)
    assert {"claude", "codex"} <= set(agents)
    spec = agent_runner.AgentSpec("t", ("run", "{prompt_file}", "--cap={capability}"))
    assert spec.argv({"prompt_file": "/p.md", "capability": "x"}) == ["run", "/p.md", "--cap=x"]


def test_code_edit_scenarios_check(tmp_path):
    """The artifact is checked with the scenario loader (the format the code-edit prompt asks for)."""
    from swebench.generators import generate_many

    name = "semantic_logic_precision"
    path = tmp_path / "pipeline" / "swebench" / name / "scenarios_parsed.json"
    snapshot = agent_runner.Snapshot([path])
    with pytest.raises(agent_runner.AgentRunError, match="was not written"):
        agent_runner.check_scenarios(path, name, snapshot)
    path.parent.mkdir(parents=True)
    scenarios = [s.to_dict() for s in generate_many(name, 2, seed=0)]
    path.write_text(json.dumps(scenarios), encoding="utf-8")
    assert agent_runner.check_scenarios(path, name, snapshot) == 2
    with pytest.raises(agent_runner.AgentRunError, match="not 'other'"):
        agent_runner.check_scenarios(path, "other", snapshot)
    del scenarios[0]["oracle_patch"]
    path.write_text(json.dumps(scenarios), encoding="utf-8")
    with pytest.raises(agent_runner.AgentRunError, match="scenario 0.*oracle_patch"):
        agent_runner.check_scenarios(path, name, snapshot)
    path.write_text(json.dumps([{"id": "a", "issue": "old format", "fail_to_pass": []}]), encoding="utf-8")
    with pytest.raises(agent_runner.AgentRunError, match="scenario 0"):
        agent_runner.check_scenarios(path, name, snapshot)


def test_launch_closes_the_output_pipe(tmp_path):
    """One agent invocation must not leak its stdout pipe (`--all` runs one per capability)."""
    import gc
    import warnings

    spec = agent_runner.AgentSpec("echo", (sys.executable, "-c", "print('hi')"), stdin=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        code = agent_runner.launch(spec, list(spec.command), cwd=tmp_path, env={}, prompt_text="",
                                   log_path=tmp_path / "logs" / "echo.log", timeout_s=None)
        gc.collect()
    assert code == 0 and "hi" in (tmp_path / "logs" / "echo.log").read_text()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
