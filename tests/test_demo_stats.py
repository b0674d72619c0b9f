"""The demo's paired statistics (demo/paired_stats.py) and its episode accounting (demo/report.py):
bootstrap intervals on constructed data, pairing, and every rollout counted on a constructed records dict."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from demo import paired_stats as ps

SEEDS = ("1000", "2000", "3000")


def scores(per_seed: list[list[float]]) -> dict[str, dict[str, float]]:
    """{seed: {task id: score}} with tasks t0, t1, ... under each of SEEDS."""
    return {seed: {f"{seed}-t{i}": float(v) for i, v in enumerate(values)} for seed, values in zip(SEEDS, per_seed)}


def heterogeneous(n: int = 50, passing: int = 20, extra: int = 0) -> list[float]:
    """A seed's tasks: the first `passing` pass, the rest fail; `extra` more of the failing ones pass."""
    return [1.0] * (passing + extra) + [0.0] * (n - passing - extra)


# ---- paired_stats ---------------------------------------------------------------------------------------------


def test_task_scores_average_each_tasks_scored_samples():
    sims = [{"task_id": "a", "reward_info": {"reward": 1.0}}, {"task_id": "a", "reward_info": {"reward": 0.0}},
            {"task_id": "b", "reward_info": {"reward": 0.99}}, {"task_id": "b", "reward_info": None},
            {"task_id": "c", "reward_info": None}]
    assert ps.task_scores(sims) == {"a": 0.5, "b": 0.0}  # c: no scored sample, no score
    assert ps.task_scores(sims, threshold=0.9) == {"a": 0.5, "b": 1.0}


def test_a_known_difference_has_an_interval_that_excludes_0_and_holds_it():
    # B passes 20 of 50 tasks per seed; A passes those and 10 more: A - B = +0.2 exactly, task by task >= 0.
    b = scores([heterogeneous()] * 3)
    a = scores([heterogeneous(extra=10)] * 3)
    result = ps.paired_difference(a, b)
    assert result["difference"] == pytest.approx(0.2)
    assert result["excludes_zero"] and 0 < result["low"] < 0.2 < result["high"] < 0.3
    assert result["pairs"] == 150 and result["strata"] == 3 and result["left_out"] == 0
    assert (result["better"], result["worse"]) == (30, 0) and result["sign_test_p"] == pytest.approx(2 / 2 ** 30)
    assert result["resamples"] == 10_000 and result["seed"] == 0
    flipped = ps.paired_difference(b, a)  # the other way round: the mirror image
    assert flipped["difference"] == pytest.approx(-0.2) and flipped["excludes_zero"]
    assert flipped["low"] == pytest.approx(-result["high"]) and flipped["high"] == pytest.approx(-result["low"])
    assert ps.paired_difference(a, b) == result  # a fixed RNG seed: the same figures every time


def test_identical_models_and_equal_models_give_intervals_around_0():
    b = scores([heterogeneous()] * 3)
    same = ps.paired_difference(b, b)
    assert same["difference"] == same["low"] == same["high"] == 0.0 and not same["excludes_zero"]
    # Same pass rate, different tasks passed: a difference of 0 with a wide interval on both sides of it.
    other = scores([list(reversed(heterogeneous()))] * 3)
    equal = ps.paired_difference(other, b)
    assert equal["difference"] == pytest.approx(0.0) and not equal["excludes_zero"]
    assert equal["low"] < -0.1 and equal["high"] > 0.1 and abs(equal["low"] + equal["high"]) < 0.03


def test_pairing_finds_a_small_consistent_gain_that_an_unpaired_comparison_misses():
    # Tasks differ a lot in difficulty (40% pass for both), and A passes 4 more tasks per seed than B
    # (+0.08): task by task A is never worse, so the paired interval excludes 0; resampling each model's
    # tasks independently mixes the difficulty spread into the difference and its interval holds 0.
    b = scores([heterogeneous()] * 3)
    a = scores([heterogeneous(extra=4)] * 3)
    paired = ps.paired_difference(a, b)
    unpaired = ps.unpaired_difference(a, b)
    assert paired["difference"] == pytest.approx(0.08) and unpaired["difference"] == pytest.approx(0.08)
    assert paired["excludes_zero"] and paired["low"] > 0.02, paired
    assert not unpaired["excludes_zero"] and unpaired["low"] < 0 < unpaired["high"], unpaired
    assert unpaired["half_width"] > 1.8 * paired["half_width"]


def test_the_bootstrap_is_stratified_by_seed():
    # A beats B on every task of seed 1000 and ties on every task of the others: each resample keeps 50 tasks
    # per seed, so every resampled difference is (1 + 0 + 0) / 3 and the interval has no width. Pooling the
    # 150 pairs would let a resample hold more or fewer seed-1000 tasks and give it one.
    b = scores([[0.0] * 50, heterogeneous(), heterogeneous()])
    a = scores([[1.0] * 50, heterogeneous(), heterogeneous()])
    result = ps.paired_difference(a, b)
    assert result["difference"] == pytest.approx(1 / 3)
    assert result["low"] == pytest.approx(1 / 3) and result["high"] == pytest.approx(1 / 3)


def test_pairs_only_one_model_played_are_left_out_and_counted():
    b = scores([heterogeneous()] * 3)
    a = {seed: dict(tasks) for seed, tasks in b.items()}
    a["1000"]["extra"] = 1.0
    del a["2000"]["2000-t0"]
    result = ps.paired_difference(a, b)
    assert result["pairs"] == 149 and result["left_out"] == 2
    with pytest.raises(ValueError, match="share no scored"):
        ps.paired_difference({"1": {"x": 1.0}}, {"2": {"x": 1.0}})
    with pytest.raises(ValueError, match="resamples"):
        ps.paired_difference(a, b, resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        ps.paired_difference(a, b, confidence=1.5)


def test_the_sign_test_flags_a_difference_resting_on_few_tasks():
    assert ps.sign_test(4, 0) == pytest.approx(0.125)  # 2 * (1/2)^4
    assert ps.sign_test(0, 0) == 1.0 and ps.sign_test(3, 3) == 1.0
    assert ps.sign_test(8, 1) == pytest.approx(2 * (1 + 9) / 2 ** 9)  # C(9, 0) + C(9, 1) of 2^9
    # 4 tasks of 150 better, none worse: the bootstrap interval excludes 0, the sign test does not.
    b = scores([heterogeneous()] * 3)
    a = scores([heterogeneous(extra=2), heterogeneous(extra=2), heterogeneous()])
    result = ps.paired_difference(a, b)
    assert result["excludes_zero"] and result["sign_test_p"] == pytest.approx(0.125)


def test_mean_interval_and_sizing():
    b = scores([heterogeneous()] * 3)
    interval = ps.mean_interval(b)
    assert interval["difference"] == pytest.approx(0.4) and interval["low"] < 0.4 < interval["high"]
    # Binomial: se = sqrt(0.4 * 0.6 / 150) = 0.040, half-width ~ 1.96 se = 0.078.
    assert interval["half_width"] == pytest.approx(0.078, abs=0.008)
    assert ps.pairs_for_half_width(0.1, 150, 0.05) == 600  # half the width: four times the pairs
    assert ps.pairs_for_half_width(0.0, 150, 0.08) is None
    with pytest.raises(ValueError):
        ps.pairs_for_half_width(0.1, 0, 0.08)


# ---- the report: paired section ---------------------------------------------------------------------------------


def write_runs(run_dir: Path, label: str, outcomes: dict[str, dict[str, list[list[float]]]]) -> dict:
    """Results files of one model and its runs dict as the demo records it; outcomes[seed][mode] = per task,
    the rewards of its samples."""
    from benchmarks.results import pass_hat_k, write_results

    runs = {}
    for seed, modes in outcomes.items():
        for mode, tasks in modes.items():
            sims = [{"id": f"{seed}-{t}-s{i}", "task_id": f"{seed}-{t}", "trial": i, "sample_idx": i,
                     "messages": [], "reward_info": {"reward": r}}
                    for t, rewards in enumerate(tasks) for i, r in enumerate(rewards)]
            path = run_dir / "final" / f"{label}_seed{seed}_{mode}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_results(path, sims, None, {})
            hat = pass_hat_k(sims, len(tasks[0]))
            runs[f"{seed}/{mode}"] = {"path": str(path.relative_to(run_dir)), "seconds": 1.5, "pass_hat_k": {
                g: {"n_tasks": v["n_tasks"], **{str(k): p for k, p in v["pass_hat_k"].items()}}
                for g, v in hat.items()}}
    return runs


def model_outcomes(extra_greedy: int, extra_sampled: int) -> dict[str, dict[str, list[list[float]]]]:
    return {seed: {"greedy": [[r] for r in heterogeneous(extra=extra_greedy)],
                   "sampled": [[r, r] for r in heterogeneous(extra=extra_sampled)]} for seed in SEEDS}


def test_the_paired_section_compares_every_model_with_the_base_and_trace(tmp_path):
    from demo.config import DemoConfig
    from demo.report_paired import paired_section

    evaluate = {"base": write_runs(tmp_path, "base", model_outcomes(0, 0)),
                "TRACE": write_runs(tmp_path, "TRACE", model_outcomes(0, 1)),
                "direct GRPO": write_runs(tmp_path, "direct", model_outcomes(10, 0))}
    config = DemoConfig()
    lines, results, printed = paired_section(tmp_path, evaluate, config, resamples=2_000)
    text = "\n".join(lines)
    assert "checked in the results files, for every model" in text
    assert "| TRACE | base | +0.000 [+0.000, +0.000] (0↑ 0↓) | +0.020 [" in text, text
    assert "| direct GRPO | base | **+0.200 [+0.140, +0.267]** (30↑ 0↓) |" in text, text
    assert "| direct GRPO | base | **+0.200 [" in text and "| direct GRPO | TRACE | **+0.200 [" in text
    assert "| base | TRACE |" not in text  # the negative of TRACE vs base
    assert results["comparisons"]["direct GRPO"]["base"]["greedy"]["excludes_zero"]
    assert not results["comparisons"]["TRACE"]["base"]["sampled"]["excludes_zero"]  # +0.02 on 3 tasks of 150
    assert "direct GRPO vs base (greedy: +0.200)" in results["excluding_zero"]  # 30 : 0, sign test p < 0.05
    assert results["same_tasks_as_base"] == {"base": True, "TRACE": True, "direct GRPO": True}
    sizing = results["sizing"]
    assert sizing["pairs_now"] == 150 and sizing["episodes_per_pair_per_model"] == 1 + config.evaluate.samples
    assert sizing["independent_difference_half_width"] == pytest.approx(math.sqrt(2) * sizing["base_half_width"])
    assert sizing["pairs_needed"] == math.ceil(150 * (sizing["independent_difference_half_width"] / 0.08) ** 2)
    assert sizing["episodes_needed"] == sizing["pairs_needed"] * sizing["episodes_per_pair_per_model"] * 3
    assert f"**{sizing['pairs_needed']} (seed, task) pairs**" in text
    assert any(line.startswith("  direct GRPO - base: +0.200 [") for line in printed)


def test_the_paired_section_says_when_a_model_played_other_tasks(tmp_path):
    from demo.config import DemoConfig
    from demo.report_paired import paired_section

    evaluate = {"base": write_runs(tmp_path, "base", model_outcomes(0, 0)),
                "other": write_runs(tmp_path, "other", model_outcomes(0, 0))}
    path = tmp_path / evaluate["other"]["2000/greedy"]["path"]
    data = json.loads(path.read_text())
    data["simulations"][0]["task_id"] = "elsewhere"
    path.write_text(json.dumps(data))
    lines, results, _ = paired_section(tmp_path, evaluate, DemoConfig(), resamples=200)
    assert results["same_tasks_as_base"]["other"] is False
    assert "NOT for other" in "\n".join(lines)
    assert results["comparisons"]["other"]["base"]["greedy"]["left_out"] == 2


# ---- every rollout counted -----------------------------------------------------------------------------------


def accounting_records() -> dict:
    """A run's records, as the steps write them: 10 analysis tasks × 2 samples; calibration 4 tasks × 2 samples
    per probed value (a: 2 values, b: 3, c: not trained); adapters a and b 64 episodes each; gate 32; baselines
    given 160."""
    history = lambda n: [{"knob": "k", "value": v, "success_rate": 0.1} for v in range(n)]  # noqa: E731
    return {
        "select": {"settings": {"tasks": 10, "samples": 2, "seed": 500}, "figures": {"trajectories": 20}},
        "environments": {"settings": {"calibration_tasks": 4, "calibration_samples": 2}, "figures": {"capabilities": {
            "a": {"status": "in_band", "success_rate": 0.3, "history": history(2)},
            "b": {"status": "out_of_range", "success_rate": 0.0, "history": history(3)},
            "c": {"status": "invalid", "detail": "probe scores"}}, "forced": False}},
        "train": {"figures": {"adapters": {"a": {"episodes": 64}, "b": {"episodes": 64}}}},
        "gate": {"figures": {"gate": "gate/gate", "episodes": 32, "sft_data": {"a": 3, "base": 5}}},
        "baselines": {"figures": {"budget_episodes": 160, "direct": {"episodes": 160}, "mixed": {"episodes": 160}}},
    }


def test_every_rollout_is_counted_per_model():
    from demo.config import DemoConfig
    from demo.report_accounting import accounting_section, episode_accounting

    accounting = episode_accounting(accounting_records(), DemoConfig())
    parts = accounting["parts"]
    assert parts["step1_analysis"]["episodes"] == 20
    assert parts["calibration"]["per_probe"] == 8
    assert parts["calibration"]["per_capability"] == {"a": {"probes": 2, "episodes": 16, "census": 0},
                                                      "b": {"probes": 3, "episodes": 24, "census": 0},
                                                      "c": {"probes": 0, "episodes": 0, "census": 0}}
    assert parts["calibration"]["episodes"] == 40
    assert parts["router_sft"]["new_episodes"] == 0 and parts["router_sft"]["data"] == {"a": 3, "base": 5}
    m = accounting["models"]
    assert m["base"] == {"training": 0, "all": 0, "target": 0, "parts": {}, "budget": "none (the SFT'd starting point)"}
    assert (m["lora:a"]["training"], m["lora:a"]["all"], m["lora:a"]["target"]) == (64, 20 + 16 + 64, 20)
    assert (m["lora:b"]["training"], m["lora:b"]["all"], m["lora:b"]["target"]) == (64, 20 + 24 + 64, 20)
    assert (m["TRACE"]["training"], m["TRACE"]["all"], m["TRACE"]["target"]) == (160, 20 + 40 + 128 + 32, 20)
    assert (m["direct GRPO"]["training"], m["direct GRPO"]["all"], m["direct GRPO"]["target"]) == (160, 160, 160)
    assert (m["single-adapter GRPO"]["training"], m["single-adapter GRPO"]["all"],
            m["single-adapter GRPO"]["target"]) == (160, 20 + 40 + 160, 20)
    for model in ("direct GRPO", "single-adapter GRPO"):  # which total the baselines were given
        assert m[model]["budget"] == "TRACE's Steps 3-4 training episodes (160), not its all-episodes total (220)"
    for row in m.values():
        assert row["all"] == sum(row["parts"].values())
    text = "\n".join(accounting_section(accounting, list(m)))
    assert ("| TRACE | 160 | 220 | 20 | Step 1 20 + calibration 40 + router SFT (new) 0 + LoRA a 64 + LoRA b 64 + "
            "gate GRPO 32 | its own: Steps 3-4 |") in text, text
    assert "a 2 × 8, b 3 × 8, c 0 × 8" in text


def test_accounting_of_a_run_without_a_gate_or_baselines():
    from demo.config import DemoConfig
    from demo.report_accounting import episode_accounting

    records = accounting_records()
    records["gate"] = {"figures": {"gate": None, "episodes": 0}}
    records["baselines"] = {"figures": {}}
    accounting = episode_accounting(records, DemoConfig())
    assert set(accounting["models"]) == {"base", "lora:a", "lora:b"}
    # A record without settings falls back to the config's sections.
    del records["select"]["settings"]
    config = DemoConfig()
    assert episode_accounting(records, config)["parts"]["step1_analysis"]["episodes"] == \
        config.select.tasks * config.select.samples


# ---- the report, wired ------------------------------------------------------------------------------------------


def test_render_report_writes_the_paired_differences_and_the_accounting(tmp_path):
    from demo.run import summarize_runs
    from demo.config import DemoConfig
    from demo.report import render_report

    def record(figures: dict, settings: dict | None = None) -> dict:
        return {"seconds": 1.0, "device": "cpu", "figures": figures, "settings": settings or {}}

    records = accounting_records()
    records = {
        "evaluate": record({"base": write_runs(tmp_path, "base", model_outcomes(0, 0))}),
        "select": record({}, records["select"]["settings"]),
        "environments": record({"capabilities": {}, "forced": False}, records["environments"]["settings"]),
        "train": record({"adapters": {}}),
        "gate": record({}),
        "baselines": record({"budget_episodes": 128, "direct": {"episodes": 128, "curve": [
            {"iteration": 1, "mean_reward": 0.1, "success_rate": 0.1}]}}),
        "final": record({"models": {"direct GRPO": write_runs(tmp_path, "direct", model_outcomes(10, 5))}}),
    }
    text, results, table = render_report(tmp_path, records, DemoConfig(), summarize_runs, "default")
    assert "## Paired differences" in text and "## Every rollout counted" in text
    assert "| direct GRPO | base | **+0.200 [" in text
    assert "| direct GRPO | 128 | 128 | 128 | GRPO on the target 128 |" in text
    assert results["episodes"]["models"]["direct GRPO"]["all"] == 128
    assert results["paired"]["comparisons"]["direct GRPO"]["base"]["sampled"]["difference"] == pytest.approx(0.1)
    json.dumps(results)  # results.json
    assert "direct GRPO - base: +0.200 [" in table and "direct GRPO: 128 / 128 / 128" in table


def test_a_run_where_every_task_fails_has_no_variance_to_size_from(tmp_path):
    """The fast profile's barely trained agent passes nothing: differences of 0, and the sizing says why it has
    no figure instead of dividing by a zero width."""
    from demo.config import DemoConfig
    from demo.report_paired import paired_section

    nothing = {seed: {"greedy": [[0.0]] * 5, "sampled": [[0.0, 0.0]] * 5} for seed in SEEDS}
    evaluate = {"base": write_runs(tmp_path, "base", nothing), "TRACE": write_runs(tmp_path, "TRACE", nothing)}
    lines, results, _ = paired_section(tmp_path, evaluate, DemoConfig(), resamples=100)
    assert results["comparisons"]["TRACE"]["base"]["greedy"]["difference"] == 0.0
    assert results["excluding_zero"] == [] and results["sizing"]["pairs_needed"] is None
    assert "no variance to size the evaluation from" in "\n".join(lines)
