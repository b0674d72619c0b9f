"""Time `aggregate(...)` on synthetic labeling runs: 10 runs x 20,000 trajectories x 10 capabilities.

Run from the repo root: `python bench/aggregate.py [--runs 10 --trajectories 20000 --capabilities 10]`.
The timing covers the whole `aggregate` call (file loading, validation, metrics, Fleiss' κ, bootstrap),
not the synthetic generation. The last printed line is `seconds=<value>` (target: under 2 s on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common.cli import cli_entry, exit_code
from common.validation import check_int
from pipeline.aggregate_capabilities import CATEGORIES, FAILED_KEYS, PASSED_KEYS, aggregate

MAX_CAPABILITIES = 13  # capability 12 is never LACKING on a failure; a 14th would need a negative probability


def write_synthetic_runs(folder: Path, n_runs: int, n_trajectories: int, n_capabilities: int,
                         seed: int = 0) -> list[Path]:
    """Write `n_runs` valid run files; capability i is more often LACKING on failed trajectories for small i."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"task_{i:06d}" for i in range(n_trajectories)])
    failed = rng.random(n_trajectories) < 0.3  # (n_trajectories,) outcome, shared by all runs
    paths = []
    for run in range(n_runs):
        labels = {}
        for cap in range(n_capabilities):
            # Category probabilities (NA, PRESENT, LACKING) on failed / passed trajectories.
            lacking_failed = 0.6 - 0.05 * cap
            p_failed = [0.3, 0.7 - lacking_failed, lacking_failed]
            p_passed = [0.3, 0.6, 0.1]
            codes = np.where(failed, rng.choice(3, n_trajectories, p=p_failed),
                             rng.choice(3, n_trajectories, p=p_passed))  # (n_trajectories,)
            lists = {}
            for code in range(len(CATEGORIES)):
                lists[FAILED_KEYS[code]] = ids[failed & (codes == code)].tolist()
                lists[PASSED_KEYS[code]] = ids[~failed & (codes == code)].tolist()
            labels[f"capability_{cap:02d}"] = lists
        run_data = {"attempt": run + 1,
                    "totals": {"total_failed": int(failed.sum()), "total_passed": int((~failed).sum())},
                    "labels": labels}
        path = folder / f"run_{run + 1:02d}.json"
        path.write_text(json.dumps(run_data), encoding="utf-8")
        paths.append(path)
    return paths


@cli_entry
def main(argv: list[str] | None = None) -> int:
    """Generate the runs, time one `aggregate` call, print a summary and `seconds=<value>` last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--trajectories", type=int, default=20_000)
    parser.add_argument("--capabilities", type=int, default=10)
    args = parser.parse_args(argv)
    # the synthetic generator's ranges: capability i is LACKING on failures with probability 0.6 - 0.05 i
    check_int(args.runs, "--runs", 1)
    check_int(args.trajectories, "--trajectories", 1)
    check_int(args.capabilities, "--capabilities", 1, MAX_CAPABILITIES)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_synthetic_runs(Path(tmp), args.runs, args.trajectories, args.capabilities)
        start = time.perf_counter()
        report = aggregate(paths, k=min(8, args.runs))
        seconds = time.perf_counter() - start
    print(f"{args.runs} runs x {args.trajectories} trajectories x {args.capabilities} capabilities: "
          f"{len(report['selected'])} selected")
    print(f"seconds={seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
