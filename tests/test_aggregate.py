"""Capability aggregation (pipeline/aggregate_capabilities.py) and the label converter (pipeline/labels_to_run.py).

The numbers below are worked out by hand in the comments; the code under test is never used to make them.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.validation import InputError
from pipeline.aggregate_capabilities import (aggregate, bootstrap_mean_ci, fleiss_kappa, format_table, main,
                                             report_path_for, run_metrics, selected_entries, validate_run)
from pipeline.labels_to_run import SkippedTrajectoryWarning, labels_to_run
from pipeline.labels_to_run import main as labels_main

ROOT = Path(__file__).resolve().parent.parent
FAILED_IDS = ["f0", "f1", "f2", "f3"]
PASSED_IDS = ["p0", "p1"]
KEY_OF = {"L": "lacking", "P": "present", "N": "na"}


def lists_from(failed: str, passed: str, failed_ids=FAILED_IDS, passed_ids=PASSED_IDS) -> dict:
    """Six label lists from one letter per trajectory: L = LACKING, P = PRESENT, N = NA."""
    lists = {f"{kind}_{side}": [] for kind in ("lacking", "present", "na") for side in ("failed", "passed")}
    for ids, letters, side in ((failed_ids, failed, "failed"), (passed_ids, passed, "passed")):
        for traj_id, letter in zip(ids, letters, strict=True):
            lists[f"{KEY_OF[letter]}_{side}"].append(traj_id)
    return lists


def run_file(attempt: int, labels: dict, n_failed: int = 4, n_passed: int = 2) -> dict:
    return {"attempt": attempt, "totals": {"total_failed": n_failed, "total_passed": n_passed}, "labels": labels}


# Three runs over failed f0..f3 and passed p0, p1 (rho 0.10, delta 0.20, K 2):
#   good : run1 F=LLLP P=PP -> Cov 3/4=.75, ER- 3/4, ER+ 0/2  -> Δ .75
#          run2 F=LLNN P=PN -> Cov 2/4=.50, ER- 2/2, ER+ 0/1  -> Δ 1.0
#          run3 F=LLLL P=LP -> Cov 4/4=1.0, ER- 4/4, ER+ 1/2  -> Δ .5     => passes 3/3, SELECTED
#   flaky: run1 F=LNNN P=PP -> Cov .25, Δ 1 - 0 = 1            (passes)
#          run2 F=NNNN P=LL -> Cov 0,   Δ 0 - 1 = -1           (Cov and Δ fail)
#          run3 F=LPPP P=LP -> Cov .25, Δ 1/4 - 1/2 = -.25     (Δ fails)  => passes 1/3 < K=2
#   rare : only in run1, F=LLLL P=NN -> Cov 1, Δ 1             => passes 1/3, missing in 2 runs
RUNS = [
    run_file(1, {"good": lists_from("LLLP", "PP"), "flaky": lists_from("LNNN", "PP"), "rare": lists_from("LLLL", "NN")}),
    run_file(2, {"good": lists_from("LLNN", "PN"), "flaky": lists_from("NNNN", "LL")}),
    run_file(3, {"good": lists_from("LLLL", "LP"), "flaky": lists_from("LPPP", "LP")}),
]
CANDIDATES = {"candidates": [{"name": "good", "description": "does the good thing", "example_trajectories": []},
                             {"name": "flaky", "description": "sometimes"},
                             {"name": "never", "description": "no run labels it"}]}


@pytest.fixture
def run_paths(tmp_path) -> list[Path]:
    paths = []
    for index, run in enumerate(RUNS, start=1):
        path = tmp_path / "runs" / f"run_{index:02d}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(run))
        paths.append(path)
    return paths


# --- formulas -----------------------------------------------------------------------------------

def test_run_metrics_hand_computed():
    # 10 failed: LF=4, PF=2, NF=4; 5 passed: LP=1, PP=3, NP=1.
    # Cov = 4/10 = 0.4 (NA stays in the denominator); Δ = 4/6 - 1/4 = 0.41667.
    failed = [f"f{i}" for i in range(10)]
    passed = [f"p{i}" for i in range(5)]
    m = run_metrics(lists_from("LLLLPPNNNN", "LPPPN", failed, passed), total_failed=10)
    assert m["cov"] == pytest.approx(0.4)
    assert m["er_minus"] == pytest.approx(4 / 6) and m["er_plus"] == pytest.approx(0.25)
    assert m["delta"] == pytest.approx(4 / 6 - 0.25)


def test_run_metrics_zero_denominators():
    # All NA: both rates have denominator 0 -> 0 each, Δ = 0; Cov = 0/4.
    m = run_metrics(lists_from("NNNN", "NN"), total_failed=4)
    assert (m["cov"], m["er_minus"], m["er_plus"], m["delta"]) == (0.0, 0.0, 0.0, 0.0)
    assert run_metrics(lists_from("", "", [], []), total_failed=0)["cov"] == 0.0


def test_fleiss_kappa_textbook_example():
    # Fleiss (1971)-style example as on Wikipedia: 10 subjects, 14 raters, 5 categories.
    # p_j = (.143, .200, .279, .150, .229), P̄ = .378, P̄_e = .213, κ = (.378 - .213) / (1 - .213) ≈ .210.
    counts = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                       [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert fleiss_kappa(counts) == pytest.approx(0.210, abs=5e-4)


def test_fleiss_kappa_small_hand_case():
    # 6 subjects, 3 raters, categories (NA, PRESENT, LACKING); rows are the per-subject counts.
    # P_i = (Σ n_ij² - 3) / 6 = 1, 1, 1/3, 0, 1/3, 1/3 -> P̄ = 3/6 = 0.5
    # p_j = (3, 5, 10)/18 -> P_e = (9 + 25 + 100)/324 = 134/324
    # κ = (162/324 - 134/324) / (190/324) = 28/190
    counts = [[0, 0, 3], [0, 0, 3], [1, 0, 2], [1, 1, 1], [0, 2, 1], [1, 2, 0]]
    assert fleiss_kappa(counts) == pytest.approx(28 / 190)


def test_fleiss_kappa_degenerate_and_invalid():
    assert fleiss_kappa([[3, 0, 0], [3, 0, 0]]) == 1.0  # one category only: P_e = 1, reported as 1.0
    assert fleiss_kappa([[2, 0, 0], [0, 0, 2]]) == pytest.approx(1.0)  # perfect agreement, two categories
    # Total disagreement with 2 raters: P̄ = 0, p = (.5, .5, 0), P_e = .5 -> κ = -1.
    assert fleiss_kappa([[1, 1, 0], [1, 1, 0]]) == pytest.approx(-1.0)
    assert fleiss_kappa(np.zeros((0, 3))) is None
    assert fleiss_kappa([[1, 0, 0]]) is None  # one rater
    with pytest.raises(ValueError):
        fleiss_kappa([[2, 0, 0], [1, 0, 0]])


def test_bootstrap_is_deterministic_and_sane():
    values = [0.1, 0.5, 0.3, 0.9, 0.2]
    first = bootstrap_mean_ci(values, n_resamples=2000, seed=7)
    assert first == bootstrap_mean_ci(values, n_resamples=2000, seed=7)
    assert first != bootstrap_mean_ci(values, n_resamples=2000, seed=8)
    assert min(values) <= first[0] < np.mean(values) < first[1] <= max(values)
    assert bootstrap_mean_ci([0.4, 0.4, 0.4], 100, 0) == pytest.approx((0.4, 0.4))
    # Two values 0 and 1: resampled means are 0, .5, 1 with probabilities .25, .5, .25,
    # so the 5th percentile is 0 and the 95th is 1.
    assert bootstrap_mean_ci([0.0, 1.0], 2000, 0) == (0.0, 1.0)


# --- aggregation --------------------------------------------------------------------------------

def test_aggregate_hand_computed(run_paths):
    report = aggregate(run_paths, candidates=CANDIDATES, rho=0.10, delta=0.20, k=2)
    by_name = {entry["skill"]: entry for entry in report["capabilities"]}
    good, flaky, rare, never = by_name["good"], by_name["flaky"], by_name["rare"], by_name["never"]
    # good: Cov (.75, .5, 1) and Δ (.75, 1, .5): mean .75, population std sqrt((0 + .0625 + .0625)/3).
    assert good["mean_cov"] == pytest.approx(0.75) and good["mean_delta"] == pytest.approx(0.75)
    assert good["std_cov"] == pytest.approx(math.sqrt(0.125 / 3))
    assert good["std_delta"] == pytest.approx(math.sqrt(0.125 / 3))
    assert (good["n_runs_passed"], good["n_runs_total"], good["selected"]) == (3, 3, True)
    assert good["example_failed_cases"] == ["f0", "f1", "f2", "f3"]
    # κ of good: the 6x3 count matrix of test_fleiss_kappa_small_hand_case (f0: LLL, f1: LLL, f2: LNL,
    # f3: PNL, p0: PPL, p1: PNP) -> 28/190.
    assert good["fleiss_kappa"] == pytest.approx(28 / 190) and good["kappa_n_trajectories"] == 6
    assert good["delta_ci90"][0] <= 0.75 <= good["delta_ci90"][1]

    # flaky: Δ (1, -1, -.25) -> mean -.25/3; passes run 1 only.
    assert flaky["mean_delta"] == pytest.approx(-0.25 / 3) and flaky["n_runs_passed"] == 1
    assert flaky["reason"] == "passed 1/3 runs < K=2 (Cov < rho=0.1 in 1 run(s); Δ < delta=0.2 in 2 run(s))"
    assert [r["failed_thresholds"] for r in flaky["per_run"]] == [[], ["cov", "delta"], ["delta"]]

    # rare: labeled in run 1 only (where it passes); the missing runs count as not passing.
    assert (rare["n_runs_passed"], rare["n_runs_labeled"], rare["selected"]) == (1, 1, False)
    assert rare["reason"] == "passed 1/3 runs < K=2 (not labeled in 2 run(s))"
    assert rare["fleiss_kappa"] is None and rare["in_candidates"] is False
    assert never["mean_delta"] is None and never["selected"] is False and never["description"] == "no run labels it"

    assert report["selected"] == ["good"]
    # Sorted by mean Δ, never-labeled last: rare (1.0), good (.75), flaky (-.083), never.
    assert [e["skill"] for e in report["capabilities"]] == ["rare", "good", "flaky", "never"]
    export = selected_entries(report)
    assert list(export[0]) == ["skill", "description", "mean_cov", "std_cov", "mean_delta", "std_delta",
                               "n_runs_passed", "n_runs_total", "passes_consistency", "example_failed_cases",
                               "status"]
    assert export[0]["status"] == "PENDING" and export[0]["description"] == "does the good thing"


def test_aggregate_k_changes_selection(run_paths):
    assert aggregate(run_paths, k=1)["selected"] == ["rare", "good", "flaky"]
    assert aggregate(run_paths, k=3)["selected"] == ["good"]
    # With delta = -1 every labeled run passes Δ; flaky still fails Cov in run 2 (0 < .1).
    assert aggregate(run_paths, delta=-1.0, k=3)["selected"] == ["good"]


def test_aggregate_report_is_deterministic(run_paths):
    assert aggregate(run_paths, k=2, seed=3) == aggregate(run_paths, k=2, seed=3)


def test_validate_run_accepts_integer_ids():
    run = run_file(1, {"c": {"lacking_failed": [1], "present_failed": [], "na_failed": [2],
                             "lacking_passed": [], "present_passed": [3], "na_passed": []}}, n_failed=2, n_passed=1)
    assert validate_run(run, "x").labels["c"]["na_failed"] == ["2"]


# --- CLI ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("invocation", [["pipeline/aggregate_capabilities.py"], ["-m", "pipeline.aggregate_capabilities"]])
def test_cli_end_to_end(tmp_path, run_paths, invocation):
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps(CANDIDATES))
    export = tmp_path / "out" / "selected.json"
    result = subprocess.run([sys.executable, *invocation, "--runs", str(run_paths[0].parent / "run_*.json"),
                             "--candidates", str(candidates), "--k", "2", "--export", str(export)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()}
    assert "SELECTED" in rows["good"] and "0.15" in rows["good"]  # κ = 28/190 = 0.147
    assert "rejected: passed 1/3 runs < K=2" in rows["flaky"]
    selected = json.loads(export.read_text())
    assert [entry["skill"] for entry in selected] == ["good"]
    report = json.loads((tmp_path / "out" / "selected_report.json").read_text())
    assert {e["skill"] for e in report["capabilities"]} == {"good", "flaky", "rare", "never"}


def _bad_run_cases() -> dict[str, tuple[str, str]]:
    """name -> (file content, expected fragment of the error)."""
    good = RUNS[0]
    no_totals = {key: value for key, value in good.items() if key != "totals"}
    missing_list = json.loads(json.dumps(good))
    del missing_list["labels"]["good"]["na_passed"]
    two_lists = json.loads(json.dumps(good))
    two_lists["labels"]["good"]["present_failed"].append("f0")  # f0 is already LACKING
    two_lists["totals"]["total_failed"] = 5  # sizes agree, so only the repeated id is wrong
    same_list = json.loads(json.dumps(good))
    same_list["labels"]["good"]["lacking_failed"].append("f0")
    same_list["totals"]["total_failed"] = 5
    wrong_failed = json.loads(json.dumps(good))
    wrong_failed["totals"]["total_failed"] = 5
    wrong_passed = json.loads(json.dumps(good))
    wrong_passed["labels"]["good"]["na_passed"].append("p9")
    return {
        "broken_json": ('{"attempt": 1, "totals": ', "broken JSON"),
        "missing_key": (json.dumps(no_totals), "missing key 'totals'"),
        "missing_list": (json.dumps(missing_list), "missing key(s) na_passed"),
        "id_in_two_lists": (json.dumps(two_lists), "'f0' occurs in both present_failed and lacking_failed"),
        "id_twice_in_one_list": (json.dumps(same_list), "'f0' occurs twice in lacking_failed"),
        "failed_total": (json.dumps(wrong_failed), "totals.total_failed is 5"),
        "passed_total": (json.dumps(wrong_passed), "totals.total_passed is 2"),
        "not_an_object": ("[]", "must be a JSON object"),
    }


@pytest.mark.parametrize("case", sorted(_bad_run_cases()))
def test_cli_bad_run_file_exits_2_and_writes_nothing(tmp_path, run_paths, capsys, case):
    content, fragment = _bad_run_cases()[case]
    bad = tmp_path / "runs" / "run_99.json"
    bad.write_text(content)
    export = tmp_path / "selected.json"
    assert main(["--runs", str(tmp_path / "runs" / "run_*.json"), "--k", "2", "--export", str(export)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and fragment in err, err
    assert not export.exists() and not report_path_for(export).exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--k", "4"], "--k 4 is larger than the number of run files (3)"),
    (["--k", "0"], "k must be an integer >= 1"),
    (["--rho", "1.5"], "rho must be in [0, 1]"),
    (["--rho", "-0.1"], "rho must be in [0, 1]"),
    (["--delta", "-1.5"], "delta must be in [-1, 1]"),
    (["--delta", "nan"], "delta must be in [-1, 1]"),
])
def test_cli_bad_flags_exit_2_and_write_nothing(tmp_path, run_paths, capsys, flags, fragment):
    export = tmp_path / "selected.json"
    assert main(["--runs", str(run_paths[0].parent / "*.json"), *flags, "--export", str(export)]) == 2
    assert fragment in capsys.readouterr().err
    assert not export.exists() and not report_path_for(export).exists()


@pytest.mark.parametrize("content, fragment", [
    ('{"candidates": [', "broken JSON"),
    ('{"names": []}', "expected an object with a 'candidates' list"),
    ('{"candidates": [{"description": "x"}]}', "candidates[0] needs a non-empty string 'name'"),
])
def test_cli_bad_candidates_exit_2(tmp_path, run_paths, capsys, content, fragment):
    candidates = tmp_path / "candidates.json"
    candidates.write_text(content)
    export = tmp_path / "selected.json"
    assert main(["--runs", *map(str, run_paths), "--k", "2", "--candidates", str(candidates),
                 "--export", str(export)]) == 2
    err = capsys.readouterr().err
    assert str(candidates) in err and fragment in err
    assert not export.exists()


def test_cli_glob_without_match_exits_2(tmp_path, run_paths, capsys):
    export = tmp_path / "selected.json"
    pattern = str(tmp_path / "nothing_*.json")
    assert main(["--runs", str(run_paths[0]), pattern, "--k", "1", "--export", str(export)]) == 2
    assert f"--runs {pattern}: matches no file" in capsys.readouterr().err
    assert not export.exists()


def test_overlapping_globs_count_each_run_once(tmp_path, run_paths, capsys):
    export = tmp_path / "selected.json"
    assert main(["--runs", str(run_paths[0].parent / "*.json"), str(run_paths[0]), "--k", "3",
                 "--export", str(export)]) == 0
    assert json.loads(report_path_for(export).read_text())["params"]["n_runs"] == 3


def test_same_file_spelled_two_ways_counts_once(tmp_path, run_paths, capsys):
    export = tmp_path / "selected.json"
    other_spelling = run_paths[0].parent / "." / run_paths[0].name  # what `--runs 'runs/*' ./runs/run_01.json` gives
    assert main(["--runs", str(run_paths[0].parent / "*.json"), str(other_spelling), "--k", "3",
                 "--export", str(export)]) == 0
    assert json.loads(report_path_for(export).read_text())["params"]["n_runs"] == 3
    with pytest.raises(InputError, match="listed twice"):
        aggregate([run_paths[0], other_spelling, run_paths[1]], k=1)


# --- thresholds are compared exactly ------------------------------------------------------------

def test_delta_exactly_at_delta_passes():
    # LF=3, PF=7 -> 3/10; LP=1, PP=9 -> 1/10; Δ = 1/5 exactly (0.19999999999999998 in floating point).
    failed = [f"f{i}" for i in range(10)]
    passed = [f"p{i}" for i in range(10)]
    lists = {"lacking_failed": failed[:3], "present_failed": failed[3:], "na_failed": [],
             "lacking_passed": passed[:1], "present_passed": passed[1:], "na_passed": []}
    run = validate_run(run_file(1, {"c": lists}, n_failed=10, n_passed=10), "x")
    assert run_metrics(run.labels["c"], 10)["delta"] == 0.2
    report = aggregate_runs([run_file(1, {"c": lists}, n_failed=10, n_passed=10)], rho=0.3, delta=0.2, k=1)
    entry = report["capabilities"][0]
    assert entry["selected"] and entry["per_run"][0]["failed_thresholds"] == []  # Cov 3/10 = rho 0.3 passes too
    assert "SELECTED" in format_table(report)
    report = aggregate_runs([run_file(1, {"c": lists}, n_failed=10, n_passed=10)], rho=0.3, delta=0.21, k=1)
    assert report["capabilities"][0]["per_run"][0]["failed_thresholds"] == ["delta"]


def aggregate_runs(runs: list[dict], folder: Path | None = None, **kwargs) -> dict:
    """aggregate() over run objects written to temporary files."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for index, run in enumerate(runs, start=1):
            path = Path(tmp) / f"run_{index:02d}.json"
            path.write_text(json.dumps(run))
            paths.append(path)
        return aggregate(paths, **kwargs)


# --- runs are checked against each other --------------------------------------------------------

def _all_lacking(failed_ids, passed_ids) -> dict:
    return {"lacking_failed": list(failed_ids), "present_failed": [], "na_failed": [],
            "lacking_passed": [], "present_passed": list(passed_ids), "na_passed": []}


def _write_runs(folder: Path, runs: list[dict]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, run in enumerate(runs, start=1):
        path = folder / f"run_{index:02d}.json"
        path.write_text(json.dumps(run))
        paths.append(path)
    return paths


def _cli(folder: Path, export: Path, *flags: str) -> int:
    return main(["--runs", str(folder / "run_*.json"), "--k", "1", *flags, "--export", str(export)])


@pytest.mark.parametrize("case, fragment", [
    ("different_trajectories", "labels 6 that most runs do not"),
    ("outcome_flipped", "is failed in"),
    ("capabilities_disagree", "labels other trajectories than labels['a']"),
    ("empty_labels", "'labels' is empty"),
    ("copied_file", "hold the same labels under attempt 1"),
])
def test_runs_that_do_not_belong_together_exit_2_and_write_nothing(tmp_path, capsys, case, fragment):
    good = run_file(1, {"a": lists_from("LLPN", "PN")})
    other_ids = run_file(2, {"a": lists_from("LLPN", "PN", failed_ids=["g0", "g1", "g2", "g3"],
                                               passed_ids=["q0", "q1"])})
    flipped = run_file(2, {"a": lists_from("LLPN", "PN", failed_ids=["f0", "f1", "f2", "p0"],
                                             passed_ids=["f3", "p1"])})
    two_sets = run_file(2, {"a": lists_from("LLPN", "PN"),
                            "b": lists_from("LLPN", "PN", failed_ids=["f0", "f1", "f2", "f9"])})
    second = {"different_trajectories": other_ids, "outcome_flipped": flipped, "capabilities_disagree": two_sets,
              "empty_labels": {"attempt": 2, "totals": {"total_failed": 0, "total_passed": 0}, "labels": {}},
              "copied_file": good}[case]
    folder = tmp_path / "runs"
    _write_runs(folder, [good, second])
    export = tmp_path / "selected.json"
    assert _cli(folder, export) == 2
    assert fragment in capsys.readouterr().err
    assert not export.exists() and not report_path_for(export).exists()


def test_a_trajectory_missing_from_one_run_is_a_warning(tmp_path, capsys):
    failed = [f"f{i}" for i in range(12)]
    passed = [f"p{i}" for i in range(8)]
    runs = [run_file(1, {"a": _all_lacking(failed, passed)}, 12, 8),
            run_file(2, {"a": _all_lacking(failed, passed)}, 12, 8),
            run_file(3, {"a": _all_lacking(failed[:-1], passed)}, 11, 8)]  # this labeler skipped f11
    folder = tmp_path / "runs"
    _write_runs(folder, runs)
    export = tmp_path / "selected.json"
    assert _cli(folder, export) == 0
    err = capsys.readouterr().err
    assert f"warning: {folder / 'run_03.json'} leaves out 1 of the 20 trajectories most runs label ('f11')" in err
    report = json.loads(report_path_for(export).read_text())
    # Runs 1 and 2 hold the same labels: that is the other warning (tests/test_step1_reliability.py).
    assert len(report["warnings"]) == 2 and report["selected"] == ["a"]
    assert report["warnings"][1].startswith(f"2 runs hold identical labels for every (trajectory, capability) pair "
                                            f"({folder / 'run_01.json'}, {folder / 'run_02.json'})")


def test_same_attempt_with_different_labels_is_a_warning(tmp_path, capsys):
    runs = [run_file(1, {"a": lists_from("LLPN", "PN")}), run_file(1, {"a": lists_from("LLLN", "PN")})]
    folder = tmp_path / "runs"
    _write_runs(folder, runs)
    assert _cli(folder, tmp_path / "selected.json") == 0
    assert "all say attempt 1" in capsys.readouterr().err


# --- outputs and sizes are checked before anything is written ------------------------------------

def test_export_that_is_a_folder_exits_2_before_the_report_is_written(tmp_path, run_paths, capsys):
    export = tmp_path / "out"
    export.mkdir()
    assert main(["--runs", str(run_paths[0].parent / "*.json"), "--k", "2", "--export", str(export)]) == 2
    assert "--export" in capsys.readouterr().err
    assert list(tmp_path.glob("out*")) == [export] and not any(export.iterdir())


def test_huge_n_bootstrap_exits_2(tmp_path, run_paths, capsys):
    export = tmp_path / "selected.json"
    assert main(["--runs", str(run_paths[0].parent / "*.json"), "--k", "2", "--n-bootstrap", str(10**12),
                 "--export", str(export)]) == 2
    assert "n_bootstrap must be an integer from 1 to 1,000,000" in capsys.readouterr().err
    assert not export.exists()
    assert bootstrap_mean_ci([0.0, 1.0], 250_001, 0) == (0.0, 1.0)  # drawn in chunks: still deterministic


# --- example_failed_cases -----------------------------------------------------------------------

def test_example_failed_cases_spread_over_domains_and_tasks():
    failed = [f"airline:{i}" for i in range(1, 13)] + ["retail:1", "retail:2", "retail:3#0", "retail:3#1"]
    runs = [run_file(attempt, {"a": _all_lacking(failed, ["airline:99"])}, len(failed), 1) for attempt in (1, 2)]
    cases = aggregate_runs(runs, k=1)["capabilities"][0]["example_failed_cases"]
    # Domains take turns; a task's second sample (retail:3#1) waits until every task has been shown.
    assert cases == ["airline:1", "retail:1", "airline:2", "retail:2", "airline:3", "retail:3#0", "airline:4",
                     "airline:5"]
    # Ids most runs label LACKING come first.
    runs[1]["labels"]["a"] = _all_lacking([], ["airline:99"])
    runs[1]["labels"]["a"]["present_failed"] = [i for i in failed if i != "airline:12"]
    runs[1]["labels"]["a"]["lacking_failed"] = ["airline:12"]
    assert aggregate_runs(runs, k=1)["capabilities"][0]["example_failed_cases"][0] == "airline:12"


def test_bench_script_runs_small():
    """The bench's synthetic runs make capability i LACKING on 0.6 - 0.05 i of failed and 0.1 of passed
    trajectories: with 2 capabilities both are selected, and the timing line is a real, positive figure
    under the bench's target (2 s for 100 times as much data)."""
    result = subprocess.run([sys.executable, "bench/aggregate.py", "--runs", "3", "--trajectories", "300",
                             "--capabilities", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summary, last = result.stdout.strip().splitlines()[-2:]
    assert summary == "3 runs x 300 trajectories x 2 capabilities: 2 selected"
    name, _, value = last.partition("=")
    assert name == "seconds" and 0 < float(value) < 2.0, last


# --- labels_to_run ------------------------------------------------------------------------------

OUTCOMES = [{"id": "f0", "passed": False}, {"id": "f1", "passed": False}, {"id": "p0", "passed": True},
            {"id": "u0", "passed": None}]


def test_labels_to_run_builds_a_valid_run():
    records = [{"trajectory_id": "f0", "capability": "c", "label": "lacking"},
               {"trajectory_id": "f1", "capability": "c", "label": "NA"},
               {"trajectory_id": "p0", "capability": "c", "label": "Present"},
               {"trajectory_id": "u0", "capability": "c", "label": "LACKING"}]  # unknown outcome: dropped
    with pytest.warns(SkippedTrajectoryWarning, match="1 trajectories with unknown outcome"):
        run = labels_to_run(records, OUTCOMES, attempt=4)
    assert run == {"attempt": 4, "totals": {"total_failed": 2, "total_passed": 1},
                   "labels": {"c": {"lacking_failed": ["f0"], "present_failed": [], "na_failed": ["f1"],
                                    "lacking_passed": [], "present_passed": ["p0"], "na_passed": []}}}
    # Cov = 1/2, Δ = 1/1 - 0/1 = 1.
    metrics = run_metrics(validate_run(run, "x").labels["c"], 2)
    assert (metrics["cov"], metrics["delta"]) == (0.5, 1.0)


def test_labels_to_run_missing_pairs():
    records = [{"trajectory_id": "f0", "capability": "c", "label": "LACKING"}]
    with pytest.raises(InputError, match=r"no label for 2 trajectories \(f1, p0\)"):
        labels_to_run(records, OUTCOMES[:3], attempt=1)
    with pytest.warns(SkippedTrajectoryWarning, match="filled 2 missing"):
        run = labels_to_run(records, OUTCOMES[:3], attempt=1, missing_as="na")
    assert run["labels"]["c"]["na_failed"] == ["f1"] and run["labels"]["c"]["na_passed"] == ["p0"]


@pytest.mark.parametrize("record, fragment", [
    ({"trajectory_id": "zz", "capability": "c", "label": "NA"}, "unknown trajectory id 'zz'"),
    ({"trajectory_id": "f0", "capability": "c", "label": "MAYBE"}, "unknown label 'MAYBE'"),
    ({"trajectory_id": "f0", "capability": "c"}, "expected {'trajectory_id', 'capability', 'label'}"),
    ({"trajectory_id": "f0", "capability": "c", "label": "PRESENT"}, "labeled both LACKING and PRESENT"),
])
def test_labels_to_run_bad_records(record, fragment):
    records = [{"trajectory_id": "f0", "capability": "c", "label": "LACKING"}, record]
    with pytest.raises(InputError, match=fragment.replace("(", r"\(").replace("{", r"\{")):
        labels_to_run(records, OUTCOMES[:3], attempt=1, missing_as="NA")


def test_labels_to_run_cli(tmp_path, capsys):
    labels = tmp_path / "labels.jsonl"
    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text("".join(json.dumps(o) + "\n" for o in OUTCOMES))
    labels.write_text(json.dumps({"trajectory_id": "f0", "capability": "c", "label": "LACKING"}) + "\n")
    out = tmp_path / "run_01.json"
    assert labels_main([str(labels), "--outcomes", str(outcomes), "--attempt", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(labels) in err and "no label for 2 trajectories" in err and not out.exists()
    assert labels_main([str(labels), "--outcomes", str(outcomes), "--attempt", "1", "--out", str(out),
                        "--missing-as", "NA"]) == 0
    err = capsys.readouterr().err
    assert "unknown outcome" in err and "filled 2 missing" in err
    assert validate_run(json.loads(out.read_text()), str(out)).total_failed == 2
    # The converted run feeds the aggregation directly: Cov 1/2, Δ 1 - 0 = 1 -> selected with K = 1.
    assert aggregate([out], k=1)["selected"] == ["c"]


def test_labels_to_run_refuses_an_empty_labels_file(tmp_path, capsys):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("\n")
    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text("".join(json.dumps(o) + "\n" for o in OUTCOMES))
    out = tmp_path / "run_01.json"
    assert labels_main([str(labels), "--outcomes", str(outcomes), "--attempt", "1", "--out", str(out)]) == 2
    assert "no label records" in capsys.readouterr().err and not out.exists()


def test_labels_to_run_refuses_a_folder_as_out_before_reading(tmp_path, capsys):
    out = tmp_path / "folder"
    out.mkdir()
    assert labels_main([str(tmp_path / "missing.jsonl"), "--outcomes", str(tmp_path / "missing2.jsonl"),
                        "--attempt", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a folder" in err and "missing.jsonl" not in err
