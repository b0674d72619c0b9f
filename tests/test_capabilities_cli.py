"""The capability work queue (pipeline/capabilities.py): next / mark / list."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.capabilities import main

ROOT = Path(__file__).resolve().parent.parent
SELECTED = [
    {"skill": "alpha", "description": "first line of work", "mean_delta": 0.5, "status": "PENDING",
     "environment_path": "kept/as/is.json"},
    {"skill": "beta", "description": "highest gap", "mean_delta": 0.8, "status": "DONE"},
    {"skill": "gamma", "description": "second best", "mean_delta": 0.7, "status": "PENDING"},
]


@pytest.fixture
def selected_file(tmp_path) -> Path:
    path = tmp_path / "selected_capabilities.json"
    path.write_text(json.dumps(SELECTED))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.capabilities", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_next_mark_list_end_to_end(selected_file):
    # beta has the highest mean Δ but is DONE; among PENDING, gamma (0.7) beats alpha (0.5).
    result = _cli("next", "--file", str(selected_file))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["gamma", "second best"]

    assert _cli("mark", "gamma", "in_progress", "--file", str(selected_file)).returncode == 0
    saved = json.loads(selected_file.read_text())
    assert [entry["status"] for entry in saved] == ["PENDING", "DONE", "IN_PROGRESS"]
    assert saved[0]["environment_path"] == "kept/as/is.json"  # other keys survive the rewrite

    result = _cli("next", "--file", str(selected_file), "--json")
    assert json.loads(result.stdout)["skill"] == "alpha"

    listing = _cli("list", "--file", str(selected_file)).stdout.splitlines()
    assert [line.split()[-1] for line in listing] == ["alpha", "beta", "gamma"]
    assert listing[2].split()[0] == "IN_PROGRESS"


def test_next_exits_1_when_nothing_pending(selected_file, capsys):
    assert main(["mark", "alpha", "DONE", "--file", str(selected_file)]) == 0
    assert main(["mark", "gamma", "DONE", "--file", str(selected_file)]) == 0
    capsys.readouterr()
    assert main(["next", "--file", str(selected_file)]) == 1
    assert "no PENDING capability" in capsys.readouterr().err


@pytest.mark.parametrize("args, fragment", [
    (["mark", "delta", "DONE"], "unknown capability 'delta'"),
    (["mark", "alpha", "FINISHED"], "unknown status 'FINISHED'"),
])
def test_mark_bad_input_exits_2_and_leaves_file(selected_file, capsys, args, fragment):
    before = selected_file.read_text()
    assert main([*args, "--file", str(selected_file)]) == 2
    assert fragment in capsys.readouterr().err
    assert selected_file.read_text() == before


@pytest.mark.parametrize("content, fragment", [
    ("[", "broken JSON"),
    ('{"skill": "x"}', "expected a JSON list"),
    ('[{"skill": "x", "mean_delta": 0.1, "status": "WAITING"}]', "has status 'WAITING'"),
    ('[{"skill": "x", "status": "PENDING"}]', "needs a numeric 'mean_delta'"),
])
def test_broken_file_exits_2(tmp_path, capsys, content, fragment):
    path = tmp_path / "selected.json"
    path.write_text(content)
    assert main(["next", "--file", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and fragment in err


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["list", "--file", str(tmp_path / "nope.json")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_file_before_the_command_or_from_the_environment(selected_file, tmp_path, monkeypatch, capsys):
    """Each benchmark has its own list: the file can be given before the command, or once per shell."""
    assert main(["--file", str(selected_file), "next"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "gamma"
    monkeypatch.setenv("TRACE_SELECTED", str(selected_file))
    assert main(["mark", "alpha", "DONE"]) == 0
    assert [e["status"] for e in json.loads(selected_file.read_text())] == ["DONE", "DONE", "PENDING"]
    other = tmp_path / "other.json"
    assert main(["--file", str(selected_file), "next", "--file", str(other)]) == 2
    assert "two different --file values" in capsys.readouterr().err
