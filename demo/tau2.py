"""Step 1 alone on real data: capability selection on the bundled τ²-bench results (`make demo-tau2`).

It runs Step 1, capability selection, on the bundled real τ²-bench results (gpt-4.1 agent on
the airline and retail domains): compact the trajectories, write the candidate capabilities, let ten
rule-based stand-in labelers (`demo/rule_labeler.py`; there is no LLM here) mark every
(trajectory, capability) pair, convert their flat labels into run files, aggregate, and print the
capability table. Everything lands in `runs/demo_tau2/select/` in the formats of docs/ARTIFACTS.md.

What it does NOT do, and says so when it runs:
- Phase 1 proposes nothing: the candidates are the fixed list of `rule_labeler.CANDIDATES`. Each gets
  example trajectories the way the Phase-1 prompt asks (failed ones where it was lacking, a passed one
  where it was shown), and a candidate without a failed example is dropped, as the prompt's Phase-1
  check would refuse it.
- The labelers are rules, and the rules read each task's whole gold action list
  (`evaluation_criteria.actions`), which the labelers of a real run never see: they read `summary.jsonl`,
  which shows only the checks that failed.
- Steps 2-4 (environments, GRPO training, the gate) are not run yet.
Run files of an earlier demo with more labelers (`run_04.json` ... after `--runs 3`) are removed, so the
README's `run_*.json` glob never mixes two demos.

    python -m demo.tau2 [--run-dir runs/demo_tau2] [--runs 10] [--k 8]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from demo import rule_labeler
from common.cli import cli_entry, exit_code
from common.paths import REPO_ROOT
from common.io import atomic_write_json, atomic_write_jsonl, check_output_folder, load_json
from common.validation import InputError
from pipeline.summarize import summarize_paths
from pipeline.aggregate_capabilities import AggregationConfig, aggregate, format_table, write_outputs
from pipeline.labels_to_run import labels_to_run

TAU2_RESULTS = sorted((REPO_ROOT / "tests" / "fixtures" / "real" / "tau2-bench").glob("*.json"))
BANNER = "=" * 78


def rule_verdicts_for(result_files: list[Path], summary: list[dict]) -> dict[str, dict[str, str]]:
    """Noiseless rule labels keyed by the summary's trajectory ids.

    `summarize_paths` keeps file order and simulation order, so the i-th simulation across the files is
    the i-th summary record (its id may carry a domain prefix).
    """
    pairs = []
    for path in result_files:
        data = load_json(path)
        tasks = {str(task["id"]): task for task in data.get("tasks") or []}
        pairs.extend((sim, tasks.get(str(sim["task_id"]))) for sim in data["simulations"])
    if len(pairs) != len(summary):
        raise InputError(f"summary has {len(summary)} records but the results files hold {len(pairs)} simulations")
    return {
        record["id"]: rule_labeler.rule_labels(rule_labeler.extract_evidence(sim, task))
        for record, (sim, task) in zip(summary, pairs)
    }


DEMO_FILES = re.compile(r"^(run_\d+\.json|labels_\d+\.jsonl)$")  # what run_selection writes into labels/


def remove_stale_label_files(labels_dir: Path, n_runs: int) -> list[Path]:
    """Delete run_NN.json / labels_NN.jsonl files of an earlier demo beyond this one's `n_runs`."""
    if not labels_dir.is_dir():
        return []
    keep = {f"run_{run:02d}.json" for run in range(1, n_runs + 1)} | {f"labels_{run:02d}.jsonl"
                                                                     for run in range(1, n_runs + 1)}
    stale = sorted(path for path in labels_dir.iterdir()
                   if path.is_file() and DEMO_FILES.match(path.name) and path.name not in keep)
    for path in stale:
        path.unlink()
    return stale


def run_selection(run_dir: Path, n_runs: int, k: int, rho: float, delta: float) -> dict:
    select_dir = run_dir / "select"
    summary = summarize_paths(TAU2_RESULTS, max_chars=1500)
    atomic_write_jsonl(select_dir / "summary.jsonl", summary)
    n_failed = sum(1 for r in summary if r["passed"] is False)
    print(f"[1/4] summarized {len(summary)} trajectories from {len(TAU2_RESULTS)} τ²-bench results files "
          f"({len(summary) - n_failed} passed, {n_failed} failed) -> {select_dir / 'summary.jsonl'}")

    verdicts = rule_verdicts_for(TAU2_RESULTS, summary)
    candidates, dropped = rule_labeler.candidates_with_examples(verdicts, summary)
    kept = [candidate["name"] for candidate in candidates["candidates"]]
    verdicts = {tid: {name: labels[name] for name in kept} for tid, labels in verdicts.items()}
    atomic_write_json(select_dir / "candidates.json", candidates)
    print(f"[2/4] Phase 1 is NOT run: {len(rule_labeler.CANDIDATES)} FIXED candidate capabilities from "
          f"demo/rule_labeler.py (a real run has an agent propose them from the failed trajectories); "
          f"{len(kept)} kept with failed examples" + (f", dropped for having none: {', '.join(dropped)}" if dropped
                                                      else "") + f" -> {select_dir / 'candidates.json'}")

    stale = remove_stale_label_files(select_dir / "labels", n_runs)
    if stale:
        print(f"      removed {len(stale)} label files of an earlier demo with more labelers: "
              f"{', '.join(path.name for path in stale)}")
    run_paths = []
    for run in range(1, n_runs + 1):
        records = rule_labeler.noisy_labeler(verdicts, run)
        atomic_write_jsonl(select_dir / "labels" / f"labels_{run:02d}.jsonl", records)
        run_file = labels_to_run(records, summary, attempt=run)
        run_paths.append(atomic_write_json(select_dir / "labels" / f"run_{run:02d}.json", run_file))
    print(f"[3/4] {n_runs} stand-in labelers, NOT an LLM: rules + seeded per-labeler noise. The rules read each "
          f"task's whole gold action list, which real labelers never see (their summary shows only the failed "
          f"checks) -> {select_dir / 'labels'}/run_*.json")

    report = aggregate(run_paths, candidates=candidates, rho=rho, delta=delta, k=k)
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    export, report_path = write_outputs(report, select_dir / "selected_capabilities.json")
    print(f"[4/4] aggregated (rho={rho}, delta={delta}, K={k} of N={n_runs}) -> {export}, {report_path}")
    return report


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.tau2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "demo_tau2")
    parser.add_argument("--runs", type=int, default=10, help="number of stand-in labelers (default 10)")
    parser.add_argument("--k", type=int, default=8, help="runs a capability must pass (default 8)")
    parser.add_argument("--rho", type=float, default=0.10)
    parser.add_argument("--delta", type=float, default=0.20)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not TAU2_RESULTS:
        print(f"error: no τ²-bench results found under {REPO_ROOT / 'tests/fixtures/real/tau2-bench'}", file=sys.stderr)
        return 2
    # The aggregation's thresholds and the run folder, before any of the 22 files is written.
    AggregationConfig(rho=args.rho, delta=args.delta, k=args.k)
    if args.k > args.runs:
        raise InputError(f"--k {args.k} must be <= --runs {args.runs}")
    check_output_folder(args.run_dir / "select" / "labels", "--run-dir")

    print(BANNER)
    print("TRACE demo, Step 1: capability selection on real τ²-bench results (gpt-4.1, airline + retail)")
    print("Candidates are FIXED and labels come from a documented RULE-BASED STAND-IN for LLM labelers")
    print("(demo/rule_labeler.py) that reads the tasks' gold actions; no model is called.")
    print(BANNER)
    try:
        report = run_selection(args.run_dir, args.runs, args.k, args.rho, args.delta)
    except (InputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print()
    print(format_table(report))
    print()
    selected = report["selected"]
    print(f"selected capabilities ({len(selected)}): {', '.join(selected) if selected else 'none'}")
    print(f"next for Step 2: python -m pipeline.capabilities next --file {args.run_dir / 'select' / 'selected_capabilities.json'}")
    print()
    print("Not run by this demo yet: Phase 1 proposal by an agent and LLM labelers (python -m "
          "pipeline.label_trajectories does both against any OpenAI-compatible server), Step 2 environment "
          "generation, Step 3 GRPO training, Step 4 the gate.")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
