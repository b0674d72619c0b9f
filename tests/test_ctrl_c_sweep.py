"""Ctrl-C in the middle of every long step that has no test of its own (issue 45 point 5): a real SIGINT to the
command's process once its work is under way. Each ends at once with exit 130 and one `interrupted; ...` line,
no traceback, and leaves no half-written file: no output file (the commands here write theirs at the end), no
temporary file or staging folder. (train, grpo_gater, router SFT, SFT, the demo, the storefront runner and the
labeler are interrupted in tests/test_resume_and_interrupts.py, test_cli_bad_input.py, test_label_trajectories.py.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from signals import restore_sigint

REPO = Path(__file__).resolve().parent.parent
STARTED_WITHIN = 120  # seconds for the command to get past its imports into its work
ENDED_WITHIN = 30  # seconds from the SIGINT to the exit ("at once": no long step finished first)
BUSY_SECONDS = 8.0  # CPU seconds of the child before the SIGINT: past its imports, into its work


def _commands(tmp_path: Path, tiny_model_dir: Path) -> dict[str, list[str]]:
    out = tmp_path / "out" / "result.json"
    return {
        "train.evaluate": ["-m", "train.evaluate", "--model", str(tiny_model_dir), "--tasks", "400", "--samples", "2",
                           "--out", str(out)],
        "train.collect_rollouts": ["-m", "train.collect_rollouts", "--game", "storefront", "--model",
                                   str(tiny_model_dir), "--seeds", "400", "--samples", "4", "--out", str(out)],
        "validate_game": ["-m", "pipeline.validate_game", "capability_precondition_verification", "--seeds", "20000",
                          "--json-output", str(out)],
        "storefront.demos": ["-m", "benchmarks.storefront.demos", "--n", "500000", "--out", str(out)],
        "swebench.generate": ["-m", "swebench.generate", "--capability", "semantic_logic_precision", "--n", "100000",
                              "--out", str(out)],
    }


def _leftovers(folder: Path) -> list[str]:
    """Files or folders a killed write leaves: temporary files (`.<name>.*.tmp`) and staging folders (`.*`)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*") if p.name != ".run.lock")


@pytest.mark.slow  # ~1 min: five real processes, each interrupted after its imports
@pytest.mark.parametrize("name", ["train.evaluate", "train.collect_rollouts", "validate_game", "storefront.demos",
                                  "swebench.generate"])
def test_ctrl_c_in_a_long_step_exits_130_with_one_line_and_no_half_written_file(name, tmp_path, tiny_model_dir):
    argv = _commands(tmp_path, tiny_model_dir)[name]
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr_file:
        process = subprocess.Popen([sys.executable, *argv], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=stderr_file, env={**os.environ, "PYTHONPATH": str(REPO)},
                                   preexec_fn=restore_sigint)
        deadline = time.monotonic() + STARTED_WITHIN
        while process.poll() is None and time.monotonic() < deadline and _cpu_seconds(process.pid) < BUSY_SECONDS:
            time.sleep(0.2)
        assert process.poll() is None, f"{name} ended before it was interrupted: {log.read_text()[-1500:]}"
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        process.wait(timeout=ENDED_WITHIN + 30)
    stderr = log.read_text()
    assert process.returncode == 130, stderr[-2000:]
    assert time.monotonic() - sent < ENDED_WITHIN
    assert "Traceback" not in stderr and stderr.count("interrupted") == 1, stderr[-2000:]
    out = tmp_path / "out"
    assert not (out / "result.json").exists()
    assert _leftovers(tmp_path) == [], "half-written files left"


def _cpu_seconds(pid: int) -> float:
    """CPU seconds the process has used (Linux /proc; its imports take ~3-4 s of them)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # it has ended (the caller sees that)
        return float("inf")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
