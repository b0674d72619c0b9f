"""The pytest sandbox, the self-test and grading: hostile scenarios are stopped and score 0."""
from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import pytest

from game_registry import REPO_ROOT
from swebench import sandbox
from swebench.generators import GENERATORS, generate_one
from swebench.generators.semantic_logic import TEMPLATES
from swebench.grading import Grader, GradeConfig, screen_patch
from swebench.patches import apply_patch, make_patch
from swebench.sandbox import SandboxConfig, SandboxUnavailable, SandboxWarning, run_pytest
from swebench.scenario import Scenario, save_scenarios
from swebench.selftest import main as selftest_main
from swebench.selftest import self_test, self_test_many

NAMESPACES, WHY_NOT = sandbox.namespace_support()
# Where the sandbox is required (`.ci/run` sets TRACE_REQUIRE_SANDBOX=1) these tests run, and fail, without it.
needs_namespaces = pytest.mark.skipif(not NAMESPACES and not sandbox.sandbox_required(),
                                      reason=f"namespace sandbox unavailable here: {WHY_NOT}")
FAST = SandboxConfig(timeout_s=3.0, cpu_s=5)
# Hostile code only ever runs with namespaces: as root, the fallback would let it write where root can.
NS = SandboxConfig(timeout_s=3.0, cpu_s=5, isolation="namespace")


def scenario_with_target(target_body: str, regression: str = "") -> Scenario:
    """A valid scenario: value() returns 1, the fix makes it 2; the target test runs `target_body` first."""
    files = {"pkg/__init__.py": "", "pkg/core.py": "def value():\n    return 1\n",
             "tests/test_core.py": ("import os\nimport socket\nfrom pkg.core import value\n\n\n"
                                    f"def test_target():\n{target_body}\n    assert value() == 2\n\n\n"
                                    "def test_one():\n    assert 1 + 1 == 2\n\n\n"
                                    "def test_two():\n    assert 'a' < 'b'\n\n\n"
                                    f"def test_three():\n    assert value() >= 1\n{regression}")}
    fixed = {**files, "pkg/core.py": "def value():\n    return 2\n"}
    return Scenario(id=f"hostile_{uuid.uuid4().hex[:8]}", capability="semantic_logic_precision", seed=0, files=files,
                    test_files=["tests/test_core.py"], target_test="tests/test_core.py::test_target",
                    oracle_patch=make_patch(files, fixed), problem_statement="value() should be 2")


@pytest.fixture()
def host_dir():
    """A world-writable folder on the host, outside /tmp (the sandbox must not write into it)."""
    base = REPO_ROOT / ".cache"
    base.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="hostile-", dir=base))
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture()
def listener():
    """A TCP server on the host's loopback: the sandboxed tests must not reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    yield server
    server.close()


def connected(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except (socket.timeout, BlockingIOError):
        return False
    conn.close()
    return True


def fixed_grade(scenario: Scenario, config: SandboxConfig = FAST) -> float:
    return Grader(scenario, GradeConfig(sandbox=config, cache_size=0)).grade(scenario.fixed_files()).reward


# --------------------------------------------------------------------------------------------------
# Hostile scenarios (namespace sandbox)
# --------------------------------------------------------------------------------------------------
@needs_namespaces
def test_a_scenario_that_writes_outside_is_stopped_and_scores_zero(host_dir):
    tmp_name = f"/tmp/trace-hostile-{uuid.uuid4().hex}"
    body = (f"    open({str(host_dir / 'pwned.txt')!r}, 'w').write('x')\n"
            f"    open({tmp_name!r}, 'w').write('x')\n"
            f"    open(os.path.expanduser('~') + '/../../escape.txt', 'w').write('x')")
    scenario = scenario_with_target(body)
    result = self_test(scenario, NS)
    assert not result.ok and "target_not_passing_after" in result.reason
    assert fixed_grade(scenario, NS) == 0.0
    assert list(host_dir.iterdir()) == [] and not os.path.exists(tmp_name)
    # the writable /tmp inside the sandbox is private: it vanishes with the run
    probe = scenario_with_target(f"    open({tmp_name!r}, 'w').write('x')\n    assert os.path.exists({tmp_name!r})")
    assert run_pytest(probe.fixed_files(), NS).passed(probe.target_test)
    assert not os.path.exists(tmp_name)


@needs_namespaces
def test_a_scenario_that_opens_a_socket_is_stopped_and_scores_zero(listener):
    port = listener.getsockname()[1]
    scenario = scenario_with_target(f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()")
    result = self_test(scenario, NS)
    assert not result.ok and "target_not_passing_after" in result.reason
    assert fixed_grade(scenario, NS) == 0.0
    assert not connected(listener)


@needs_namespaces
def test_the_sandbox_drops_privileges_and_hides_the_host():
    body = ("    assert os.getuid() != 0\n"
            "    assert len([p for p in os.listdir('/proc') if p.isdigit()]) < 10\n"  # own PID namespace
            "    assert 'PATH' in os.environ and not any('PROXY' in k.upper() for k in os.environ)\n"
            "    try:\n        open('/proc/sys/kernel/hostname', 'w').write('x')\n    except OSError:\n        pass\n"
            "    else:\n        raise AssertionError('the hostname was writable')")
    scenario = scenario_with_target(body)
    assert fixed_grade(scenario, NS) == 1.0


@pytest.mark.slow  # ~8 s of waiting on the time limit; test_swebench_bash_interface kills a command past its time
def test_an_endless_loop_is_stopped_and_scores_zero():
    scenario = scenario_with_target("    while True:\n        pass")
    for isolation in (["namespace"] if NAMESPACES else []) + ["fallback"]:
        config = SandboxConfig(timeout_s=1.0, cpu_s=5, isolation=isolation, allow_unisolated=True)
        started = time.perf_counter()
        result = self_test(scenario, config)
        assert not result.ok and "timed out" in result.reason, isolation
        if isolation == "namespace":
            assert fixed_grade(scenario, config) == 0.0
        assert time.perf_counter() - started < 10, f"{isolation}: the loop was not stopped in time"


def test_memory_and_output_limits_hold():
    body = "    block = bytearray(2 * 1024 ** 3)\n    print('x' * 10 ** 7)"
    scenario = scenario_with_target(body)
    run = run_pytest(scenario.fixed_files(), SandboxConfig(timeout_s=5.0, memory_mb=512))
    assert run.outcome(scenario.target_test) == "failed" and run.passed("tests/test_core.py::test_one")
    assert len(run.output_tail) <= SandboxConfig().output_chars


def test_the_run_is_unharmed_after_hostile_scenarios():
    """After the hostile scenarios above, ordinary scenarios still pass, in this same process."""
    scenario = generate_one("semantic_logic_precision", 3)
    assert self_test(scenario, SandboxConfig(timeout_s=20)).ok
    assert fixed_grade(scenario, SandboxConfig(timeout_s=20)) == 1.0


# --------------------------------------------------------------------------------------------------
# Fallback and its warning
# --------------------------------------------------------------------------------------------------
def test_fallback_blocks_sockets_and_cleans_the_environment(listener, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-tests")
    port = listener.getsockname()[1]
    body = ("    assert not [k for k in os.environ if 'PROXY' in k.upper() or 'KEY' in k.upper()]\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()")
    scenario = scenario_with_target(body)
    run = run_pytest(scenario.fixed_files(), SandboxConfig(timeout_s=10, isolation="fallback", allow_unisolated=True))
    assert run.isolation == "fallback"
    assert run.outcome(scenario.target_test) == "failed" and "disabled in the TRACE scenario sandbox" in run.output_tail
    assert not connected(listener)


@needs_namespaces
def test_a_venv_reached_through_a_symlink_runs_scenarios(tmp_path):
    # A `.venv` that is a symlink to a venv elsewhere: here a link under /tmp, which the sandbox replaces by a
    # private tmpfs, so the interpreter's own name is hidden inside; it used to fail every scenario with
    # "namespaces are refused here (FileNotFoundError)".
    link = tmp_path / "venv-link"
    link.symlink_to(Path(sys.prefix).resolve())
    python = link / "bin" / Path(sys.executable).name
    script = """
import sys
from swebench import sandbox
ok, why = sandbox.namespace_support()
assert ok, why
run = sandbox.run_pytest({"test_a.py": "def test_a():\\n    assert 1 + 1 == 2\\n"},
                         sandbox.SandboxConfig(timeout_s=20, isolation="namespace"))
print(sys.executable, run.isolation, run.outcome("test_a.py::test_a"))
"""
    done = subprocess.run([str(python), "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(python), "namespace", "passed"]


@needs_namespaces
def test_an_interpreter_the_sandbox_cannot_show_is_named_not_blamed_on_namespaces(tmp_path, monkeypatch):
    hidden = tmp_path / "python"  # under /tmp: a private tmpfs inside the sandbox, so this name is not there
    hidden.symlink_to(sys.executable)
    monkeypatch.setattr(sandbox, "sandbox_interpreter", lambda: str(hidden))
    sandbox.namespace_support.cache_clear()
    try:
        ok, why = sandbox.namespace_support()
    finally:
        sandbox.namespace_support.cache_clear()
    assert not ok
    assert "cannot run inside it" in why and str(hidden) in why and "refused" not in why


def test_the_sandbox_is_required_where_ci_asks_for_it():
    # `.ci/run` sets TRACE_REQUIRE_SANDBOX=1: there a machine without namespaces fails here instead of skipping
    # the tampering and isolation tests silently.
    if sandbox.sandbox_required():
        assert NAMESPACES, f"TRACE_REQUIRE_SANDBOX=1 but the namespace sandbox does not work: {WHY_NOT}"


def test_missing_namespaces_are_refused_or_announced(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "namespace_support", lambda: (False, "no unshare in this test"))
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="no unshare in this test.*never falls back"):
        sandbox.resolve_isolation("namespace")
    for requested in ("auto", "fallback"):  # no opt-in: refused, saying what is missing and the flag
        with pytest.raises(SandboxUnavailable, match="unshare.*--unsafe-no-isolation"):
            sandbox.resolve_isolation(requested)
    monkeypatch.setattr(sandbox, "_warned", type(sandbox._warned)())
    with pytest.warns(SandboxWarning, match="SANDBOX FALLBACK.*no unshare"):
        assert sandbox.resolve_isolation("auto", allow_unisolated=True) == "fallback"
    assert "WITHOUT mount/network namespaces" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not on every run
        assert sandbox.resolve_isolation("auto", allow_unisolated=True) == "fallback"


def test_sandbox_config_validates():
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="isolation must be"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="memory_mb must be >= 128"):
        SandboxConfig(memory_mb=64)


# --------------------------------------------------------------------------------------------------
# Self-test of generated scenarios, grading, the CLI
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~5 s: the self-test of 14 generated scenarios in the sandbox (make test stays under 5 minutes)
def test_generated_scenarios_pass_the_self_test():
    scenarios = [generate_one("semantic_logic_precision", seed, template=t.key) for seed, t in enumerate(TEMPLATES)]
    scenarios += [generate_one("deep_call_graph_traversal", seed, call_depth=3 + seed % 3) for seed in range(4)]
    results = self_test_many(scenarios, SandboxConfig(timeout_s=20), workers=2, progress=False)
    assert [(r.scenario_id, r.reason) for r in results if not r.ok] == []


def _with_test_files(scenario: Scenario, files: dict[str, str]) -> Scenario:
    return Scenario.from_dict({**scenario.to_dict(), "files": {**scenario.files, **files}})


def _test_functions(source: str, keep) -> str:
    """`source` (a test module) with its imports, its helpers and only the test functions `keep(name)` accepts."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not isinstance(node, ast.FunctionDef)
                 or not node.name.startswith("test_") or keep(node.name)]
    return ast.unparse(tree) + "\n"


def _names_of_tests(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def test_the_self_test_drops_hidden_tests_that_a_hard_coded_example_passes():
    """Hidden tests that only repeat the visible example would reward hard-coding it: the shortcut patch (the
    example's expected value returned for its arguments) must fail some hidden test."""
    scenario = generate_one("semantic_logic_precision", 0, template="tiered_tariff", size="small")
    assert self_test(scenario, SandboxConfig(timeout_s=20)).ok
    visible, hidden = scenario.test_files[0], scenario.hidden_test_files()[0]
    target = scenario.target_test.split("::")[1]
    copy = _test_functions(scenario.files[visible], lambda name: name == target)
    weak = _with_test_files(scenario, {hidden: copy.replace(f"def {target}(", "def test_the_example_again(")})
    result = self_test(weak, SandboxConfig(timeout_s=20))
    assert not result.ok and result.reason.startswith("hidden_tests_miss_the_shortcut"), result.reason


def test_the_self_test_drops_a_scenario_with_too_few_regression_tests():
    """Without regression tests an over-broad edit (one that breaks neighbouring behaviour) would score 1."""
    scenario = generate_one("semantic_logic_precision", 0, template="tiered_tariff", size="small")
    visible = scenario.test_files[0]
    target = scenario.target_test.split("::")[1]
    regression = [n for n in _names_of_tests(scenario.files[visible]) if n != target]
    assert len(regression) >= 3
    for kept in (0, 2):
        thin = _with_test_files(scenario, {visible: _test_functions(
            scenario.files[visible], lambda name: name == target or name in regression[:kept])})
        result = self_test(thin, SandboxConfig(timeout_s=20))
        assert not result.ok and result.reason == f"too_few_regression_tests: {kept} < 3", result.reason
    enough = _with_test_files(scenario, {visible: _test_functions(
        scenario.files[visible], lambda name: name == target or name in regression[:3])})
    assert self_test(enough, SandboxConfig(timeout_s=20)).ok


@pytest.mark.slow
@pytest.mark.parametrize("capability", sorted(GENERATORS))
def test_many_generated_scenarios_pass_the_self_test(capability):
    scenarios = [generate_one(capability, seed) for seed in range(40)]
    results = self_test_many(scenarios, SandboxConfig(timeout_s=30), workers=2, progress=False)
    assert [(r.scenario_id, r.reason) for r in results if not r.ok] == []


def test_grading_rules():
    scenario = generate_one("deep_call_graph_traversal", 11)
    grader = Grader(scenario, GradeConfig(sandbox=SandboxConfig(timeout_s=20), cache_size=0))
    assert grader.grade(scenario.files).reward == 0.0  # no-op
    assert grader.grade(scenario.fixed_files()).reward == 1.0
    shortcut = grader.grade(apply_patch(scenario.files, scenario.metadata["shortcut_patch"]))
    assert shortcut.target == "passed" and shortcut.reward == 0.0 and "hidden" in shortcut.detail
    # editing the test instead of the code: the scenario's own tests are graded
    path, _, name = scenario.target_test.partition("::")
    edited = {**scenario.files, path: scenario.files[path].replace(f"def {name}():", f"def {name}():\n    return")}
    assert grader.grade(edited).reward == 0.0
    # deleting the failing test: same
    deleted = {p: t for p, t in scenario.files.items() if p != path}
    assert grader.grade(deleted).reward == 0.0
    # without hidden tests to catch it, the restored test files alone must stop a test edit
    bare = scenario_with_target("    pass")
    bare_grader = Grader(bare, GradeConfig(sandbox=SandboxConfig(timeout_s=20), cache_size=0))
    cheat = {**bare.files, "tests/test_core.py": bare.files["tests/test_core.py"].replace(
        "def test_target():\n", "def test_target():\n    return\n")}
    assert bare_grader.grade(cheat).reward == 0.0 and bare_grader.grade(bare.fixed_files()).reward == 1.0


def test_partial_credit_when_regressions_break():
    scenario = generate_one("semantic_logic_precision", 2, template="leap_years")
    fixed = scenario.fixed_files()
    calendar = next(p for p in fixed if p.endswith("calendar.py"))
    broken = {**fixed, calendar: fixed[calendar].replace("return 366 if is_leap(year) else 365",
                                                         "return 366 if is_leap(year) else 364")}
    strict = Grader(scenario, GradeConfig(sandbox=SandboxConfig(timeout_s=20), cache_size=0)).grade(broken)
    lenient = Grader(scenario, GradeConfig(partial_credit=0.5, sandbox=SandboxConfig(timeout_s=20),
                                           cache_size=0)).grade(broken)
    assert strict.target == "passed" and strict.reward == 0.0
    assert 0.0 < lenient.reward < 0.5 and lenient.regression_passed == lenient.regression_total - 1
    with pytest.raises(ValueError, match="partial_credit must be a number in \\[0, 1\\)"):
        GradeConfig(partial_credit=1.0)


def test_tampering_patches_are_refused_without_a_run():
    original = {"pkg/core.py": "import math\n\n\ndef value():\n    return 1\n"}
    assert screen_patch(original, {"pkg/core.py": "import math\n\n\ndef value():\n    return 2\n"}) is None
    assert screen_patch(original, {"pkg/core.py": "import math\nimport fractions\n\n\ndef value():\n    return 2\n"}) is None
    assert screen_patch(original, {"pkg/core.py": "def value():\n    '''open the os.system door'''\n    return 2\n"}) is None
    for bad in ("import os\n", "import subprocess as s\n", "from _pytest import runner\n", "x = open('f')\n",
                "y = value.__globals__\n", "z = __import__('os')\n", "import sys\n"):
        assert screen_patch(original, {"pkg/core.py": original["pkg/core.py"] + bad}) is not None, bad


def test_selftest_cli_keeps_the_good_and_drops_the_bad_with_the_reason(tmp_path, capsys):
    good = [generate_one("semantic_logic_precision", 40), generate_one("deep_call_graph_traversal", 40)]
    data = good[0].to_dict()
    data["id"] = "broken_0001"
    fixed = good[0].fixed_files()
    data["files"] = {**fixed, **{p: good[0].files[p] for p in good[0].all_test_files()}}  # already fixed: nothing fails
    data["oracle_patch"] = make_patch(data["files"], {**data["files"], **{
        p: t + "\n" for p, t in data["files"].items() if p.endswith("__init__.py")}})
    broken = Scenario.from_dict(data)
    source = tmp_path / "in.json"
    save_scenarios(source, [good[0], broken, good[1]])
    out, report = tmp_path / "kept.json", tmp_path / "report.json"
    code = selftest_main([str(source), "--out", str(out), "--report", str(report), "--no-progress", "--timeout", "20"])
    printed = capsys.readouterr().out
    assert code == 1
    assert "DROPPED broken_0001" in printed and "target_not_failing_before: passed" in printed
    assert [s["id"] for s in json.loads(out.read_text())] == [good[0].id, good[1].id]
    assert json.loads(report.read_text())["dropped"] == {"broken_0001": "target_not_failing_before: passed"}
    assert selftest_main([str(tmp_path / "missing.json")]) == 2
    assert "not found" in capsys.readouterr().err
