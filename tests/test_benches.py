"""The bench scripts run and end with their `name=value` headline line (figures are not asserted)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "script, args, name",
    [
        ("bench/grpo_step.py", ["--iterations", "1", "--groups", "1", "--group-size", "2", "--micro-batch", "2",
                                "--max-turn-tokens", "16", "--max-episode-tokens", "1300"], "speedup_vs_trl"),
        ("bench/env_step.py", ["--seconds", "0.2"], "min_steps_per_s"),
    ],
)
def test_bench_prints_its_headline_last(script, args, name):
    result = subprocess.run([sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1 = ran, but the speed target was missed
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{name}=\d+(\.\d+)?", last), last
