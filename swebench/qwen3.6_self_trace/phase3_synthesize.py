"""Phase 3: scenario synthesis per capability: generate, self-test, and (with a model) calibrate by mutation.

    python swebench/qwen3.6_self_trace/phase3_synthesize.py [--capability NAME ...] [--candidates 20]
        [--target 10] [--seed 0] [--workers 2] [--isolation auto|namespace|fallback]
        [--run-dir runs/swebench/qwen36_self_trace]
        [--model MODEL [--samples 10] [--rounds 5] [--threshold 0.5] [--max-episode-tokens 16384]]

Inputs:  the capabilities: --capability, else the selected ones in <run-dir>/phase2/selected_capabilities.json
         that have a generator, else both generators (semantic_logic_precision, deep_call_graph_traversal);
         with --model, the base model (a local directory, or the served name when VLLM_BASE_URLS and
         VLLM_MODEL point at a vLLM server).
Outputs: <run-dir>/phase3/<capability>/candidates.json (generated), selftest_report.json,
         scenarios_selftested.json (those that pass the sandboxed self-test); with --model also
         <run-dir>/phase3/<capability>/calibration/ (state.json, round_<r>_rollouts.json, calibration.json,
         calibration_log.md) and the calibrated set pipeline/swebench/<capability>/scenarios_parsed.json.

Without --model nothing is calibrated and the script says so (the self-tested set is still written).
Runs on a laptop without a model. Exit 0 when every capability has --target scenarios (self-tested, and
calibrated when --model is given), 1 when fewer, 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import CAPABILITIES, DEFAULT_RUN_DIR
from common.cli import cli_entry, exit_code, seed_value


def chosen_capabilities(requested: list[str], run_dir: Path) -> list[str]:
    if requested:
        return requested
    selected = run_dir / "phase2" / "selected_capabilities.json"
    if selected.is_file():
        from common.io import load_json
        from common.validation import InputError

        entries = load_json(selected)
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise InputError(f"{selected}: expected a selected-capabilities list ([{{\"skill\": ...}}, ...])")
        names = [entry.get("skill") or entry.get("name") for entry in entries]
        known = [n for n in names if n in CAPABILITIES]
        unknown = [n for n in names if n not in CAPABILITIES]
        if unknown:
            print(f"no scenario generator for {unknown} (generators: {', '.join(CAPABILITIES)}); skipped")
        if known:
            return known
    return list(CAPABILITIES)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capability", action="append", default=[], choices=CAPABILITIES)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--target", type=int, default=10)
    parser.add_argument("--seed", type=seed_value, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--isolation", choices=("auto", "namespace", "fallback"), default="auto")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--model", default=None, help="base model for the calibration rollouts")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--max-episode-tokens", type=int, default=16384)
    args = parser.parse_args(argv)
    if args.candidates < args.target or args.target < 1:
        parser.error("--target must be >= 1 and --candidates >= --target")

    from common.io import check_model_folder, check_output_folder
    from common.validation import check_int, check_number
    from swebench import calibrate as calibration
    from swebench import generate, selftest
    from swebench.scenario import default_scenarios_path, load_scenarios

    # Every flag the later steps read is checked here, before 20 scenarios are generated and self-tested.
    check_int(args.workers, "--workers", 1)
    check_output_folder(args.run_dir, "--run-dir")
    check_number(args.threshold, "--threshold", 0.0, 1.0)
    check_int(args.samples, "--samples", 1)
    check_int(args.rounds, "--rounds", 0, len(calibration.ROUND_ORDER))
    check_int(args.max_episode_tokens, "--max-episode-tokens", 256)
    if args.model is not None and Path(args.model).exists():  # a local folder (else a hub id or served name)
        check_model_folder(args.model, "--model")
    capabilities = chosen_capabilities(args.capability, args.run_dir)
    short = 0
    for capability in capabilities:
        folder = args.run_dir / "phase3" / capability
        candidates = folder / "candidates.json"
        print(f"== {capability}")
        code = generate.main(["--capability", capability, "--n", str(args.candidates), "--seed", str(args.seed),
                              "--out", str(candidates), "--no-progress"])
        if code != 0:
            return code
        kept = folder / "scenarios_selftested.json"
        code = selftest.main([str(candidates), "--out", str(kept), "--report", str(folder / "selftest_report.json"),
                              "--workers", str(args.workers), "--isolation", args.isolation, "--no-progress"])
        if code == 2:
            return 2
        n_kept = len(load_scenarios(kept)) if kept.is_file() else 0
        if args.model is None:
            print(f"{capability}: {n_kept} self-tested scenarios -> {kept}; not calibrated: no --model given "
                  f"(calibrating needs the base model: --model, or VLLM_BASE_URLS/VLLM_MODEL for a server)")
            short += n_kept < args.target
            continue
        code = calibration.main(["--capability", capability, "--model", args.model, "--target", str(args.target),
                                 "--candidates", str(args.candidates), "--seed", str(args.seed), "--samples",
                                 str(args.samples), "--rounds", str(args.rounds), "--threshold", str(args.threshold),
                                 "--max-episode-tokens", str(args.max_episode_tokens), "--workers", str(args.workers),
                                 "--isolation", args.isolation, "--work-dir", str(folder / "calibration"),
                                 "--out", str(default_scenarios_path(capability))])
        if code == 2:
            return 2
        short += code != 0
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
