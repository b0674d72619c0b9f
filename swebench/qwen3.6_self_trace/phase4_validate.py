"""Phase 4: validate the scenario sets: sandboxed self-test, validate_game on the scenario game, statistics.

    python swebench/qwen3.6_self_trace/phase4_validate.py [SCENARIOS.json ...] [--workers 2]
        [--fuzz-actions 200] [--isolation auto|namespace|fallback] [--run-dir runs/swebench/qwen36_self_trace]

Inputs:  scenario files (default, per capability: the calibrated pipeline/swebench/<capability>/
         scenarios_parsed.json when it exists, else <run-dir>/phase3/<capability>/scenarios_selftested.json).
Outputs: <run-dir>/phase4/validation.json: per file the self-test result of every scenario, the
         validate_game report of the scenario game playing that file (one seed per scenario: oracle 100%,
         no-op and reward-hacking probes at 0, determinism, fuzzing), and the difficulty statistics
         (call depth or template, mutation rounds, file counts). A table is printed.

Runs on a laptop (no model, no GPU). Exit 0 when every file passes, 1 when one does not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path

from _common import CAPABILITIES, DEFAULT_RUN_DIR
from common.cli import cli_entry, exit_code


def default_files(run_dir: Path) -> list[Path]:
    from swebench.scenario import default_scenarios_path

    files = []
    for capability in CAPABILITIES:
        calibrated = default_scenarios_path(capability)
        selftested = run_dir / "phase3" / capability / "scenarios_selftested.json"
        if calibrated.is_file():
            files.append(calibrated)
        elif selftested.is_file():
            files.append(selftested)
    return files


def statistics(scenarios: list) -> dict:
    difficulty = [s.metadata.get("difficulty") or {} for s in scenarios]
    stats = {"scenarios": len(scenarios),
             "mutation_rounds": dict(Counter(len(s.metadata.get("mutations", [])) for s in scenarios)),
             "files": dict(Counter(len(s.files) for s in scenarios))}
    for key in ("call_depth", "template", "helper"):
        values = [d[key] for d in difficulty if key in d]
        if values:
            stats[key] = dict(Counter(values))
    return stats


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fuzz-actions", type=int, default=200)
    parser.add_argument("--isolation", choices=("auto", "namespace", "fallback"), default="auto")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    args = parser.parse_args(argv)

    from common.io import atomic_write_json, check_output_path
    from common.validation import InputError, check_int
    from swebench.game import CONFIG_CLASSES, ScenarioGame, make_spec
    from swebench.sandbox import SandboxConfig
    from swebench.scenario import load_scenarios
    from swebench.selftest import self_test_many
    from pipeline.validate_game import validate

    out = args.run_dir / "phase4" / "validation.json"
    # Flags, the report path and every scenario file are checked before the first self-test starts.
    check_int(args.workers, "--workers", 1)
    check_int(args.fuzz_actions, "--fuzz-actions", 0)
    files = args.files or default_files(args.run_dir)
    check_output_path(out, "--run-dir", [("a scenarios file", path) for path in files])
    if not files:
        raise InputError(f"no scenario file given and none found (run phase 3 first: {args.run_dir / 'phase3'})")
    loaded = []
    for path in files:
        scenarios = load_scenarios(path)
        capabilities = {s.capability for s in scenarios}
        if len(capabilities) != 1 or not capabilities <= set(CONFIG_CLASSES):
            raise InputError(f"{path}: one capability per file, one of {sorted(CONFIG_CLASSES)}; found "
                             f"{sorted(capabilities)}")
        loaded.append((path, scenarios, capabilities.pop()))
    report, failed = {}, []
    for path, scenarios, capability in loaded:
        results = self_test_many(scenarios, SandboxConfig(isolation=args.isolation), args.workers, progress=False)
        config = CONFIG_CLASSES[capability](scenarios_path=str(path), isolation=args.isolation)
        spec = dataclasses.replace(make_spec(capability), make_env=lambda config=config: ScenarioGame(config))
        validation = validate(spec, seeds=len(scenarios), fuzz_actions=args.fuzz_actions)
        ok = all(r.ok for r in results) and validation["passed"]
        report[str(path)] = {
            "capability": capability, "passed": ok,
            "selftest": {r.scenario_id: {"ok": r.ok, "reason": r.reason, "seconds": round(r.seconds, 3)}
                         for r in results},
            "validate_game": validation, "statistics": statistics(scenarios)}
        checks = validation["checks"]
        print(f"{'PASS' if ok else 'FAIL'} {path}: {capability}, {len(scenarios)} scenarios, self-test "
              f"{sum(r.ok for r in results)}/{len(results)}, oracle {checks['oracle']['success_rate']:.0%}, "
              f"no-op {checks['baselines']['do_nothing_mean_reward']:.2f}, probes {checks['probes']['status']}, "
              f"validate_game {'PASS' if validation['passed'] else 'FAIL'}")
        for name, check in checks.items():
            if check["status"] == "FAIL":
                print(f"    {name}: {check['detail'][:300]}")
        if not ok:
            failed.append(str(path))
    atomic_write_json(out, report)
    print(f"report -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
