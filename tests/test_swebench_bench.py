"""bench/scenario_selftest.py runs and ends with its headline (the figure itself is not asserted)."""
import re
import subprocess
import sys

from game_registry import REPO_ROOT


def test_scenario_selftest_bench_prints_its_headline_last():
    result = subprocess.run([sys.executable, "bench/scenario_selftest.py", "--n", "2", "--target", "0"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"scenarios_per_min=\d+(\.\d+)?", lines[-1]), lines[-1]
    assert any(line.startswith("isolation=") for line in lines)
    bad = subprocess.run([sys.executable, "bench/scenario_selftest.py", "--n", "1"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2
