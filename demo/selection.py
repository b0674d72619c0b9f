"""Step 1 of the CPU demo on the base agent's storefront results, scored against the planted deficits.

What the stand-in labelers see is what an LLM labeler would: each simulation's messages and its evaluation
details (`reward_info`: the action checks, which list the gold actions with their verdicts, communicate
and policy checks). They do not see the planted flaws, the demonstrations, or a task's hidden capability
record. The rules are `demo/rule_labeler.py`'s, the noise is per labeler (`noisy_labeler`), and the
files are the pipeline's own formats (summary.jsonl, candidates.json, labels/run_NN.json,
selected_capabilities.json and its report), so `pipeline.aggregate_capabilities` could be re-run by hand.
With an LLM endpoint, `python -m pipeline.label_trajectories` over the same summary replaces the rules; its cache
of finished calls lives beside the step folder (`select_cache/`, see `llm_label_cache`), so a rerun after a
failed or interrupted labeling pays only for the calls still missing.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from benchmarks.results import load_results
from benchmarks.storefront.flaws import FLAW_CAPABILITY
from common.io import atomic_write_json, atomic_write_jsonl, load_json
from common.validation import InputError
from demo import rule_labeler
from pipeline.summarize import summarize_paths
from pipeline.aggregate_capabilities import aggregate, format_table, write_outputs
from pipeline.labels_to_run import labels_to_run


def precision_recall(selected: list[str], planted: list[str]) -> dict[str, Any]:
    """Precision and recall of `selected` against `planted` (None where undefined: nothing selected/planted)."""
    hits = sorted(set(selected) & set(planted))
    return {"selected": sorted(selected), "planted": sorted(planted), "true_positives": hits,
            "precision": len(hits) / len(selected) if selected else None,
            "recall": len(hits) / len(planted) if planted else None}


def select_on_results(results_path: Path, folder: Path, planted: dict[str, float], settings: Any) -> dict[str, Any]:
    """Summary -> candidates -> N noisy rule labelers -> aggregate; figures for the report."""
    summary = summarize_paths([results_path], max_chars=1500)
    atomic_write_jsonl(folder / "summary.jsonl", summary)
    simulations = load_results(results_path)["simulations"]
    if len(simulations) != len(summary):
        raise InputError(f"{results_path}: {len(simulations)} simulations but {len(summary)} summary records")
    # task=None: the gold plan comes from the simulation's own action checks (see rule_labeler.extract_evidence).
    verdicts = {record["id"]: rule_labeler.rule_labels(rule_labeler.extract_evidence(sim, None))
                for record, sim in zip(summary, simulations)}
    n_failed = sum(1 for r in summary if r["passed"] is False)
    planted_capabilities = sorted({FLAW_CAPABILITY[f] for f, share in planted.items() if share > 0})
    figures: dict[str, Any] = {"trajectories": len(summary), "failed": n_failed,
                               "planted_capabilities": planted_capabilities}
    candidates, dropped = rule_labeler.candidates_with_examples(verdicts, summary)
    atomic_write_json(folder / "candidates.json", candidates)
    kept = [c["name"] for c in candidates["candidates"]]
    figures["candidates"] = [c["name"] for c in rule_labeler.CANDIDATES]
    figures["dropped_without_failed_example"] = dropped
    n_passed = sum(1 for r in summary if r["passed"] is True)
    if not kept or n_failed == 0 or n_passed == 0:
        # Selection contrasts failed with passed trajectories; without both there is nothing to contrast.
        why = ("the base agent failed no analysis task" if n_failed == 0 else
               "the base agent passed no analysis task, so failed and passed trajectories cannot be contrasted "
               "(train the base agent longer: base.epochs / base.demonstrations)" if n_passed == 0 else
               "no candidate has a failed example")
        print(f"  Step 1 selects nothing: {why}", flush=True)
        figures.update(table="", why_empty=why, **precision_recall([], planted_capabilities))
        return figures
    if settings.labeler_url:
        report = _llm_labelers(folder, settings)
        return _figures_from_report(figures, report, planted_capabilities, labelers="llm")
    verdicts = {tid: {name: labels[name] for name in kept} for tid, labels in verdicts.items()}
    run_paths = []
    for run in range(1, settings.runs + 1):
        records = rule_labeler.noisy_labeler(verdicts, run, miss_rate=settings.miss_rate,
                                             false_alarm_rate=settings.false_alarm_rate)
        atomic_write_jsonl(folder / "labels" / f"labels_{run:02d}.jsonl", records)
        run_paths.append(atomic_write_json(folder / "labels" / f"run_{run:02d}.json",
                                           labels_to_run(records, summary, attempt=run)))
    report = aggregate(run_paths, candidates=candidates, rho=settings.rho, delta=settings.delta, k=settings.k)
    write_outputs(report, folder / "selected_capabilities.json")
    return _figures_from_report(figures, report, planted_capabilities, labelers="rules")


def llm_label_cache(folder: Path, labeler_url: str) -> Path:
    """Where the LLM labelers of the step folder `folder` keep their finished calls: beside the folder, not in it.

    The demo deletes an unfinished step's folder before running it again; a cache inside it would make a rerun after
    a failed or interrupted labeling pay for every call again. Its keys cover the model, the prompt (the summary's
    transcripts and the candidates), the sampling parameters and the run, but not the endpoint, so each
    `labeler_url` gets its own file: another server answering under the same model name is never mixed in."""
    endpoint = hashlib.sha256(labeler_url.encode("utf-8")).hexdigest()[:12]
    return step_cache_dir(folder) / f"label_cache_{endpoint}.jsonl"


def step_cache_dir(folder: Path) -> Path:
    """Where the demo step in `folder` keeps what it paid for across reruns: beside the folder (`<name>_cache`),
    which the demo deletes before running the step again; `--fresh` deletes this one too."""
    return folder.with_name(f"{folder.name}_cache")


def _llm_labelers(folder: Path, settings: Any) -> dict[str, Any]:
    """N LLM labelers through pipeline.label_trajectories; returns the aggregation report it wrote."""
    from pipeline import label_trajectories

    argv = [str(folder / "summary.jsonl"), "--out", str(folder / "llm"), "--base-url", settings.labeler_url,
            "--model", settings.labeler_model, "--api-key-env", settings.labeler_api_key_env,
            "--runs", str(settings.runs), "--k", str(settings.k), "--rho", str(settings.rho),
            "--delta", str(settings.delta), "--export", str(folder / "selected_capabilities.json"),
            "--cache", str(llm_label_cache(folder, settings.labeler_url))]
    argv += ["--propose"] if settings.propose else ["--candidates", str(folder / "candidates.json")]
    print(f"  labeling with {settings.runs} LLM labelers: {settings.labeler_model} at {settings.labeler_url}",
          flush=True)
    code = label_trajectories.main(argv)
    if code == label_trajectories.INTERRUPTED:  # Ctrl-C: it printed its line; the demo stops as interrupted too
        raise KeyboardInterrupt
    if code != 0:
        raise InputError(f"LLM labeling failed (pipeline.label_trajectories exited {code}); see the message above")
    return load_json(folder / "selected_capabilities_report.json")


def _figures_from_report(figures: dict[str, Any], report: dict[str, Any], planted_capabilities: list[str],
                         labelers: str) -> dict[str, Any]:
    table = format_table(report)
    print(table, flush=True)
    figures.update(table=table, labelers=labelers,
                   capabilities={c["skill"]: {key: c.get(key) for key in
                                              ("selected", "n_runs_passed", "mean_cov", "mean_delta", "fleiss_kappa")}
                                 for c in report["capabilities"]},
                   **precision_recall(list(report["selected"]), planted_capabilities))
    return figures
