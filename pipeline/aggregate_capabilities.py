"""Aggregate capability-labeling runs and select capabilities (TRACE Step 1, dual threshold + consistency).

Each labeling run r (one file per labeler) puts every trajectory, for every capability c, in one of
three categories — NA, PRESENT, LACKING — separately for failed and passed trajectories
(LF/PF/NF on failed, LP/PP/NP on passed). Per run and capability:

    Cov_r(c) = |LF| / total_failed                       (NA trajectories stay in the denominator)
    Δ_r(c)   = |LF| / (|LF| + |PF|) − |LP| / (|LP| + |PP|)  (each ratio 0 when its denominator is 0)

c passes run r when Cov_r ≥ ρ and Δ_r ≥ δ; c is selected when it passes at least K of the N runs.
A capability missing from a run file does not pass that run; its mean/std Cov and Δ are taken over
the runs that label it (`n_runs_labeled` in the report says how many).

Trajectories whose outcome is unknown (`passed: null` in the `_summarize` output) cannot be used:
they belong in neither the failed nor the passed lists, nor in `totals` (`labels_to_run` drops them).

Beyond the reference implementation, the report carries:
- Fleiss' κ per capability: the trajectories are the subjects, the runs that label the capability
  are the raters, NA/PRESENT/LACKING the categories; only trajectories labeled by all those runs
  count. When every label is the same category, P_e = 1 and κ is 0/0; it is reported as 1.0 then
  (observed agreement is 1 in that case). κ is null with fewer than 2 labeling runs.
- a bootstrap 90% interval for mean Δ: the labeled runs resampled with replacement
  (`n_bootstrap` resamples, numpy generator seeded with `seed`, so the interval is deterministic),
  5th and 95th percentiles of the resampled means.

Usage (as a script or with -m):
    python pipeline/aggregate_capabilities.py --runs 'runs/labels/run_*.json' \\
        --candidates candidates.json --rho 0.10 --delta 0.20 --k 8 --export pipeline/selected_capabilities.json
writes the selected list to --export and every candidate with its verdict to `<export stem>_report.json`.
"""
from __future__ import annotations

import argparse
import glob
import math
import sys
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Iterable, Sequence

if __package__ in (None, ""):  # run as `python pipeline/aggregate_capabilities.py`: make `pipeline` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from pipeline._io import InputError, atomic_write_json, load_json

CATEGORIES = ("NA", "PRESENT", "LACKING")  # category code = position, used for Fleiss' κ
FAILED_KEYS = ("na_failed", "present_failed", "lacking_failed")  # same order as CATEGORIES
PASSED_KEYS = ("na_passed", "present_passed", "lacking_passed")
LABEL_KEYS = FAILED_KEYS + PASSED_KEYS
DEFAULT_EXPORT = "pipeline/selected_capabilities.json"
CI_LEVEL = 0.90
N_EXAMPLE_CASES = 8


@dataclass(frozen=True)
class AggregationConfig:
    """Selection thresholds. rho: minimum Cov, delta: minimum Δ, k: minimum number of passing runs,
    seed / n_bootstrap: the bootstrap interval for mean Δ."""

    rho: float = 0.10
    delta: float = 0.20
    k: int = 8
    seed: int = 0
    n_bootstrap: int = 2000

    def __post_init__(self) -> None:
        if not _is_number(self.rho) or not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1] (got {self.rho!r}); it is a fraction of failed trajectories, "
                             "e.g. --rho 0.10")
        if not _is_number(self.delta) or not -1.0 <= self.delta <= 1.0:
            raise ValueError(f"delta must be in [-1, 1] (got {self.delta!r}); it is a difference of two rates, "
                             "e.g. --delta 0.20")
        if not _is_int(self.k) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1 (got {self.k!r}); e.g. --k 8 for 10 runs")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an integer (got {self.seed!r})")
        if not _is_int(self.n_bootstrap) or self.n_bootstrap < 1:
            raise ValueError(f"n_bootstrap must be an integer >= 1 (got {self.n_bootstrap!r}); e.g. 2000")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ----------------------------------------------------------------------------------------------
# Loading and validation
# ----------------------------------------------------------------------------------------------

@dataclass
class RunLabels:
    """One validated labeling run: per capability, the six id lists (ids as strings)."""

    path: str
    attempt: int
    total_failed: int
    total_passed: int
    labels: dict[str, dict[str, list[str]]]


def _id_list(value: Any, where: str) -> list[str]:
    """A list of trajectory ids as strings (ints are accepted and converted)."""
    if not isinstance(value, list):
        raise InputError(f"{where}: must be a list of trajectory ids (got {type(value).__name__})")
    if set(map(type, value)) <= {str}:  # the common case, checked at C speed
        return value
    converted = []
    for item in value:
        if isinstance(item, str):
            converted.append(item)
        elif _is_int(item):
            converted.append(str(item))
        else:
            raise InputError(f"{where}: trajectory ids must be strings (got {item!r})")
    return converted


def _find_repeat(lists: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The first id that occurs more than once across `lists`, with the names of the lists holding it."""
    where: dict[str, list[str]] = {}
    for key, ids in lists.items():
        for traj_id in ids:
            where.setdefault(traj_id, []).append(key)
            if len(where[traj_id]) > 1:
                return traj_id, where[traj_id]
    raise RuntimeError("_find_repeat called on lists without a repeated id")


def validate_run(data: Any, source: str) -> RunLabels:
    """Check one run object against the schema; InputError naming `source` and the problem otherwise.

    Schema: {"attempt": int, "totals": {"total_failed": int, "total_passed": int},
             "labels": {capability: {lacking_failed, present_failed, na_failed, lacking_passed, present_passed,
             na_passed: [ids]}}}; within a capability an id occurs in one list only, the three failed lists
    hold total_failed ids and the three passed lists total_passed.
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: a run file must be a JSON object (got {type(data).__name__})")
    for key in ("attempt", "totals", "labels"):
        if key not in data:
            raise InputError(f"{source}: missing key '{key}'")
    if not _is_int(data["attempt"]):
        raise InputError(f"{source}: 'attempt' must be an integer (got {data['attempt']!r})")
    totals = data["totals"]
    if not isinstance(totals, dict):
        raise InputError(f"{source}: 'totals' must be an object with total_failed and total_passed")
    for key in ("total_failed", "total_passed"):
        if key not in totals:
            raise InputError(f"{source}: missing key 'totals.{key}'")
        if not _is_int(totals[key]) or totals[key] < 0:
            raise InputError(f"{source}: 'totals.{key}' must be a non-negative integer (got {totals[key]!r})")
    if not isinstance(data["labels"], dict):
        raise InputError(f"{source}: 'labels' must be an object mapping capability names to label lists")
    labels: dict[str, dict[str, list[str]]] = {}
    for capability, lists in data["labels"].items():
        where = f"{source}: labels[{capability!r}]"
        if not isinstance(lists, dict):
            raise InputError(f"{where} must be an object with the lists {', '.join(LABEL_KEYS)}")
        missing = [key for key in LABEL_KEYS if key not in lists]
        if missing:
            raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
        clean = {key: _id_list(lists[key], f"{where}.{key}") for key in LABEL_KEYS}
        n_ids = sum(len(ids) for ids in clean.values())
        if len(set().union(*clean.values())) != n_ids:
            traj_id, keys = _find_repeat(clean)
            place = f"twice in {keys[0]}" if keys[0] == keys[1] else f"in both {keys[0]} and {keys[1]}"
            raise InputError(f"{where}: trajectory id {traj_id!r} occurs {place}; each trajectory gets one label")
        n_failed = sum(len(clean[key]) for key in FAILED_KEYS)
        n_passed = sum(len(clean[key]) for key in PASSED_KEYS)
        if n_failed != totals["total_failed"]:
            raise InputError(f"{where}: the failed lists hold {n_failed} ids but totals.total_failed is "
                             f"{totals['total_failed']}; every failed trajectory needs exactly one label")
        if n_passed != totals["total_passed"]:
            raise InputError(f"{where}: the passed lists hold {n_passed} ids but totals.total_passed is "
                             f"{totals['total_passed']}; every passed trajectory needs exactly one label")
        labels[str(capability)] = clean
    return RunLabels(source, data["attempt"], totals["total_failed"], totals["total_passed"], labels)


def load_run(path: str | Path) -> RunLabels:
    """Read and validate one run file."""
    return validate_run(load_json(path), str(path))


def load_candidates(source: str | Path | dict) -> dict[str, str]:
    """Candidate name -> description from `{"candidates": [{"name", "description", ...}]}`, in file order."""
    data = source if isinstance(source, dict) else load_json(source)
    name = "candidates" if isinstance(source, dict) else str(source)
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
        raise InputError(f"{name}: expected an object with a 'candidates' list")
    descriptions: dict[str, str] = {}
    for index, entry in enumerate(data["candidates"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise InputError(f"{name}: candidates[{index}] needs a non-empty string 'name'")
        description = entry.get("description", "")
        if not isinstance(description, str):
            raise InputError(f"{name}: candidates[{index}].description must be a string")
        if entry["name"] in descriptions:
            raise InputError(f"{name}: candidate {entry['name']!r} is listed twice")
        descriptions[entry["name"]] = description
    return descriptions


def expand_run_globs(patterns: Sequence[str]) -> list[str]:
    """Files matched by each glob (sorted per glob, duplicates dropped); a glob that matches nothing is an error."""
    paths: list[str] = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern))
        if not matched and Path(pattern).is_file():  # a literal name with glob characters in it
            matched = [pattern]
        if not matched:
            raise InputError(f"--runs {pattern}: matches no file")
        paths.extend(matched)
    return list(dict.fromkeys(paths))


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------

def run_metrics(lists: dict[str, list[str]], total_failed: int) -> dict[str, float | int]:
    """Cov, Δ and the two lacking rates of one capability in one run."""
    n_lf, n_pf = len(lists["lacking_failed"]), len(lists["present_failed"])
    n_lp, n_pp = len(lists["lacking_passed"]), len(lists["present_passed"])
    cov = n_lf / total_failed if total_failed else 0.0
    er_minus = n_lf / (n_lf + n_pf) if n_lf + n_pf else 0.0  # lacking rate among applicable failed
    er_plus = n_lp / (n_lp + n_pp) if n_lp + n_pp else 0.0  # lacking rate among applicable passed
    return {"cov": cov, "delta": er_minus - er_plus, "er_minus": er_minus, "er_plus": er_plus,
            "n_lacking_failed": n_lf, "n_present_failed": n_pf, "n_na_failed": len(lists["na_failed"]),
            "n_lacking_passed": n_lp, "n_present_passed": n_pp, "n_na_passed": len(lists["na_passed"])}


def fleiss_kappa(counts: np.ndarray) -> float | None:
    """Fleiss' κ from a count matrix.

    counts: (n_subjects, n_categories) ints, counts[i, j] = raters who put subject i in category j;
    every row must sum to the same number of raters n >= 2. Returns None without subjects or with
    fewer than 2 raters, and 1.0 when P_e = 1 (all labels in one category: perfect agreement).
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] == 0:
        return None
    n_raters = counts[0].sum()
    if not np.all(counts.sum(axis=1) == n_raters):
        raise ValueError("fleiss_kappa needs the same number of raters for every subject")
    if n_raters < 2:
        return None
    p_category = counts.sum(axis=0) / counts.sum()  # (n_categories,)
    p_subject = ((counts * counts).sum(axis=1) - n_raters) / (n_raters * (n_raters - 1))  # (n_subjects,)
    p_bar = float(p_subject.mean())
    p_e = float((p_category * p_category).sum())
    if 1.0 - p_e < 1e-12:  # one category only: κ is 0/0; agreement is perfect, report 1.0
        return 1.0
    return (p_bar - p_e) / (1.0 - p_e)


def bootstrap_mean_ci(values: Sequence[float], n_resamples: int, seed: int,
                      level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement, seeded)."""
    values = np.asarray(values, dtype=np.float64)  # (n_runs,)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(n_resamples, len(values)))  # (n_resamples, n_runs)
    means = values[picks].mean(axis=1)  # (n_resamples,)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _capability_kappa(runs: list[RunLabels], capability: str) -> tuple[float | None, int]:
    """(Fleiss' κ, number of trajectories used) over the runs that label `capability`."""
    labeling = [run.labels[capability] for run in runs if capability in run.labels]
    if len(labeling) < 2:
        return None, 0
    # Integer index per trajectory id, over all runs (dict.fromkeys keeps this at C speed).
    all_ids = chain.from_iterable(lists[key] for lists in labeling for key in LABEL_KEYS)
    index = {traj_id: i for i, traj_id in enumerate(dict.fromkeys(all_ids))}
    counts = np.zeros((len(index), len(CATEGORIES)), dtype=np.int64)  # (n_trajectories, 3)
    for lists in labeling:
        for code in range(len(CATEGORIES)):
            for key in (FAILED_KEYS[code], PASSED_KEYS[code]):
                ids = lists[key]
                rows = np.array(list(map(index.__getitem__, ids)), dtype=np.int64)  # (len(ids),)
                counts[rows, code] += 1  # rows are unique within one list (validated), so += is safe
    complete = counts.sum(axis=1) == len(labeling)  # labeled by every run that labels this capability
    return fleiss_kappa(counts[complete]), int(complete.sum())


# ----------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------

def _verdict(n_passed: int, n_total: int, k: int, n_low_cov: int, n_low_delta: int, n_missing: int,
             config: AggregationConfig) -> str:
    if n_passed >= k:
        return f"passed {n_passed}/{n_total} runs >= K={k}"
    why = []
    if n_low_cov:
        why.append(f"Cov < rho={config.rho:g} in {n_low_cov} run(s)")
    if n_low_delta:
        why.append(f"Δ < delta={config.delta:g} in {n_low_delta} run(s)")
    if n_missing:
        why.append(f"not labeled in {n_missing} run(s)")
    return f"passed {n_passed}/{n_total} runs < K={k}" + (f" ({'; '.join(why)})" if why else "")


def _summarize_capability(capability: str, runs: list[RunLabels], description: str,
                          config: AggregationConfig) -> dict:
    per_run = []
    n_low_cov = n_low_delta = n_missing = 0
    for run in runs:
        entry: dict[str, Any] = {"run": run.path, "attempt": run.attempt}
        if capability not in run.labels:
            n_missing += 1
            entry.update(labeled=False, passed=False, failed_thresholds=["missing"])
            per_run.append(entry)
            continue
        metrics = run_metrics(run.labels[capability], run.total_failed)
        failed = [name for name, ok in (("cov", metrics["cov"] >= config.rho),
                                        ("delta", metrics["delta"] >= config.delta)) if not ok]
        n_low_cov += "cov" in failed
        n_low_delta += "delta" in failed
        entry.update(labeled=True, **metrics, passed=not failed, failed_thresholds=failed)
        per_run.append(entry)
    covs = np.array([e["cov"] for e in per_run if e["labeled"]])  # (n_runs_labeled,)
    deltas = np.array([e["delta"] for e in per_run if e["labeled"]])  # (n_runs_labeled,)
    n_passed = sum(e["passed"] for e in per_run)
    lacking_union = set()
    for run in runs:
        if capability in run.labels:
            lacking_union.update(run.labels[capability]["lacking_failed"])
    kappa, kappa_n = _capability_kappa(runs, capability)
    labeled = len(deltas) > 0
    return {
        "skill": capability,
        "description": description,
        "selected": n_passed >= config.k,
        "reason": _verdict(n_passed, len(runs), config.k, n_low_cov, n_low_delta, n_missing, config),
        "mean_cov": float(covs.mean()) if labeled else None,
        "std_cov": float(covs.std()) if labeled else None,  # population std over the labeled runs
        "mean_delta": float(deltas.mean()) if labeled else None,
        "std_delta": float(deltas.std()) if labeled else None,
        "delta_ci90": list(bootstrap_mean_ci(deltas, config.n_bootstrap, config.seed)) if labeled else None,
        "fleiss_kappa": kappa,
        "kappa_n_trajectories": kappa_n,
        "n_runs_passed": int(n_passed),
        "n_runs_labeled": int(len(deltas)),
        "n_runs_total": len(runs),
        "example_failed_cases": sorted(lacking_union)[:N_EXAMPLE_CASES],
        "per_run": per_run,
    }


def _sort_key(entry: dict) -> tuple:
    """Highest mean Δ first; never-labeled capabilities last; ties by name."""
    mean_delta = entry["mean_delta"]
    return (mean_delta is None, -(mean_delta or 0.0), entry["skill"])


def aggregate(run_paths: Sequence[str | Path], candidates: str | Path | dict | None = None, rho: float = 0.10,
              delta: float = 0.20, k: int = 8, seed: int = 0, n_bootstrap: int = 2000) -> dict:
    """Load and validate the run files, score every capability, and return the full report.

    The report: {"params": {...}, "capabilities": [one entry per capability, highest mean Δ first, with
    "selected" and "reason"], "selected": [names], "notes": [...]}. `selected_entries(report)` turns
    it into the export list. Raises InputError for bad files or K > number of runs, ValueError for bad
    thresholds.
    """
    config = AggregationConfig(rho=rho, delta=delta, k=k, seed=seed, n_bootstrap=n_bootstrap)
    run_paths = [str(p) for p in run_paths]
    if not run_paths:
        raise InputError("no run files given")
    if config.k > len(run_paths):
        raise InputError(f"--k {config.k} is larger than the number of run files ({len(run_paths)}); "
                         f"use --k {len(run_paths)} or fewer, or add runs")
    descriptions = load_candidates(candidates) if candidates is not None else {}
    runs = [load_run(path) for path in run_paths]
    names = list(descriptions)
    for run in runs:
        names.extend(name for name in run.labels if name not in descriptions)
    names = list(dict.fromkeys(names))
    entries = [_summarize_capability(name, runs, descriptions.get(name, ""), config) for name in names]
    notes = ["A capability missing from a run file does not pass that run; its means/stds are over the runs "
             "that label it (n_runs_labeled).",
             "fleiss_kappa: raters = runs labeling the capability, subjects = trajectories labeled by all of "
             "them, categories NA/PRESENT/LACKING; 1.0 when all labels are one category (P_e = 1); null with < 2 "
             "runs.",
             f"delta_ci90: percentile bootstrap over runs ({config.n_bootstrap} resamples, seed {config.seed}).",
             "Trajectories with unknown outcome (passed = null) are not part of any run."]
    if candidates is not None:
        extra = [name for name in names if name not in descriptions]
        for entry in entries:
            entry["in_candidates"] = entry["skill"] in descriptions
        if extra:
            notes.append(f"labeled but not in the candidates file: {', '.join(extra)}")
    entries.sort(key=_sort_key)
    return {
        "params": {"rho": config.rho, "delta": config.delta, "k": config.k, "n_runs": len(runs),
                   "seed": config.seed, "n_bootstrap": config.n_bootstrap, "runs": run_paths,
                   "attempts": [run.attempt for run in runs]},
        "capabilities": entries,
        "selected": [entry["skill"] for entry in entries if entry["selected"]],
        "notes": notes,
    }


def selected_entries(report: dict) -> list[dict]:
    """The export list: selected capabilities, highest mean Δ first, each marked PENDING."""
    return [{"skill": e["skill"], "description": e["description"], "mean_cov": e["mean_cov"],
             "std_cov": e["std_cov"], "mean_delta": e["mean_delta"], "std_delta": e["std_delta"],
             "n_runs_passed": e["n_runs_passed"], "n_runs_total": e["n_runs_total"], "passes_consistency": True,
             "example_failed_cases": e["example_failed_cases"], "status": "PENDING"}
            for e in report["capabilities"] if e["selected"]]


def report_path_for(export_path: str | Path) -> Path:
    """`<export stem>_report.json` next to the export file."""
    export_path = Path(export_path)
    return export_path.with_name(f"{export_path.stem}_report.json")


def write_outputs(report: dict, export_path: str | Path) -> tuple[Path, Path]:
    """Write the selected list to `export_path` and the full report next to it (both atomically)."""
    report_path = atomic_write_json(report_path_for(export_path), report)
    return atomic_write_json(export_path, selected_entries(report)), report_path


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(report: dict) -> str:
    """One row per capability: mean Cov, mean Δ ± std, 90% CI, κ, runs passed, verdict."""
    entries = report["capabilities"]
    width = max([len("capability")] + [len(e["skill"]) for e in entries])
    header = (f"{'capability':<{width}}  {'mean Cov':>8}  {'mean Δ ± std':>15}  {'90% CI of Δ':>17}  "
              f"{'κ':>6}  {'runs':>7}  verdict")
    lines = [header, "-" * len(header)]
    for e in entries:
        delta = "-" if e["mean_delta"] is None else f"{e['mean_delta']:+.3f} ± {e['std_delta']:.3f}"
        ci = "-" if e["delta_ci90"] is None else f"[{e['delta_ci90'][0]:+.3f}, {e['delta_ci90'][1]:+.3f}]"
        runs = f"{e['n_runs_passed']}/{e['n_runs_total']}"
        verdict = "SELECTED" if e["selected"] else f"rejected: {e['reason']}"
        lines.append(f"{e['skill']:<{width}}  {_fmt(e['mean_cov']):>8}  {delta:>15}  {ci:>17}  "
                     f"{_fmt(e['fleiss_kappa'], '.2f'):>6}  {runs:>7}  {verdict}")
    p = report["params"]
    lines.append(f"selected {len(report['selected'])}/{len(entries)} (rho={p['rho']:g}, delta={p['delta']:g}, "
                 f"K={p['k']} of N={p['n_runs']} runs)")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="aggregate_capabilities",
                                     description="Select capabilities from labeling runs (Cov >= rho, Δ >= delta "
                                                 "in >= K runs).")
    parser.add_argument("--runs", nargs="+", required=True, help="run files or globs (quote globs)")
    parser.add_argument("--candidates", default=None, help="candidates.json with names and descriptions")
    parser.add_argument("--rho", type=float, default=0.10, help="minimum Cov per run (default 0.10)")
    parser.add_argument("--delta", type=float, default=0.20, help="minimum Δ per run (default 0.20)")
    parser.add_argument("--k", type=int, default=8, help="minimum number of passing runs (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--n-bootstrap", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--export", default=DEFAULT_EXPORT, help=f"selected list output (default {DEFAULT_EXPORT})")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        AggregationConfig(rho=args.rho, delta=args.delta, k=args.k, seed=args.seed, n_bootstrap=args.n_bootstrap)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        run_paths = expand_run_globs(args.runs)
        report = aggregate(run_paths, candidates=args.candidates, rho=args.rho, delta=args.delta, k=args.k,
                           seed=args.seed, n_bootstrap=args.n_bootstrap)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(report))
    export_path, report_path = write_outputs(report, args.export)
    print(f"wrote {export_path} ({len(report['selected'])} selected) and {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
