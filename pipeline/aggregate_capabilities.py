"""Aggregate capability-labeling runs and select capabilities (TRACE Step 1, dual threshold + consistency).

Each labeling run r (one file per labeler) puts every trajectory, for every capability c, in one of
three categories — NA, PRESENT, LACKING — separately for failed and passed trajectories
(LF/PF/NF on failed, LP/PP/NP on passed). Per run and capability:

    Cov_r(c) = |LF| / total_failed                       (NA trajectories stay in the denominator)
    Δ_r(c)   = |LF| / (|LF| + |PF|) − |LP| / (|LP| + |PP|)  (each ratio 0 when its denominator is 0)

c passes run r when Cov_r ≥ ρ and Δ_r ≥ δ; c is selected when it passes at least K of the N runs.
Both comparisons are exact: Cov and Δ are ratios of counts and are compared as fractions with the
thresholds as written (δ = 0.20 is 1/5), so LF=3, PF=7, LP=1, PP=9 gives Δ = 3/10 − 1/10 = 1/5 and passes
δ = 0.20 (in floating point it would be 0.19999999999999998 and fail).
A capability missing from a run file does not pass that run; its mean/std Cov and Δ are taken over
the runs that label it (`n_runs_labeled` in the report says how many).

The runs must describe the same trajectories: within a run every capability labels the same failed and
passed ids, and across runs a trajectory never changes sides (failed in one run, passed in another).
A run that leaves out or adds more than a tenth of the trajectories most runs label (and more than
one) was labeled from another summary and is refused; a smaller difference (a labeler skipped a
trajectory) is a warning, and that run's Cov and Δ are over the trajectories it labels. A run file
with no labels, one file listed twice (however spelled), and two files with the same attempt and the
same labels (a copy, which would count one labeler twice) are refused too; --runs patterns that
overlap match each file once. Refusals exit 2 with the reason. Runs with different attempts that hold identical
labels for every pair draw a warning (they are rarely independent labelers: a copy, or greedy decoding).

Trajectories whose outcome is unknown (`passed: null` in the `_summarize` output) cannot be used:
they belong in neither the failed nor the passed lists, nor in `totals` (`labels_to_run` drops them).

Beyond the reference implementation, the report carries:
- Fleiss' κ per capability: the trajectories are the subjects, the runs that label the capability
  are the raters, NA/PRESENT/LACKING the categories; only trajectories labeled by all those runs
  count. When every label is the same category, P_e = 1 and κ is 0/0; it is reported as 1.0 then
  (observed agreement is 1 in that case). κ is null with fewer than 2 labeling runs.
- a bootstrap 90% interval for mean Δ: the labeled runs resampled with replacement
  (`n_bootstrap` resamples, at most 1,000,000, numpy generator seeded with `seed`, so the interval is
  deterministic), 5th and 95th percentiles of the resampled means.
- `example_failed_cases`: up to 8 failed trajectories labeled LACKING, the ones most runs agree on first,
  spread over domains (the `<domain>:` prefix `_summarize` gives τ²-bench ids; the repository of a
  SWE-bench instance id) and over tasks (`<task>#<sample>` ids of one task are taken once before any
  task is taken twice), so the examples are not all from the first domain in lexical order.

Usage (as a script or with -m):
    python pipeline/aggregate_capabilities.py --runs 'runs/labels/run_*.json' \\
        --candidates candidates.json --rho 0.10 --delta 0.20 --k 8 --export pipeline/selected_capabilities.json
writes the selected list to --export and every candidate with its verdict to `<export stem>_report.json`.
Both output paths are checked before any run file is read; a bad one exits 2 and nothing is written.
An export already there is Step 2's queue (pipeline/capabilities.py sets IN_PROGRESS / DONE): a capability
selected again keeps its status and Step 2's fields, one no longer selected leaves the list (named when it was
IN_PROGRESS or DONE, its entry kept in the report under `queue.no_longer_selected`); an existing export that is
not a selected list is refused (exit 2) before any run file is read.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import chain
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from common.cli import cli_entry, exit_code, seed_value
from common.io import Inputs, atomic_write_json, check_output_path, load_json
from common.validation import InputError
from pipeline.capabilities import load_selected, locked

CATEGORIES = ("NA", "PRESENT", "LACKING")  # category code = position, used for Fleiss' κ
FAILED_KEYS = ("na_failed", "present_failed", "lacking_failed")  # same order as CATEGORIES
PASSED_KEYS = ("na_passed", "present_passed", "lacking_passed")
LABEL_KEYS = FAILED_KEYS + PASSED_KEYS
DEFAULT_EXPORT = "pipeline/selected_capabilities.json"
CI_LEVEL = 0.90
N_EXAMPLE_CASES = 8
MAX_BOOTSTRAP = 1_000_000  # resamples; far more than a 90% interval over ~10 runs needs
BOOTSTRAP_CHUNK = 100_000  # resamples drawn at a time, so memory stays small whatever n_bootstrap is
MAX_RUN_MISMATCH = 0.10  # share of trajectories a run may leave out or add before it is refused


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
            raise InputError(f"rho must be in [0, 1] (got {self.rho!r}); it is a fraction of failed trajectories, "
                             "e.g. --rho 0.10")
        if not _is_number(self.delta) or not -1.0 <= self.delta <= 1.0:
            raise InputError(f"delta must be in [-1, 1] (got {self.delta!r}); it is a difference of two rates, "
                             "e.g. --delta 0.20")
        if not _is_int(self.k) or self.k < 1:
            raise InputError(f"k must be an integer >= 1 (got {self.k!r}); e.g. --k 8 for 10 runs")
        if not _is_int(self.seed):
            raise InputError(f"seed must be an integer (got {self.seed!r})")
        if not _is_int(self.n_bootstrap) or not 1 <= self.n_bootstrap <= MAX_BOOTSTRAP:
            raise InputError(f"n_bootstrap must be an integer from 1 to {MAX_BOOTSTRAP:,} (got {self.n_bootstrap!r}); "
                             "e.g. --n-bootstrap 2000")

    @property
    def exact_rho(self) -> Fraction:
        return exact_threshold(self.rho)

    @property
    def exact_delta(self) -> Fraction:
        return exact_threshold(self.delta)


def exact_threshold(value: float) -> Fraction:
    """The number a threshold was written as (0.2 -> 1/5), not the binary float nearest to it (which is
    0.200000000000000011...): `repr` of a float is the shortest decimal that reads back to it. The value is made a
    plain float first: numpy 2 writes repr(np.float64(0.1)) as 'np.float64(0.1)', which Fraction cannot read."""
    return Fraction(repr(float(value)))


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
    failed_ids: frozenset[str] = field(default_factory=frozenset)  # every capability labels exactly these
    passed_ids: frozenset[str] = field(default_factory=frozenset)


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
    if not data["labels"]:
        raise InputError(f"{source}: 'labels' is empty: this labeler labeled no capability (an empty labels file?); "
                         "run the labeler again, or leave this file out of --runs")
    labels: dict[str, dict[str, list[str]]] = {}
    sides: tuple[str, frozenset[str], frozenset[str]] | None = None  # (first capability, failed ids, passed ids)
    for capability, lists in data["labels"].items():
        where = f"{source}: labels[{capability!r}]"
        if not isinstance(lists, dict):
            raise InputError(f"{where} must be an object with the lists {', '.join(LABEL_KEYS)}")
        missing = [key for key in LABEL_KEYS if key not in lists]
        if missing:
            raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
        clean = {key: _id_list(lists[key], f"{where}.{key}") for key in LABEL_KEYS}
        n_ids = sum(len(ids) for ids in clean.values())
        all_ids = frozenset().union(*clean.values())
        if len(all_ids) != n_ids:
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
        failed_ids = frozenset().union(*(clean[key] for key in FAILED_KEYS))
        passed_ids = all_ids - failed_ids
        if sides is None:
            sides = (str(capability), failed_ids, passed_ids)
        elif (failed_ids, passed_ids) != sides[1:]:
            first, first_failed, first_passed = sides
            odd = min((failed_ids ^ first_failed) | (passed_ids ^ first_passed))
            if odd in all_ids and odd in first_failed | first_passed:
                here, there = ("failed" if odd in ids else "passed" for ids in (failed_ids, first_failed))
                detail = f"trajectory {odd!r} is {here} here but {there} under {first!r}"
            else:
                holder = str(capability) if odd in all_ids else first
                detail = f"trajectory {odd!r} is labeled only under {holder!r}"
            raise InputError(f"{where}: labels other trajectories than labels[{first!r}] ({detail}); every "
                             "capability must label the same trajectories, each on the same side")
        labels[str(capability)] = clean
    return RunLabels(source, data["attempt"], totals["total_failed"], totals["total_passed"], labels,
                     failed_ids=sides[1], passed_ids=sides[2])


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
    """Files matched by each glob (sorted per glob); a glob that matches nothing is an error.

    A file matched more than once (overlapping globs, or one file spelled two ways: `runs/a.json` and
    `./runs/a.json`, a symlink) is kept once, under its first spelling: counting it twice would count one
    labeler twice.
    """
    paths: dict[str, str] = {}  # real path -> first spelling
    for pattern in patterns:
        matched = sorted(glob.glob(pattern))
        if not matched and Path(pattern).is_file():  # a literal name with glob characters in it
            matched = [pattern]
        if not matched:
            raise InputError(f"--runs {pattern}: matches no file")
        for path in matched:
            paths.setdefault(os.path.realpath(path), path)
    return list(paths.values())


def check_runs_agree(runs: Sequence[RunLabels]) -> list[str]:
    """Refuse runs that cannot be aggregated together; return warnings about smaller differences.

    InputError: a trajectory failed in one run and passed in another; a run that leaves out or adds more
    than MAX_RUN_MISMATCH of the trajectories most runs label, and more than one (it was labeled from
    another summary); two files with the same attempt and the same labels (one labeler counted twice).
    Warnings: a run that leaves out or adds a few trajectories; two files with the same attempt but
    different labels; runs that hold identical labels for every pair (one warning per group of them), whatever
    their attempt numbers: N copies of one labeler (greedy decoding, a copied file) are not N independent runs.
    """
    warnings: list[str] = []
    failed_union = frozenset().union(*(run.failed_ids for run in runs))
    passed_union = frozenset().union(*(run.passed_ids for run in runs))
    both = failed_union & passed_union
    if both:
        traj_id = min(both)
        failed_in = next(run.path for run in runs if traj_id in run.failed_ids)
        passed_in = next(run.path for run in runs if traj_id in run.passed_ids)
        raise InputError(f"trajectory {traj_id!r} is failed in {failed_in} but passed in {passed_in}: the runs were "
                         "labeled from different outcomes; label every run from the same summary.jsonl")
    counts = Counter(chain.from_iterable(run.failed_ids | run.passed_ids for run in runs))
    common = {traj_id for traj_id, count in counts.items() if count * 2 > len(runs)}  # labeled by most runs
    for run in runs:
        ids = run.failed_ids | run.passed_ids
        missing, extra = sorted(common - ids), sorted(ids - common)
        if not missing and not extra:
            continue
        parts = []
        if missing:
            parts.append(f"leaves out {len(missing)} of the {len(common)} trajectories most runs label "
                         f"({_some(missing)})")
        if extra:
            parts.append(f"labels {len(extra)} that most runs do not ({_some(extra)})")
        what = f"{run.path} {' and '.join(parts)}"
        if len(missing) + len(extra) > max(1.0, MAX_RUN_MISMATCH * len(common)):
            raise InputError(f"{what}: it was labeled from other trajectories (another summary.jsonl?); label every "
                             f"run from the same summary, or leave {run.path} out of --runs")
        warnings.append(f"{what}; its Cov and Δ are over the trajectories it labels")
    by_attempt: dict[int, list[RunLabels]] = {}
    for run in runs:
        by_attempt.setdefault(run.attempt, []).append(run)
    for attempt, group in sorted(by_attempt.items()):
        for index, run in enumerate(group):
            for other in group[:index]:
                if run.labels == other.labels:
                    raise InputError(f"{other.path} and {run.path} hold the same labels under attempt {attempt}: one "
                                     "labeler would count twice (a copied file?); remove one of them from --runs")
        if len(group) > 1:
            warnings.append(f"{', '.join(run.path for run in group)} all say attempt {attempt}; if they are different "
                            "labelers, give each its own attempt number")
    same_labels: dict[frozenset, list[RunLabels]] = {}
    for run in runs:  # whatever their attempt numbers (the same attempt with the same lists is refused above)
        signature = frozenset((capability, key, frozenset(ids))
                              for capability, lists in run.labels.items() for key, ids in lists.items())
        same_labels.setdefault(signature, []).append(run)
    for group in same_labels.values():
        if len(group) > 1:
            shown = ", ".join(run.path for run in group[:4]) + (" ..." if len(group) > 4 else "")
            warnings.append(f"{len(group)} runs hold identical labels for every (trajectory, capability) pair ("
                            f"{shown}): they look like one labeler counted {len(group)} times (a copied file, or "
                            "labelers at temperature 0), so passing K of N runs overstates the agreement; label "
                            "with sampling (temperature > 0) or leave the copies out of --runs")
    return warnings


def _some(ids: Sequence[str], n: int = 5) -> str:
    return ", ".join(map(repr, ids[:n])) + (" ..." if len(ids) > n else "")


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------

def exact_cov_delta(lists: dict[str, list[str]], total_failed: int) -> tuple[Fraction, Fraction]:
    """(Cov, Δ) of one capability in one run as exact fractions: what the thresholds are compared with."""
    n_lf, n_pf = len(lists["lacking_failed"]), len(lists["present_failed"])
    n_lp, n_pp = len(lists["lacking_passed"]), len(lists["present_passed"])
    cov = Fraction(n_lf, total_failed) if total_failed else Fraction(0)
    er_minus = Fraction(n_lf, n_lf + n_pf) if n_lf + n_pf else Fraction(0)
    er_plus = Fraction(n_lp, n_lp + n_pp) if n_lp + n_pp else Fraction(0)
    return cov, er_minus - er_plus


def run_metrics(lists: dict[str, list[str]], total_failed: int) -> dict[str, float | int]:
    """Cov, Δ and the two lacking rates of one capability in one run (Cov and Δ are the floats nearest to the
    exact fractions, so Δ = 3/10 − 1/10 is 0.2, not 0.19999999999999998)."""
    n_lf, n_pf = len(lists["lacking_failed"]), len(lists["present_failed"])
    n_lp, n_pp = len(lists["lacking_passed"]), len(lists["present_passed"])
    cov, delta = exact_cov_delta(lists, total_failed)
    er_minus = n_lf / (n_lf + n_pf) if n_lf + n_pf else 0.0  # lacking rate among applicable failed
    er_plus = n_lp / (n_lp + n_pp) if n_lp + n_pp else 0.0  # lacking rate among applicable passed
    return {"cov": float(cov), "delta": float(delta), "er_minus": er_minus, "er_plus": er_plus,
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
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement, seeded).

    Resamples are drawn BOOTSTRAP_CHUNK at a time, so memory stays bounded for any n_resamples.
    """
    values = np.asarray(values, dtype=np.float64)  # (n_runs,)
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples, dtype=np.float64)  # (n_resamples,)
    for start in range(0, n_resamples, BOOTSTRAP_CHUNK):
        size = min(BOOTSTRAP_CHUNK, n_resamples - start)
        picks = rng.integers(0, len(values), size=(size, len(values)))  # (size, n_runs)
        means[start:start + size] = values[picks].mean(axis=1)
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
        cov, delta = exact_cov_delta(run.labels[capability], run.total_failed)
        failed = [name for name, ok in (("cov", cov >= config.exact_rho),
                                        ("delta", delta >= config.exact_delta)) if not ok]
        n_low_cov += "cov" in failed
        n_low_delta += "delta" in failed
        entry.update(labeled=True, **metrics, passed=not failed, failed_thresholds=failed)
        per_run.append(entry)
    covs = np.array([e["cov"] for e in per_run if e["labeled"]])  # (n_runs_labeled,)
    deltas = np.array([e["delta"] for e in per_run if e["labeled"]])  # (n_runs_labeled,)
    n_passed = sum(e["passed"] for e in per_run)
    lacking_votes = Counter(chain.from_iterable(run.labels[capability]["lacking_failed"]
                                                for run in runs if capability in run.labels))
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
        "example_failed_cases": representative_cases(lacking_votes, N_EXAMPLE_CASES),
        "per_run": per_run,
    }


_SWE_INSTANCE = re.compile(r"^(?P<repo>.+__.+)-\d+$")  # SWE-bench instance id: <owner>__<repo>-<number>


def case_domain(traj_id: str) -> str:
    """What a trajectory id says about where it comes from: the `<domain>:` prefix `_summarize` gives τ²-bench
    ids of several domains, else the repository of a SWE-bench instance id, else "" (one group)."""
    if ":" in traj_id:
        return traj_id.split(":", 1)[0]
    if "__" not in traj_id:
        return ""
    match = _SWE_INSTANCE.match(traj_id)
    return match.group("repo") if match else ""


def case_task(traj_id: str) -> str:
    """The task of a trajectory id: `_summarize` appends `#<sample>` to ids of tasks run several times."""
    return traj_id.split("#", 1)[0]


def representative_cases(lacking_votes: Counter, n: int) -> list[str]:
    """Up to `n` failed trajectory ids labeled LACKING, spread over domains and tasks.

    `lacking_votes` counts, per id, the runs that labeled it LACKING. Ids most runs agree on come first. The
    domains (see `case_domain`) take turns, the domain with the best-agreed id first (ties by name), so
    every domain with a LACKING failure is shown before any domain shows a second one; within a domain, a
    task's further samples wait until every task has been shown once.
    """
    by_votes: dict[int, list[str]] = {}
    for traj_id, votes in lacking_votes.items():
        by_votes.setdefault(votes, []).append(traj_id)
    ranked: list[str] = []
    for votes in sorted(by_votes, reverse=True):
        ids = sorted(by_votes[votes])
        ids.sort(key=len)  # stable: by length, then text, which within a domain is numeric order (9 before 10)
        ranked.extend(ids)
    queues: dict[str, list[str]] = {}
    seen_tasks: set[str] = set()
    repeats: list[str] = []  # further samples of a task already queued
    for traj_id in ranked:
        task = (case_domain(traj_id), case_task(traj_id))
        if task in seen_tasks:
            repeats.append(traj_id)
            continue
        seen_tasks.add(task)
        queues.setdefault(task[0], []).append(traj_id)
    # The domain whose first id most runs agree on goes first; ties by name.
    turns = [queues[domain] for domain in sorted(queues, key=lambda d: (-lacking_votes[queues[d][0]], d))]
    picked: list[str] = []
    while len(picked) < n and any(turns):
        for queue in turns:
            if queue and len(picked) < n:
                picked.append(queue.pop(0))
    return picked + repeats[:n - len(picked)]


def _sort_key(entry: dict) -> tuple:
    """Highest mean Δ first; never-labeled capabilities last; ties by name."""
    mean_delta = entry["mean_delta"]
    return (mean_delta is None, -(mean_delta or 0.0), entry["skill"])


def aggregate(run_paths: Sequence[str | Path], candidates: str | Path | dict | None = None, rho: float = 0.10,
              delta: float = 0.20, k: int = 8, seed: int = 0, n_bootstrap: int = 2000) -> dict:
    """Load and validate the run files, score every capability, and return the full report.

    The report: {"params": {...}, "capabilities": [one entry per capability, highest mean Δ first, with
    "selected" and "reason"], "selected": [names], "notes": [...]}. `selected_entries(report)` turns
    it into the export list. Raises InputError for bad files, bad thresholds or K > number of runs.
    """
    config = AggregationConfig(rho=rho, delta=delta, k=k, seed=seed, n_bootstrap=n_bootstrap)
    run_paths = [str(p) for p in run_paths]
    if not run_paths:
        raise InputError("no run files given")
    if config.k > len(run_paths):
        raise InputError(f"--k {config.k} is larger than the number of run files ({len(run_paths)}); "
                         f"use --k {len(run_paths)} or fewer, or add runs")
    duplicates = len(run_paths) - len({os.path.realpath(path) for path in run_paths})
    if duplicates:
        raise InputError(f"{duplicates} run file(s) are listed twice (same file under two names?); list each once")
    descriptions = load_candidates(candidates) if candidates is not None else {}
    runs = [load_run(path) for path in run_paths]
    warnings = check_runs_agree(runs)
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
        "warnings": warnings,
        "notes": notes,
    }


# The fields of an export entry this step writes; every other field (`status`, and whatever Step 2 adds, e.g.
# environment_path) belongs to Step 2 and is kept when the capability is selected again.
STEP1_FIELDS = ("skill", "description", "mean_cov", "std_cov", "mean_delta", "std_delta", "n_runs_passed",
                "n_runs_total", "passes_consistency", "example_failed_cases")


def selected_entries(report: dict) -> list[dict]:
    """The export list: selected capabilities, highest mean Δ first, each marked PENDING (see `merge_queue` for
    an export that already exists)."""
    return [{"skill": e["skill"], "description": e["description"], "mean_cov": e["mean_cov"],
             "std_cov": e["std_cov"], "mean_delta": e["mean_delta"], "std_delta": e["std_delta"],
             "n_runs_passed": e["n_runs_passed"], "n_runs_total": e["n_runs_total"], "passes_consistency": True,
             "example_failed_cases": e["example_failed_cases"], "status": "PENDING"}
            for e in report["capabilities"] if e["selected"]]


def report_path_for(export_path: str | Path) -> Path:
    """`<export stem>_report.json` next to the export file."""
    export_path = Path(export_path)
    return export_path.with_name(f"{export_path.stem}_report.json")


def check_outputs(export_path: str | Path, flag: str = "--export", inputs: Inputs = ()) -> None:
    """InputError unless both the export and its report can be written and neither is one of the command's
    `inputs` ((what, path) pairs); call it before any work."""
    check_output_path(export_path, flag, inputs)
    check_output_path(report_path_for(export_path), f"{flag}'s report", inputs)
    previous_export(export_path)  # an existing export that cannot be merged is refused now, not after the work


def previous_export(export_path: str | Path) -> list[dict] | None:
    """The entries of the export already at `export_path` (Step 2's queue, statuses set by pipeline.capabilities),
    or None when there is none; InputError when the file is there but is not a selected list, since writing the
    new selection would lose what it holds."""
    path = Path(export_path)
    if not path.exists():
        return None
    try:
        return load_selected(path)
    except InputError as err:
        raise InputError(f"{err}. The existing export is Step 2's queue and would be replaced: fix it, or move it "
                         "aside (or pass another --export) and run again") from None


def merge_queue(fresh: list[dict], previous: list[dict] | None) -> tuple[list[dict], dict]:
    """(export entries, account) of a new selection over the export already there.

    A capability selected again keeps its status and every field Step 2 added (everything but STEP1_FIELDS), so
    a DONE capability is not queued again; its Step-1 numbers are the new ones. A capability no longer selected
    leaves the queue; its previous entry goes into the account (`no_longer_selected`), which the report keeps and
    the CLIs name when it was IN_PROGRESS or DONE. The account: {"kept": {skill: kept fields},
    "no_longer_selected": [previous entries]}."""
    before = {entry["skill"]: entry for entry in previous or []}
    merged, kept = [], {}
    for entry in fresh:
        old = before.get(entry["skill"])
        carried = {key: value for key, value in (old or {}).items() if key not in STEP1_FIELDS}
        if carried and carried != {"status": "PENDING"}:
            kept[entry["skill"]] = carried
        merged.append({**entry, **carried})
    names = {entry["skill"] for entry in fresh}
    return merged, {"kept": kept, "no_longer_selected": [e for e in previous or [] if e["skill"] not in names]}


def _with_status(entry: dict) -> str:
    return f"{entry['skill']} ({entry.get('status')})"


def queue_messages(report: dict, export_path: str | Path) -> tuple[list[str], list[str]]:
    """(information, warnings) about what `write_outputs` kept from, and dropped of, the previous export."""
    queue = report.get("queue") or {}
    info, warnings = [], []
    kept = queue.get("kept") or {}
    if kept:
        statuses = ", ".join(f"{name} ({fields.get('status', 'PENDING')})" for name, fields in kept.items())
        info.append(f"kept Step 2's status and fields of {len(kept)} capabilities selected again, from the previous "
                    f"{export_path}: {statuses}; `python -m pipeline.capabilities mark NAME PENDING --file "
                    f"{export_path}` queues one again")
    dropped = queue.get("no_longer_selected") or []
    worked = [e for e in dropped if e.get("status") != "PENDING"]
    if worked:
        warnings.append(f"{len(worked)} capabilities Step 2 worked on are no longer selected and left the queue "
                        f"{export_path}: {', '.join(_with_status(e) for e in worked)}; their "
                        f"previous entries are kept in {report_path_for(export_path)} under queue.no_longer_selected")
    if len(dropped) > len(worked):
        info.append(f"{len(dropped) - len(worked)} PENDING capabilities of the previous {export_path} are no longer "
                    "selected and left the queue")
    return info, warnings


def write_outputs(report: dict, export_path: str | Path) -> tuple[Path, Path]:
    """Write the selected list to `export_path` and the full report next to it (both atomically); both paths
    are checked first, so a bad one raises InputError before either file is written.

    An export already there is Step 2's queue: it is merged (`merge_queue`), not replaced, and the account is
    added to `report` as report["queue"] (also written to the report file; `queue_messages` words it)."""
    check_outputs(export_path)
    Path(export_path).parent.mkdir(parents=True, exist_ok=True)  # the lock file goes beside the export
    # Under the list's lock (pipeline.capabilities.locked): a `mark` by a Step-2 agent between reading the queue
    # and writing the merged one would otherwise be lost.
    with locked(export_path):
        entries, account = merge_queue(selected_entries(report), previous_export(export_path))
        report["queue"] = account
        report_path = atomic_write_json(report_path_for(export_path), report)
        return atomic_write_json(export_path, entries), report_path


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


@cli_entry
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
    parser.add_argument("--seed", type=seed_value, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--n-bootstrap", type=int, default=2000,
                        help=f"bootstrap resamples, 1 to {MAX_BOOTSTRAP:,} (default 2000)")
    parser.add_argument("--export", default=DEFAULT_EXPORT, help=f"selected list output (default {DEFAULT_EXPORT})")
    args = parser.parse_args(None if argv is None else list(argv))
    AggregationConfig(rho=args.rho, delta=args.delta, k=args.k, seed=args.seed, n_bootstrap=args.n_bootstrap)
    run_paths = expand_run_globs(args.runs)
    check_outputs(args.export, inputs=[*(("a --runs file", path) for path in run_paths),
                                       ("--candidates", args.candidates)])
    report = aggregate(run_paths, candidates=args.candidates, rho=args.rho, delta=args.delta, k=args.k,
                       seed=args.seed, n_bootstrap=args.n_bootstrap)
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_table(report))
    export_path, report_path = write_outputs(report, args.export)
    info, warnings = queue_messages(report, export_path)
    for line in info:
        print(line)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(f"wrote {export_path} ({len(report['selected'])} selected) and {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
