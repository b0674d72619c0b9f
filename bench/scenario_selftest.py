"""Scenarios self-tested per minute (generation excluded): the throughput of `swebench.selftest`.

Usage (from the repo root):
    python bench/scenario_selftest.py [--n 40] [--workers 2] [--target 60] [--isolation auto|namespace|fallback]
                                      [--unsafe-no-isolation] [--mutation-rounds 0] [--seed 1000]

Generates --n scenarios (half per capability, seeds --seed ...; with --mutation-rounds R each gets R
calibration rounds), then self-tests them all with --workers parallel sandboxes (each self-test runs the
buggy, the fixed and the shortcut tree in one sandbox start). Prints one line per capability and the
sandbox isolation used; the last line is `scenarios_per_min=<value>` over the whole run.
Without namespaces the run refuses (exit 2) unless --unsafe-no-isolation accepts the unisolated fallback.
Exit 0 when every scenario passes and the rate reaches --target, 1 otherwise, 2 on bad flags.
"""
from __future__ import annotations

import argparse
import sys
import time

from common.cli import cli_entry, exit_code, seed_value
from common.validation import check_int, check_number
from swebench.generators import GENERATORS, generate_one
from swebench.mutations import mutate_rounds
from swebench.sandbox import (UNSAFE_FLAG, SandboxConfig, SandboxUnavailable,
                                      resolve_isolation)
from swebench.selftest import self_test_many


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Scenario self-tests per minute.")
    parser.add_argument("--n", type=int, default=40, help="scenarios in all (split between the capabilities)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--target", type=float, default=60.0, help="scenarios per minute to reach")
    parser.add_argument("--isolation", choices=("auto", "namespace", "fallback"), default="auto")
    parser.add_argument(UNSAFE_FLAG, dest="unsafe_no_isolation", action="store_true",
                        help="run without namespace isolation where namespaces are missing (unsafe)")
    parser.add_argument("--mutation-rounds", type=int, default=0, choices=range(0, 6))
    parser.add_argument("--seed", type=seed_value, default=1000)
    args = parser.parse_args(argv)
    check_int(args.n, "--n", 2)
    check_int(args.workers, "--workers", 1)
    check_number(args.target, "--target", 0.0)
    config = SandboxConfig(timeout_s=30, isolation=args.isolation, allow_unisolated=args.unsafe_no_isolation)
    try:
        isolation = resolve_isolation(args.isolation, args.unsafe_no_isolation)
    except SandboxUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    capabilities = sorted(GENERATORS)
    scenarios = []
    for index in range(args.n):
        scenario = generate_one(capabilities[index % len(capabilities)], args.seed + index // len(capabilities))
        scenarios.append(mutate_rounds(scenario, args.mutation_rounds) if args.mutation_rounds else scenario)
    started = time.perf_counter()
    results = self_test_many(scenarios, config, workers=args.workers, progress=False)
    elapsed = time.perf_counter() - started
    failures = [(r.scenario_id, r.reason) for r in results if not r.ok]
    print(f"isolation={isolation} workers={args.workers} mutation_rounds={args.mutation_rounds}")
    for capability in capabilities:
        mine = [r for s, r in zip(scenarios, results) if s.capability == capability]
        mean = sum(r.seconds for r in mine) / max(len(mine), 1)
        print(f"{capability:30s} {len(mine):4d} scenarios  {sum(r.ok for r in mine):4d} pass  "
              f"{mean:5.2f} s per self-test")
    for scenario_id, reason in failures[:10]:
        print(f"FAILED {scenario_id}: {reason}")
    rate = len(results) / elapsed * 60.0
    print(f"{len(results)} scenarios in {elapsed:.1f} s")
    print(f"scenarios_per_min={rate:.1f}")
    return 0 if not failures and rate >= args.target else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
