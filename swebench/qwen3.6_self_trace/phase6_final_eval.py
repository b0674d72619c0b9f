"""Phase 6: final SWE-bench Verified evaluation with a trained adapter loaded into vLLM; compared to phase 1.

    python swebench/qwen3.6_self_trace/phase6_final_eval.py --adapter pipeline/adapters/NAME
        [--adapter-name trace-NAME] [--model Qwen/Qwen3.6-27B] [--base-url http://localhost:8000/v1]
        [--subset verified] [--split test] [--workers 16] [--slice 0:500] [--run-id trace_final]
        [--baseline runs/swebench/qwen36_self_trace/phase1/summary.json] [--run-dir ...] [--dry-run]

Inputs:  the adapter folder from phase 5 (adapter_config.json + weights) on a path the vLLM server can
         read; the vLLM server at --base-url serving the base model with LoRA enabled (--enable-lora,
         --max-lora-rank >= the adapter's rank, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); Docker,
         `mini-extra` and `swebench` as in phase 1; the phase-1 summary for the comparison.
Outputs: <run-dir>/phase6/<adapter-name>/ with the same files as phase 1 (agent/, preds.jsonl, reports/,
         summary.json), and <run-dir>/phase6/<adapter-name>/comparison.json (Pass@1 of base and adapter,
         the difference, instances newly resolved and newly lost).

Checks everything first and exits 2 listing what is missing; the adapter is then loaded with
/v1/load_lora_adapter and served under --adapter-name. --dry-run prints the commands without checks.
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from _common import (DEFAULT_BASE_URL, DEFAULT_MODEL, DEFAULT_RUN_DIR, HERE, Missing, agent_commands,
                     agent_prerequisites, check_agent_run_flags, evaluate)
from common.cli import cli_entry, exit_code
from common.io import load_json
from common.validation import InputError


def load_adapter(base_url: str, name: str, path: Path) -> str | None:
    """None when the server serves `path` as `name`, else why not."""
    request = urllib.request.Request(base_url.rstrip("/") + "/load_lora_adapter", method="POST",
                                     data=json.dumps({"lora_name": name, "lora_path": str(path)}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120):
            return None
    except urllib.error.HTTPError as err:
        body = err.read().decode("utf-8", "replace")[:300]
        if err.code == 400 and "already" in body:
            return None
        hint = " (start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)" if err.code == 404 else ""
        return f"the server refused the adapter: HTTP {err.code} {body}{hint}"
    except (urllib.error.URLError, OSError) as err:
        return f"the server did not answer the adapter load ({err})"


def compare(baseline_path: Path, summary: dict, out: Path) -> dict:
    baseline = json.loads(baseline_path.read_text())

    def resolved(summary: dict) -> set[str]:
        return set(json.loads(Path(summary["report"]).read_text()).get("resolved_ids", []))

    before, after = resolved(baseline), resolved(summary)
    comparison = {"baseline_pass_at_1": baseline["pass_at_1"], "adapter_pass_at_1": summary["pass_at_1"],
                  "difference_points": round(100 * (summary["pass_at_1"] - baseline["pass_at_1"]), 2),
                  "newly_resolved": sorted(after - before), "newly_lost": sorted(before - after)}
    out.write_text(json.dumps(comparison, indent=2) + "\n")
    return comparison


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", type=Path, required=True)
    parser.add_argument("--adapter-name", default=None, help="name to serve it under (default trace-<folder>)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the base model the server serves")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL)
    parser.add_argument("--subset", default="verified")
    parser.add_argument("--split", default="test")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--slice", default=None)
    parser.add_argument("--run-id", default="trace_final")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--baseline", type=Path, default=None, help="phase-1 summary.json")
    parser.add_argument("--config", type=Path, default=HERE / "configs" / "mini_swe_agent_vllm.yaml")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    check_agent_run_flags(args)
    name = args.adapter_name or f"trace-{args.adapter.resolve().name}"
    out_dir = args.run_dir / "phase6" / name
    baseline = args.baseline or args.run_dir / "phase1" / "summary.json"
    if args.dry_run:
        print(f"POST {args.base_url.rstrip('/')}/load_lora_adapter "
              f"{json.dumps({'lora_name': name, 'lora_path': str(args.adapter.resolve())})}")
        for command in agent_commands(out_dir, name, args.base_url, args.config, args.subset, args.split, args.workers,
                                      args.run_id, args.slice):
            print(" ".join(command))
        return 0
    # What the command names is input (one line, exit 2); what an earlier phase should have left is a prerequisite.
    if not (args.adapter / "adapter_config.json").is_file():
        raise InputError(f"--adapter {args.adapter}: no adapter_config.json there (train one with phase 5)")
    if args.baseline is not None:
        load_json(args.baseline)  # missing or broken: named
    missing = Missing("phase 6 (final evaluation)")
    agent_prerequisites(missing, args.base_url, args.model)
    if not baseline.is_file():
        missing.add(f"baseline: {baseline} not found (run phase 1, or pass --baseline)")
    missing.stop_if_any()
    problem = load_adapter(args.base_url, name, args.adapter.resolve())
    if problem:
        print(f"phase 6 cannot start: {problem}", file=sys.stderr)
        return 2
    code = evaluate(out_dir, name, args.base_url, args.config, args.subset, args.split, args.workers, args.run_id,
                    args.slice)
    if code != 0:
        return code
    summary = json.loads((out_dir / "summary.json").read_text())
    comparison = compare(baseline, summary, out_dir / "comparison.json")
    print(f"Pass@1 base {100 * comparison['baseline_pass_at_1']:.1f}% -> adapter "
          f"{100 * comparison['adapter_pass_at_1']:.1f}% ({comparison['difference_points']:+.1f} points); "
          f"{len(comparison['newly_resolved'])} newly resolved, {len(comparison['newly_lost'])} lost")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
