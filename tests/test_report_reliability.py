"""The report's verdicts do not hang on float noise or hide what they leave out: a tie in pass rate counts as
reached, a bootstrap statistic that is 0 exactly does not exclude 0, pairs dropped for an unscored episode are
said, the mistake census counts among the episodes played, and a τ²-bench reward within 1e-6 of 1 passes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from demo import paired_stats as ps

# ---- a tie in pass rate is reached (demo/report_efficiency.py) -------------------------------------------------


def pass1_cell(counts: tuple[int, ...], n: int = 105) -> dict[str, float]:
    """The report's pass^1 cell (`demo.run.summarize_runs`) of a model that passed counts[i] of n tasks greedy under
    evaluation seed i."""
    from benchmarks.results import pass_hat_k
    from demo.run import summarize_runs

    runs = {}
    for seed, passed in enumerate(counts):
        sims = [{"task_id": str(t), "messages": [], "reward_info": {"reward": float(t < passed)}} for t in range(n)]
        hat = pass_hat_k(sims, 1)["all"]
        runs[f"{seed}/greedy"] = {"pass_hat_k": {"all": {"n_tasks": hat["n_tasks"], "1": hat["pass_hat_k"][1]}}}
    return summarize_runs(runs, "greedy")["all"]["pass^1"]


def test_a_point_with_traces_pass_count_split_otherwise_over_seeds_reaches_trace():
    from demo.report_efficiency import first_at_or_above

    # 228 of 315 both: TRACE 74, 76, 78 per seed, direct GRPO's checkpoint 75, 76, 77 — the same pass rate, but
    # as floats the checkpoint's mean is one bit below TRACE's.
    rows = {"TRACE": {"greedy": pass1_cell((74, 76, 78))}, "direct GRPO @1/4": {"greedy": pass1_cell((75, 76, 77))},
            "direct GRPO": {"greedy": pass1_cell((75, 76, 78))}}
    assert rows["direct GRPO @1/4"]["greedy"]["mean"] < rows["TRACE"]["greedy"]["mean"]  # the float noise
    assert first_at_or_above(rows, ["direct GRPO @1/4", "direct GRPO"], "TRACE", "greedy") == "direct GRPO @1/4"
    rows["direct GRPO @1/4"]["greedy"] = pass1_cell((75, 76, 76))  # one task fewer: below, not a tie
    assert first_at_or_above(rows, ["direct GRPO @1/4", "direct GRPO"], "TRACE", "greedy") == "direct GRPO"
    rows["direct GRPO"]["greedy"] = pass1_cell((74, 76, 77))
    assert first_at_or_above(rows, ["direct GRPO @1/4", "direct GRPO"], "TRACE", "greedy") is None


# ---- a bootstrap statistic that is 0 exactly is 0 (demo/paired_stats.py) -----------------------------------------


def test_an_interval_ending_at_0_exactly_does_not_exclude_0_and_says_so():
    """A - B untied on 6 of 315 (seed, task) pairs (1 up, 5 down): a resample whose seeds' means cancel is 0 in
    exact arithmetic, yet summed in floats it came out -5.8e-19, so the interval [-0.024, -0.000] 'excluded 0' and
    was shown bold."""
    from demo.report_text import ci_text

    untied = [[-0.5], [-0.5, -1.0, 0.5], [-1.0, -1.0]]
    a, b = {}, {}
    for seed, diffs in enumerate(untied):
        values = diffs + [0.0] * (105 - len(diffs))
        a[seed] = {f"t{i:03d}": (0.5 + d / 2 if d else 1.0) for i, d in enumerate(values)}
        b[seed] = {f"t{i:03d}": (0.5 - d / 2 if d else 1.0) for i, d in enumerate(values)}
    cell = ps.paired_difference(a, b, resamples=2000, seed=12)
    assert cell["high"] == 0.0 and not cell["excludes_zero"]
    assert ci_text(cell) == "-0.011 [-0.024, +0.000] (1↑ 5↓)"  # not bold: the printed interval holds 0
    # No resampled statistic sits within float noise of 0 without being 0.
    strata = [np.array(d + [0.0] * (105 - len(d))) for d in untied]
    stats = ps._resampled_means(strata, np.random.default_rng(12), 2000)
    assert not np.any((np.abs(stats) > 0) & (np.abs(stats) < 1e-12))
    assert not np.any(np.signbit(stats) & (stats == 0))  # no -0.0 to print as "-0.000"


# ---- pairs dropped for an unscored episode are said (demo/report_paired.py) --------------------------------------


def write_model(run_dir: Path, label: str, rewards: dict[str, dict[str, float | None]]) -> dict:
    """One model's greedy evaluation runs: rewards[seed][task] (None: the episode was not scored)."""
    runs = {}
    for seed, tasks in rewards.items():
        sims = [{"id": f"{seed}-{t}", "task_id": t, "trial": 0, "sample_idx": 0, "messages": [],
                 "reward_info": None if r is None else {"reward": r}} for t, r in tasks.items()]
        path = run_dir / f"{label}_{seed}.json"
        path.write_text(json.dumps({"simulations": sims}))
        runs[f"{seed}/greedy"] = {"path": path.name, "seconds": 1.0}
    return runs


def test_pairs_dropped_for_an_unscored_episode_are_counted_beside_the_difference(tmp_path):
    from demo.config import DemoConfig
    from demo.report_paired import paired_section

    tasks = [f"t{i}" for i in range(10)]
    base = {seed: {t: float(i % 2) for i, t in enumerate(tasks)} for seed in ("1", "2")}
    other = {seed: dict(scores) for seed, scores in base.items()}
    other["1"]["t0"] = None  # played, not scored: its pair drops out of the difference
    base["2"]["t9"] = other["2"]["t9"] = None  # neither scored it: dropped too
    evaluate = {"base": write_model(tmp_path, "base", base), "other": write_model(tmp_path, "other", other)}
    lines, results, printed = paired_section(tmp_path, evaluate, DemoConfig(), resamples=200)
    text = "\n".join(lines)
    cell = results["comparisons"]["other"]["base"]["greedy"]
    assert (cell["pairs"], cell["left_out"], cell["not_compared"]) == (18, 1, 2)
    assert results["same_tasks_as_base"]["other"]  # the same tasks were played ...
    assert "Not every played (seed, task) pair is compared" in text and "other vs base, greedy: 2." in text
    assert "| other | base | +0.000 [+0.000, +0.000] (0↑ 0↓) (2 played pairs not compared) |" in text, text
    assert any("(2 played pairs not compared)" in line for line in printed)


def test_a_fully_scored_comparison_reads_as_before(tmp_path):
    from demo.config import DemoConfig
    from demo.report_paired import paired_section

    base = {"1": {f"t{i}": float(i % 2) for i in range(10)}}
    evaluate = {"base": write_model(tmp_path, "base", base), "other": write_model(tmp_path, "other", base)}
    lines, results, _ = paired_section(tmp_path, evaluate, DemoConfig(), resamples=200)
    text = "\n".join(lines)
    assert results["comparisons"]["other"]["base"]["greedy"]["not_compared"] == 0
    assert "not compared" not in text and "| other | base | +0.000 [+0.000, +0.000] (0↑ 0↓) |" in text


# ---- the mistake census counts among the episodes played (demo/report_accounting.py) ----------------------------


def test_the_mistake_census_rounds_count_in_calibration_and_every_total():
    from demo.config import DemoConfig
    from demo.report_accounting import accounting_section, calibration_episodes, episode_accounting
    from test_demo_stats import accounting_records

    # b: 3 probes of 4 tasks × 2 samples, then a census of the kept probe's 8 episodes and 2 more rounds of 8.
    census = {"episodes": 24, "failed": 20, "success_rate": 4 / 24, "first_mistakes": {"x": 20}, "rounds": 2,
              "min_failed": 30}
    history = [{"knob": "k", "value": v, "success_rate": 0.1} for v in range(3)]
    assert calibration_episodes({"history": history, "mistake_census": census}, 4, 2) == (3, 24 + 16)
    assert calibration_episodes({"history": history}, 4, 2) == (3, 24)
    records = accounting_records()
    records["environments"]["figures"]["capabilities"]["b"]["mistake_census"] = census
    accounting = episode_accounting(records, DemoConfig())
    calibration = accounting["parts"]["calibration"]
    assert calibration["per_capability"]["b"] == {"probes": 3, "episodes": 40, "census": 16}
    assert calibration["episodes"] == 16 + 40
    models = accounting["models"]
    assert models["TRACE"]["all"] == 20 + 56 + 128 + 32 and models["lora:b"]["all"] == 20 + 40 + 64
    assert models["single-adapter GRPO"]["all"] == 20 + 56 + 160
    text = "\n".join(accounting_section(accounting, list(models)))
    assert "Step 2: 56 calibration episodes (8 per probed value: a 2 × 8, b 3 × 8 + mistake census 16" in text


# ---- τ²-bench's success tolerance (benchmarks/results.py) ------------------------------------------------------


def test_a_tau2_reward_within_1e_6_of_1_is_a_success():
    from benchmarks.results import SUCCESS_THRESHOLD, TAU2_SUCCESS_TOLERANCE, pass_hat_k, pass_rates

    assert TAU2_SUCCESS_TOLERANCE == 1e-6 and SUCCESS_THRESHOLD == 1 - 1e-6
    sims = [{"task_id": "a", "messages": [], "reward_info": {"reward": 0.9999999}},  # τ²-bench: a success
            {"task_id": "b", "messages": [], "reward_info": {"reward": 0.999998}},  # not
            {"task_id": "c", "messages": [], "reward_info": {"reward": 1.0}}]
    assert pass_rates(sims)["all"]["passed"] == 2
    assert pass_hat_k(sims, 1)["all"]["pass_hat_k"][1] == pytest.approx(2 / 3)
    assert ps.task_scores(sims) == {"a": 1.0, "b": 0.0, "c": 1.0}
