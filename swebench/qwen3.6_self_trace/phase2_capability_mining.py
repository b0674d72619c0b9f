"""Phase 2: capability mining on the phase-1 trajectories with the Step-1 tools of TRACE.

    python swebench/qwen3.6_self_trace/phase2_capability_mining.py [TRAJECTORY ...]
        [--reports DIR_OR_REPORT] [--run-dir runs/swebench/qwen36_self_trace]
        [--base-url http://localhost:8000/v1 --model NAME [--api-key-env OPENAI_API_KEY] [--runs 10]]
        [--candidates FILE] [--rho 0.10] [--delta 0.20] [--k 8]

Inputs:  trajectories: mini-swe-agent *.traj.json / SWE-agent *.traj files or folders (default: the
         phase-1 output <run-dir>/phase1/agent when it exists, else the bundled real fixtures
         tests/fixtures/real/mini-swe-agent-swebench-verified/); SWE-bench reports (--reports: a folder of
         <iid>.report.json or a run-level harness report; reports next to the trajectories are found
         anyway); for labeling, an OpenAI-compatible server (--base-url, --model, the key in the variable
         named by --api-key-env; for a local vLLM export OPENAI_API_KEY=EMPTY).
Candidates: by default the labeler model proposes them from a sample of failed and passed trajectories
         (`pipeline.label_trajectories --propose`, the general prompt's Phase 1; saved to
         <run-dir>/phase2/labels/candidates.json), as TRACE's Step 1 does on a new target. `--candidates FILE`
         labels a fixed list instead; the bundled `candidates.json` holds the reference run's two answers plus
         three others, so it is for the offline tests and for reproducing that run, never for a claim that
         Step 1 found them.
Outputs: <run-dir>/phase2/summary.jsonl (compacted trajectories, pipeline._summarize); with a server:
         <run-dir>/phase2/labels/run_01.json ... (N independent labelers, pipeline.label_trajectories),
         labeling_report.json, candidates.json (proposed), and <run-dir>/phase2/selected_capabilities.json
         (Cov/Δ aggregation).

Without --base-url the phase stops after the summary and says so (exit 0): labeling needs an LLM. Exit 2
on bad input or an unreachable server (checked before any call).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import DEFAULT_RUN_DIR, HERE, REPO_ROOT, Missing, server_problem
from common.cli import cli_entry, exit_code
from common.io import load_json
from common.run_folder import check_output_dir
from common.validation import InputError, check_int
from pipeline.aggregate_capabilities import AggregationConfig

BUNDLED = REPO_ROOT / "tests" / "fixtures" / "real" / "mini-swe-agent-swebench-verified"


def trajectory_files(paths: list[Path]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if path.is_dir():
            files += sorted(str(p) for p in path.rglob("*.traj.json")) + sorted(str(p) for p in path.rglob("*.traj"))
        else:
            files.append(str(path))
    return files


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trajectories", nargs="*", type=Path)
    parser.add_argument("--reports", type=Path, default=None)
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible server for the labelers")
    parser.add_argument("--model", default=None, help="labeler model name as served")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY")
    parser.add_argument("--runs", type=int, default=10, help="independent labelers")
    parser.add_argument("--candidates", type=Path, default=None,
                        help="label this fixed candidate list instead of having the labeler model propose one "
                             f"(e.g. {HERE / 'candidates.json'}, the reference run's answers plus three others)")
    parser.add_argument("--rho", type=float, default=0.10)
    parser.add_argument("--delta", type=float, default=0.20)
    parser.add_argument("--k", type=int, default=None, help="runs that must agree (default 80%% of --runs)")
    parser.add_argument("--max-chars", type=int, default=1500, help="per-message budget of the summary")
    args = parser.parse_args(argv)
    # the labelers' flags before the summary is written (label_trajectories checks them again, later)
    check_int(args.runs, "--runs", 1)
    if args.k is not None:
        check_int(args.k, "--k", 1, args.runs)
    check_int(args.max_chars, "--max-chars", 1)
    AggregationConfig(rho=args.rho, delta=args.delta)  # the aggregation's own checks, NaN included
    if args.candidates is not None:
        load_json(args.candidates)  # missing or broken: named
    if args.reports is not None and not args.reports.exists():
        raise InputError(f"--reports {args.reports}: not found (a folder of report.json files or a harness report)")
    check_output_dir(args.run_dir, "--run-dir")  # it holds phase 1's trajectories, read here: not checked
    phase1 = args.run_dir / "phase1"
    sources = args.trajectories or [phase1 / "agent" if (phase1 / "agent").is_dir() else BUNDLED]
    files = trajectory_files(sources)
    if not files:
        print(f"error: no trajectory found in {[str(s) for s in sources]}", file=sys.stderr)
        return 2
    reports = args.reports
    if reports is None and (phase1 / "reports").is_dir():
        reports = phase1 / "reports"
    if args.base_url:
        missing = Missing("phase 2 (labeling)")
        missing.add(None if args.model else "--model: the labeler model name is required with --base-url")
        missing.add(server_problem(args.base_url, args.model, need_model_list=False, api_key_env=args.api_key_env))
        missing.stop_if_any()

    from pipeline import label_trajectories, summarize as _summarize

    out = args.run_dir / "phase2"
    summary = out / "summary.jsonl"
    command = [*files, "--out", str(summary), "--max-chars", str(args.max_chars)]
    if reports is not None:
        command += ["--reports", str(reports)]
    print(f"summarizing {len(files)} trajectories -> {summary}")
    code = _summarize.main(command)
    if code != 0:
        return code
    if not args.base_url:
        print("labeling needs an OpenAI-compatible server: rerun with --base-url URL --model NAME "
              "(phase 2 stopped after the summary; nothing was labeled)")
        return 0
    source = ["--candidates", str(args.candidates)] if args.candidates else ["--propose"]
    label_args = [str(summary), "--out", str(out / "labels"), "--base-url", args.base_url, "--model", args.model,
                  "--api-key-env", args.api_key_env, *source, "--runs", str(args.runs),
                  "--rho", str(args.rho), "--delta", str(args.delta), "--export", str(out / "selected_capabilities.json")]
    if args.k is not None:
        label_args += ["--k", str(args.k)]
    return label_trajectories.main(label_args)


if __name__ == "__main__":
    sys.exit(exit_code(main))
