"""Phase 1: baseline of the base model on SWE-bench Verified (mini-swe-agent, graded by the SWE-bench harness).

    python swebench/qwen3.6_self_trace/phase1_baseline.py --model Qwen/Qwen3.6-27B \
        [--base-url http://localhost:8000/v1] [--subset verified] [--split test] [--workers 16]
        [--slice 0:500] [--run-id trace_baseline] [--run-dir runs/swebench/qwen36_self_trace]
        [--config swebench/qwen3.6_self_trace/configs/mini_swe_agent_vllm.yaml] [--dry-run]

Inputs:  a running vLLM (OpenAI-compatible) server at --base-url serving --model; Docker; the
         `mini-extra` command (pip install 'mini-swe-agent>=2') and the `swebench` package (>=4.1);
         internet access for the dataset and the instance images.
Outputs: <run-dir>/phase1/agent/ (mini-swe-agent: preds.json, <iid>/<iid>.traj.json),
         <run-dir>/phase1/preds.jsonl (harness predictions), <run-dir>/phase1/reports/ and
         *.<run-id>.json (harness report), <run-dir>/phase1/summary.json (Pass@1 and counts).
         Phase 2 reads the trajectories and the report.

Every prerequisite is checked first; when one is missing the script lists them all and exits 2 without
starting anything. --dry-run prints the two commands instead of running them (no checks). Exit 0 when the
summary is written, 1 when the agent run failed (rerun to resume), 2 when something is missing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import (DEFAULT_BASE_URL, DEFAULT_MODEL, DEFAULT_RUN_DIR, HERE, Missing, check_agent_run_flags,
                     agent_commands, agent_prerequisites, evaluate)
from common.cli import cli_entry, exit_code


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="served model name (default %(default)s)")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL)
    parser.add_argument("--subset", default="verified")
    parser.add_argument("--split", default="test")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--slice", default=None, help="e.g. 0:50 for the first 50 instances")
    parser.add_argument("--run-id", default="trace_baseline")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--config", type=Path, default=HERE / "configs" / "mini_swe_agent_vllm.yaml")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    check_agent_run_flags(args)
    out_dir = args.run_dir / "phase1"
    if args.dry_run:
        for command in agent_commands(out_dir, args.model, args.base_url, args.config, args.subset, args.split,
                                      args.workers, args.run_id, args.slice):
            print(" ".join(command))
        return 0
    missing = Missing("phase 1 (baseline)")
    agent_prerequisites(missing, args.base_url, args.model)
    missing.stop_if_any()
    return evaluate(out_dir, args.model, args.base_url, args.config, args.subset, args.split, args.workers,
                    args.run_id, args.slice)


if __name__ == "__main__":
    sys.exit(exit_code(main))
