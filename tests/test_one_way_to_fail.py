"""One way to check input and to fail (common/validation.py, common/cli.py).

- Every project config refuses a bad value with InputError (so a command prints `error: ...` and exits 2,
  whether the value came from YAML, a flag or Python), not a bare ValueError.
- Every command's `if __name__ == "__main__":` goes through `exit_code` (Ctrl-C: one line, exit 130).
- The error type, the `need` check and the exit statuses are written once.
"""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.cli import INTERRUPTED, cli_entry, exit_code
from common.validation import InputError, check_choices, need

REPO = Path(__file__).resolve().parents[1]


def _configs() -> list[tuple[str, object]]:
    """(name, a call that builds the config with one bad value)."""
    from benchmarks.storefront.config import StorefrontConfig
    from demo.config import LoopSettings
    from game_registry import get_game
    from pipeline.aggregate_capabilities import AggregationConfig
    from pipeline.label_trajectories import LabelingConfig
    from common.llm_client import RetryPolicy
    from pipeline.summarize import SummarizeOptions
    from swebench.game import ScenarioGameConfig
    from swebench.grading import GradeConfig
    from swebench.sandbox import SandboxConfig
    from train.backends import SamplingParams
    from train.config import GRPOConfig
    from train.gate_config import MoEGateConfig, SFTConfig as RouterSFTConfig
    from train.sft import SFTConfig
    from train.tiny import TinyModelConfig

    def game_config(name: str) -> type:  # game files are loaded by the registry (importing them twice registers twice)
        return get_game(f"capability_{name}").config_cls

    return [
        ("GRPOConfig", lambda: GRPOConfig(lora_r=0)),
        ("GRPOConfig.report_to", lambda: GRPOConfig(report_to=["nonesuch"])),
        ("router SFTConfig", lambda: RouterSFTConfig(epochs=0)),
        ("MoEGateConfig", lambda: MoEGateConfig(adapters={})),
        ("train.sft SFTConfig", lambda: SFTConfig(epochs=0)),
        ("TinyModelConfig", lambda: TinyModelConfig(num_layers=0)),
        ("SamplingParams", lambda: SamplingParams(max_new_tokens=0)),
        ("AggregationConfig", lambda: AggregationConfig(rho=2.0)),
        ("LabelingConfig", lambda: LabelingConfig(model="m", runs=0)),
        ("SummarizeOptions", lambda: SummarizeOptions(max_chars=0)),
        ("RetryPolicy", lambda: RetryPolicy(max_retries=-1)),
        ("StorefrontConfig", lambda: StorefrontConfig(forbidden_rate=2.0)),
        ("StorefrontConfig.kind_weights", lambda: StorefrontConfig(kind_weights="cancel=x")),
        ("SandboxConfig", lambda: SandboxConfig(timeout_s=0)),
        ("GradeConfig", lambda: GradeConfig(partial_credit=1.5)),
        ("ScenarioGameConfig", lambda: ScenarioGameConfig(interface="gui")),
        ("LoopSettings", lambda: LoopSettings(iterations=0)),
        ("precondition game", lambda: game_config("precondition_verification")(violating_fraction=1.5)),
        ("precondition game kinds", lambda: game_config("precondition_verification")(request_kinds=["fly"])),
        ("structured-data game", lambda: game_config("structured_data_reasoning")(n_distractor_items=9)),
        ("tool-calling game (the kit's max_steps)", lambda: game_config("tool_calling_precision")(max_steps=0)),
    ]


@pytest.mark.parametrize("name", [name for name, _ in _configs()])
def test_every_config_refuses_a_bad_value_with_input_error(name):
    build = dict(_configs())[name]
    with pytest.raises(InputError) as caught:
        build()
    assert str(caught.value), name  # the message says what is wrong


def test_input_error_is_a_value_error_so_existing_callers_keep_working():
    with pytest.raises(ValueError):
        need(False, "x must be > 0")
    need(True, "never raised")
    assert check_choices("a, b", "kinds", ("a", "b", "c")) == ("a", "b")
    with pytest.raises(InputError, match=r"kinds must be a non-empty list of distinct names"):
        check_choices(["a", "a"], "kinds", ("a", "b"))


def test_cli_entry_turns_input_error_into_one_line_and_2(capsys):
    @cli_entry
    def main(argv=None):
        raise InputError("--n must be >= 1, got 0")

    assert main([]) == 2
    assert capsys.readouterr().err == "error: --n must be >= 1, got 0\n"

    @cli_entry
    def buggy(argv=None):
        raise KeyError("a bug, not bad input")

    with pytest.raises(KeyError):  # anything else is not hidden
        buggy([])


def test_exit_code_turns_ctrl_c_into_one_line_and_130_only_at_the_entry(capsys):
    def main(argv=None):
        raise KeyboardInterrupt

    assert exit_code(main) == INTERRUPTED == 130
    assert capsys.readouterr().err.startswith("interrupted; ")
    with pytest.raises(KeyboardInterrupt):  # in process, the caller stops too
        main([])


# --------------------------------------------------------------------------------------------------
# Every command's entry point
# --------------------------------------------------------------------------------------------------
# Internal runners the sandbox starts with their own protocol (not commands a person types).
INTERNAL = {"swebench/_sandbox_boot.py", "swebench/_sandbox_runner.py"}


def _main_guard(tree: ast.Module) -> ast.If | None:
    for node in tree.body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
            return node
    return None


def entry_points_without_exit_code(planted: dict[str, str] | None = None) -> list[str]:
    """Files whose `if __name__ == "__main__":` calls `main` other than through `exit_code(main)`."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    problems = []
    for path in files:
        if path.startswith("tests/") or path in INTERNAL:
            continue
        text = (REPO / path).read_text() + (planted or {}).get(path, "")
        guard = _main_guard(ast.parse(text))
        if guard is None:
            continue
        calls = [n for n in ast.walk(guard) if isinstance(n, ast.Call)]
        calls_main = any(isinstance(c.func, ast.Name) and c.func.id == "main" for c in calls)
        through_exit_code = any(isinstance(c.func, ast.Name) and c.func.id == "exit_code" for c in calls)
        if calls_main and not through_exit_code:
            problems.append(path)
    return problems


def test_every_command_ends_through_exit_code():
    assert entry_points_without_exit_code() == []


def test_a_command_that_calls_main_directly_is_found():
    planted = {"pipeline/probes.py": "\n\nif __name__ == '__main__':\n    sys.exit(main())\n"}
    assert entry_points_without_exit_code(planted) == ["pipeline/probes.py"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe")
def test_ctrl_c_in_a_command_that_catches_nothing_is_one_line_and_130(tmp_path):
    """pipeline._summarize has no KeyboardInterrupt handler of its own: exit_code is what makes a Ctrl-C one line.
    Its input is a named pipe the test holds open without writing, so the command waits inside `main` (not in
    its imports) when the signal arrives."""
    pipe = tmp_path / "results.json"
    os.mkfifo(pipe)
    child = subprocess.Popen([sys.executable, "-m", "pipeline._summarize", str(pipe), "--out",
                              str(tmp_path / "out.json")], cwd=REPO, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None:  # opening the write end succeeds once the command has opened the read end
            try:
                writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise AssertionError(f"the command never opened its input: {child.poll()}")
                time.sleep(0.05)
        time.sleep(0.2)  # from open() into read()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        child.kill()
    assert child.returncode == 130, err
    assert "Traceback" not in err and err == "interrupted; nothing was saved by this run\n", err
    assert not (tmp_path / "out.json").exists()


INTERRUPTED_EXEC = """
import os, signal, sys
from common.cli import exit_code

def main(argv=None):
    {call}
    return 0

sys.exit(exit_code(main))
"""


@pytest.mark.parametrize("call", [
    # a Ctrl-C inside exec() of a string: CPython marks it unhandled for good (and kills a `python -m` run with
    # SIGINT at exit), though exit_code handled it
    "exec('import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(1)')",
    # the SWE-bench generators' in-memory evaluation, interrupted in its imports (compiled: no such mark)
    "from swebench._inmemory import InMemoryPackages\n"
    "    with InMemoryPackages({}) as packages:\n"
    "        packages.evaluate('0', 'import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(1)')",
])
def test_a_ctrl_c_inside_exec_of_a_string_still_ends_python_m_with_130(call, tmp_path):
    (tmp_path / "interrupted_exec.py").write_text(INTERRUPTED_EXEC.format(call=call))
    child = subprocess.run([sys.executable, "-m", "interrupted_exec"], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert child.returncode == 130, (child.returncode, child.stderr)  # not -2: killed by its own SIGINT
    assert child.stderr == "interrupted; nothing was saved by this run\n"


def test_the_error_type_and_the_exit_statuses_are_written_once():
    """No module defines its own InputError, need() helper or exit status 130."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    copies = []
    for path in files:
        if path.startswith("tests/") or path.startswith("common/"):
            continue
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "InputError":
                copies.append(f"{path}: class InputError")
            if isinstance(node, ast.FunctionDef) and node.name in ("need", "_need"):
                copies.append(f"{path}: def {node.name}")
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value == 130
                    and any(isinstance(t, ast.Name) and "INTERRUPT" in t.id for t in node.targets)):
                copies.append(f"{path}: its own exit status 130")
    assert copies == []
