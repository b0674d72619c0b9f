"""Issue 26 point 5: scenario code never runs unisolated without an explicit opt-in, and the namespace
sandbox leaves only the scenario folder (and its private scratch tmpfs) writable."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from game_registry import REPO_ROOT
from swebench import sandbox
from swebench.calibrate import main as calibrate_main
from swebench.game import ScenarioGame, SemanticLogicGameConfig
from swebench.generators import generate_one
from swebench.sandbox import PLUGIN_DIR, SandboxConfig, SandboxUnavailable, SandboxWarning, run_pytest
from swebench.scenario import save_scenarios
from swebench.selftest import main as selftest_main

NAMESPACES, WHY_NOT = sandbox.namespace_support()
# Where the sandbox is required (`.ci/run` sets TRACE_REQUIRE_SANDBOX=1) these tests run, and fail, without it.
needs_namespaces = pytest.mark.skipif(not NAMESPACES and not sandbox.sandbox_required(),
                                      reason=f"namespace sandbox unavailable here: {WHY_NOT}")
BENIGN = {"tests/test_ok.py": "def test_ok():\n    assert 1 + 1 == 2\n"}


@pytest.fixture()
def no_namespaces(monkeypatch):
    """This machine as one without namespaces, no opt-in in the environment, the warning not given yet."""
    monkeypatch.setattr(sandbox, "namespace_support", lambda: (False, "unshare is refused in this test"))
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_warned", type(sandbox._warned)())


# --------------------------------------------------------------------------------------------------
# Namespace mode: everything but the scenario folder is read-only
# --------------------------------------------------------------------------------------------------
@pytest.fixture()
def open_folders():
    """A world-writable folder inside the interpreter's installation, its bin folder, the venv and the sandbox
    plugin folder (the folders the sandbox binds in): only the mount may stop a write there."""
    places = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), str(PLUGIN_DIR)}
    made = []
    try:
        for place in sorted(os.path.realpath(p) for p in places):
            folder = Path(place) / f"_trace_rw_probe_{uuid.uuid4().hex[:8]}"
            folder.mkdir()
            made.append(folder)
            os.chmod(folder, 0o777)
        yield made
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


@needs_namespaces
def test_the_interpreter_venv_and_plugin_folders_are_read_only_inside(open_folders):
    body = ["import errno, os\n\n", "def test_writes():\n", "    refused = []\n"]
    for folder in open_folders:
        body.append(f"    try:\n        open({str(folder / 'planted.py')!r}, 'w').write('x = 1')\n"
                    "    except OSError as err:\n        refused.append(err.errno)\n")
    body.append(f"    assert refused == [errno.EROFS] * {len(open_folders)}, refused\n")
    # the scenario folder and the private /tmp stay writable
    body.append("    open('scratch.txt', 'w').write('ok')\n    open('/tmp/scratch.txt', 'w').write('ok')\n")
    tree = {"tests/test_rw.py": "".join(body)}
    run = run_pytest(tree, SandboxConfig(timeout_s=20, isolation="namespace"))
    assert run.isolation == "namespace"
    assert run.outcome("tests/test_rw.py::test_writes") == "passed", run.output_tail
    for folder in open_folders:
        assert list(folder.iterdir()) == [], f"a file written in the sandbox persisted in {folder}"


@needs_namespaces
def test_the_hosts_other_mounts_are_read_only_inside():
    """/dev, /sys and /proc (and the root file system) are remounted read-only too (a mount point listed
    again later is shadowed by the later mount: the last entry is the one reachable)."""
    body = ("import errno, os\n\n\ndef test_mounts():\n"
            "    flags = {}\n"
            "    for line in open('/proc/self/mountinfo'):\n"
            "        fields = line.split()\n"
            "        if os.path.exists(fields[4]):\n"
            "            flags[fields[4]] = fields[5].split(',')\n"
            "    writable = sorted(p for p, f in flags.items() if 'rw' in f)\n"
            "    cwd = os.getcwd()\n"
            "    allowed = {'/tmp', '/var/tmp', '/dev/shm'}\n"
            "    assert [p for p in writable if p not in allowed and not cwd.startswith(p)] == [], writable\n")
    run = run_pytest({"tests/test_m.py": body}, SandboxConfig(timeout_s=20, isolation="namespace"))
    assert run.outcome("tests/test_m.py::test_mounts") == "passed", run.output_tail


# --------------------------------------------------------------------------------------------------
# No namespaces: refused without the opt-in, runs and warns with it
# --------------------------------------------------------------------------------------------------
def test_without_namespaces_nothing_runs_without_the_opt_in(no_namespaces, tmp_path, capsys):
    for config in (SandboxConfig(timeout_s=5), SandboxConfig(timeout_s=5, isolation="fallback")):
        with pytest.raises(SandboxUnavailable) as caught:
            run_pytest(BENIGN, config)
        message = str(caught.value)
        assert "--unsafe-no-isolation" in message and "unshare" in message, message
    with pytest.raises(SandboxUnavailable, match="unshare is refused in this test.*--unsafe-no-isolation"):
        run_pytest(BENIGN, SandboxConfig(timeout_s=5))
    with pytest.raises(SandboxUnavailable, match="--unsafe-no-isolation"):
        ScenarioGame(SemanticLogicGameConfig())  # train / validate_game: refused before any episode
    scenarios = tmp_path / "s.json"
    save_scenarios(scenarios, [generate_one("semantic_logic_precision", 1)])
    out = tmp_path / "kept.json"
    assert selftest_main([str(scenarios), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unshare is refused in this test" in err and "--unsafe-no-isolation" in err and not out.exists()
    # calibrate refuses before it loads a model
    assert calibrate_main(["--capability", "semantic_logic_precision", "--model", str(tmp_path / "no-model"),
                           "--work-dir", str(tmp_path / "cal"), "--out", str(tmp_path / "cal.json")]) == 2
    assert "--unsafe-no-isolation" in capsys.readouterr().err


def test_without_namespaces_the_opt_in_runs_and_warns(no_namespaces, tmp_path, capsys, monkeypatch):
    with pytest.warns(SandboxWarning, match="SANDBOX FALLBACK"):
        run = run_pytest(BENIGN, SandboxConfig(timeout_s=20, allow_unisolated=True))
    assert run.isolation == "fallback" and run.passed("tests/test_ok.py::test_ok")
    assert "WITHOUT mount/network namespaces" in capsys.readouterr().err
    # the CLI flag
    scenarios = tmp_path / "s.json"
    save_scenarios(scenarios, [generate_one("semantic_logic_precision", 1)])
    assert selftest_main([str(scenarios), "--no-progress", "--timeout", "20", "--unsafe-no-isolation"]) == 0
    assert "isolation: fallback" in capsys.readouterr().out
    # the game's override, and the environment variable for tools that start others
    game = ScenarioGame(SemanticLogicGameConfig(allow_unisolated=True))
    game.reset(1)
    assert game.workspace.grader.grade(game.workspace.scenario.fixed_files()).reward == 1.0
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    assert run_pytest(BENIGN, SandboxConfig(timeout_s=20)).isolation == "fallback"


def test_the_bench_refuses_without_namespaces_and_the_flag():
    """bench/scenario_selftest.py: the flag is accepted; where namespaces are missing, it is required."""
    env = {k: v for k, v in os.environ.items() if k != sandbox.UNSAFE_ENV}
    done = subprocess.run([sys.executable, "bench/scenario_selftest.py", "--n", "2", "--target", "0",
                           "--unsafe-no-isolation"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    if not NAMESPACES:
        refused = subprocess.run([sys.executable, "bench/scenario_selftest.py", "--n", "2"], cwd=REPO_ROOT,
                                 capture_output=True, text=True, timeout=120, env=env)
        assert refused.returncode == 2 and "--unsafe-no-isolation" in refused.stderr


def test_the_opt_in_is_a_bool():
    with pytest.raises(ValueError, match="allow_unisolated must be true or false"):
        SandboxConfig(allow_unisolated="yes")


@needs_namespaces
def test_the_repository_is_hidden_from_sandboxed_code():
    """The scenario files (with their oracle patches and hidden tests) and the generators are out of sight: of
    the repository only the venv and the sandbox plugins are visible inside."""
    from swebench.sandbox import run_command

    run = run_command({}, f"ls {REPO_ROOT}/swebench; cat {REPO_ROOT}/README.md",
                      SandboxConfig(timeout_s=20, isolation="namespace"))
    assert run.output.split("\n")[0] == "_sandbox_plugins", run.output
    assert "No such file or directory" in run.output and run.returncode != 0
