"""Self-test scenarios: the target fails before the oracle patch and passes after; nothing else moves.

    python -m swebench.selftest FILE [--out KEPT.json] [--report REPORT.json] [--workers 2]
        [--timeout 30] [--isolation auto|namespace|fallback] [--unsafe-no-isolation] [--min-regression 3]

For every scenario, in throw-away copies run by the sandbox (swebench/sandbox.py):
  before the oracle patch: `target_test` and every hidden test fail; every other test passes;
  after it:                every test passes, in the per-test report and in the verdict run the grader uses
                           (one fresh process for all tests, `swebench/grading.py`);
  and, when metadata.shortcut_patch is given (a patch that hard-codes the visible expectation), the target
  passes with it while a hidden test still fails: the hidden tests catch hard-coding.
At least --min-regression regression tests must pass in both runs. A scenario that fails is dropped, with
the reason printed and written to --report ({"kept": [ids], "dropped": {id: reason}, "seconds", ...}).

Scenario code runs only in the namespace sandbox; where namespaces are missing, --unsafe-no-isolation
accepts running it without them (otherwise exit 2 with what is missing; see swebench/sandbox.py).

Exit codes: 0 every scenario passed, 1 some were dropped (--out holds the kept ones; when none passed, a file
already at --out is removed, so no earlier run's scenarios stand in for this run's), 2 bad input (the file, a
flag, an unwritable output; nothing written).
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from common.cli import exit_code
from common.io import atomic_write_json, check_output_path
from common.validation import InputError, check_number
from swebench.grading import test_node_ids
from swebench.patches import PatchError, apply_patch
from swebench.sandbox import (UNSAFE_FLAG, SandboxConfig, SandboxUnavailable, TestRun, VerdictGroup,
                                      resolve_isolation, run_pytest_batch)
from swebench.scenario import Scenario, load_scenarios, publish_scenarios

DEFAULT_MIN_REGRESSION = 3


@dataclass
class SelfTestResult:
    scenario_id: str
    ok: bool
    reason: str = ""  # why it failed ("" when ok)
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    isolation: str = ""


def hidden_node_ids(run: TestRun, scenario: Scenario) -> list[str]:
    hidden = tuple(f"{path}::" for path in scenario.hidden_test_files())
    return sorted(node for node in run.outcomes if node.startswith(hidden))


def _describe(run: TestRun) -> str:
    return run.problem or f"{sum(v == 'passed' for v in run.outcomes.values())}/{len(run.outcomes)} passed"


def self_test(scenario: Scenario, config: SandboxConfig | None = None,
              min_regression: int = DEFAULT_MIN_REGRESSION) -> SelfTestResult:
    """Run the checks of the module docstring on one scenario; never raises for a broken scenario."""
    started = time.perf_counter()
    result = SelfTestResult(scenario.id, ok=False)
    target = scenario.target_test

    def fail(reason: str) -> SelfTestResult:
        result.reason = reason
        result.seconds = time.perf_counter() - started
        return result

    try:
        fixed = apply_patch(scenario.files, scenario.oracle_patch)
    except PatchError as err:
        return fail(f"oracle_patch_does_not_apply: {err}")
    trees = [scenario.files, fixed]
    shortcut = scenario.metadata.get("shortcut_patch")
    if shortcut:
        try:
            trees.append(apply_patch(scenario.files, shortcut))
        except PatchError as err:
            return fail(f"shortcut_patch_does_not_apply: {err}")
    nodes = tuple(node for path in scenario.all_test_files() if path in fixed
                  for node in test_node_ids(path, fixed[path]))
    groups = [[] for _ in trees]
    if nodes:
        groups[1] = [VerdictGroup("all", nodes)]
    runs = run_pytest_batch(trees, config, groups=groups)  # one sandbox start for the two (or three) trees
    before, after = runs[0], runs[1]
    result.before, result.isolation = before.outcomes, before.isolation
    if before.problem:
        return fail(f"no_results_before: {before.problem}")
    if before.outcome(target) != "failed":
        return fail(f"target_not_failing_before: {before.outcome(target)}")
    hidden = hidden_node_ids(before, scenario)
    if len(hidden) < len(scenario.hidden_test_files()):
        return fail(f"hidden_tests_missing: found {hidden} for {scenario.hidden_test_files()}")
    not_failing = [node for node in hidden if before.outcome(node) != "failed"]
    if not_failing:
        return fail(f"hidden_not_failing_before: {not_failing[:3]}")
    regression = sorted(set(before.outcomes) - {target} - set(hidden))
    broken = [node for node in regression if before.outcome(node) != "passed"]
    if broken:
        return fail(f"regression_not_passing_before: {[(n, before.outcome(n)) for n in broken[:3]]}")
    if len(regression) < min_regression:
        return fail(f"too_few_regression_tests: {len(regression)} < {min_regression}")
    result.after = after.outcomes
    if after.problem:
        return fail(f"no_results_after: {after.problem}")
    if after.outcome(target) != "passed":
        return fail(f"target_not_passing_after: {after.outcome(target)}")
    not_passing = [(node, after.outcome(node)) for node in [*hidden, *regression] if after.outcome(node) != "passed"]
    if not_passing:
        return fail(f"oracle_breaks_tests: {not_passing[:3]}")
    if after.verdict("all") != "passed":
        return fail(f"oracle_fails_the_verdict_run: {after.verdict('all')}")
    extra = sorted(set(after.outcomes) - set(before.outcomes))
    if extra:
        return fail(f"tests_appear_after_the_patch: {extra[:3]}")
    if shortcut:
        run = runs[2]
        if run.outcome(target) != "passed":
            return fail(f"shortcut_does_not_pass_the_target: {run.outcome(target)} ({_describe(run)})")
        if all(run.outcome(node) == "passed" for node in hidden):
            return fail("hidden_tests_miss_the_shortcut: hard-coding the visible example passes every hidden test")
    result.ok = True
    result.seconds = time.perf_counter() - started
    return result


def self_test_many(scenarios: list[Scenario], config: SandboxConfig | None = None, workers: int = 2,
                   min_regression: int = DEFAULT_MIN_REGRESSION, progress: bool = True,
                   check_shortcut: bool = True) -> list[SelfTestResult]:
    """`self_test` over `scenarios` with `workers` threads (each run is a subprocess); results in input order."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")

    def one(scenario: Scenario) -> SelfTestResult:
        if not check_shortcut and scenario.metadata.get("shortcut_patch"):
            scenario = Scenario.from_dict({**scenario.to_dict(), "metadata": {
                k: v for k, v in scenario.metadata.items() if k != "shortcut_patch"}})
        return self_test(scenario, config, min_regression)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results: Iterable[SelfTestResult] = pool.map(one, scenarios)
        return list(tqdm(results, total=len(scenarios), desc="self-test", unit="scenario", file=sys.stderr,
                         disable=not progress or None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swebench.selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="scenarios JSON (a list in the scenarios format)")
    parser.add_argument("--out", type=Path, default=None, help="write the scenarios that pass here")
    parser.add_argument("--report", type=Path, default=None, help="write kept ids and drop reasons here (JSON)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0, help="wall-clock seconds per pytest run")
    parser.add_argument("--isolation", choices=("auto", "namespace", "fallback"), default="auto")
    parser.add_argument(UNSAFE_FLAG, dest="unsafe_no_isolation", action="store_true",
                        help="run the scenario code without namespace isolation where namespaces are missing "
                             "(unsafe: see swebench/sandbox.py)")
    parser.add_argument("--min-regression", type=int, default=DEFAULT_MIN_REGRESSION)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.min_regression < 0:
        parser.error("--workers must be >= 1 and --min-regression >= 0")
    try:
        check_number(args.timeout, "--timeout", 0.0, low_open=True)
        config = SandboxConfig(timeout_s=args.timeout, isolation=args.isolation,
                               allow_unisolated=args.unsafe_no_isolation)
        resolve_isolation(config.isolation, config.allow_unisolated)  # refuse before anything is written
        for path, flag in ((args.out, "--out"), (args.report, "--report")):
            if path is not None:  # the input would lose its dropped scenarios; the report, replace the kept ones
                check_output_path(path, flag, [("the scenarios file", args.file),
                                               *([("--out", args.out)] if flag == "--report" else [])])
        scenarios = load_scenarios(args.file)
        results = self_test_many(scenarios, config, args.workers, args.min_regression, not args.no_progress)
    except (InputError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kept = [s for s, r in zip(scenarios, results) if r.ok]
    dropped = {r.scenario_id: r.reason for r in results if not r.ok}
    for result in results:
        status = "ok     " if result.ok else "DROPPED"
        print(f"{status} {result.scenario_id} ({result.seconds:.1f} s){'' if result.ok else ': ' + result.reason}")
    total = sum(r.seconds for r in results)
    print(f"{len(kept)}/{len(results)} scenarios pass the self-test (isolation: "
          f"{', '.join(sorted({r.isolation for r in results if r.isolation})) or '-'})")
    if args.out is not None:
        print(publish_scenarios(args.out, kept, "kept"))
    if args.report is not None:
        atomic_write_json(args.report, {"file": str(args.file), "kept": [s.id for s in kept], "dropped": dropped,
                                        "seconds": round(total, 2),
                                        "per_scenario": {r.scenario_id: {"ok": r.ok, "reason": r.reason,
                                                                         "seconds": round(r.seconds, 3)}
                                                         for r in results}})
    return 0 if not dropped else 1


if __name__ == "__main__":
    sys.exit(exit_code(main))
