"""bench/gate_overhead.py runs and ends with its `routed_vs_single_lora=<ratio>` line (the figure is not asserted)."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gate_overhead_bench_prints_its_headline_last():
    args = ["--rounds", "1", "--batch", "2", "--prompt-len", "8", "--new-tokens", "4", "--hidden", "32",
            "--layers", "2", "--vocab", "128", "--adapters", "2", "--rank", "2"]
    result = subprocess.run([sys.executable, "bench/gate_overhead.py", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1 = ran, but the speed target was missed
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"routed_vs_single_lora=\d+(\.\d+)?", last), last
