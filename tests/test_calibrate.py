"""pipeline/calibrate_environment.py: metrics against hand-computed cases, bands, bad input, the CLI."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from common.validation import InputError
from pipeline.calibrate_environment import Bands, check_bands, compute_metrics, main, pass_at_k

REPO = Path(__file__).resolve().parent.parent
AIRLINE = REPO / "tests/fixtures/real/tau2-bench/gpt-4.1_airline_default_gpt-4.1_1trials.json"


def sim(task_id, sample_idx, reward, key="sample_idx"):
    return {"id": f"{task_id}-{sample_idx}", "task_id": task_id, key: sample_idx, "reward_info": {"reward": reward}}


def groups_to_sims(groups: dict, order: dict | None = None) -> list[dict]:
    """groups: task_id -> rewards in sample_idx order; order: task_id -> file order of the sample indices."""
    sims = []
    for task_id, rewards in groups.items():
        for idx in (order or {}).get(task_id, range(len(rewards))):
            sims.append(sim(task_id, idx, rewards[idx]))
    return sims


def write(tmp_path: Path, sims, name="rollouts.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"info": {}, "tasks": [], "simulations": sims}))
    return path


# Hand-computed case. Group a has rewards [0, 1, 0, 1] by sample_idx but sits in the file in the order
# idx 3, 0, 2, 1, so "first k" must sort by sample_idx. Groups b = [0, 0, 0, 0], c = [1, 1, 1, 1].
#   mean_reward = success_rate = 6/12 = 0.5; population std of six 1s and six 0s = 0.5
#   all-success: c -> 1/3; all-zero: b -> 1/3; constant: b, c -> 2/3; informative: a -> 1/3
#   pass@1 (unbiased): a 1 - C(2,1)/C(4,1) = 0.5, b 0, c 1 -> 0.5
#   pass@4 (unbiased): a n-c = 2 < 4 -> 1, b 1 - C(4,4)/C(4,4) = 0, c 1 -> 2/3
#   pass@1 first: a's idx 0 has reward 0 -> 0, b 0, c 1 -> 1/3;  pass@4 first: a 1, b 0, c 1 -> 2/3
HAND = {"a": [0, 1, 0, 1], "b": [0, 0, 0, 0], "c": [1, 1, 1, 1]}
HAND_ORDER = {"a": [3, 0, 2, 1]}


def test_metrics_hand_computed():
    m = compute_metrics(groups_to_sims(HAND, HAND_ORDER))
    assert m["n_groups"] == 3 and m["n_samples"] == 12
    assert m["mean_reward"] == pytest.approx(0.5)
    assert m["success_rate"] == pytest.approx(0.5)
    assert m["reward_std"] == pytest.approx(0.5)
    assert m["frac_all_success"] == pytest.approx(1 / 3)
    assert m["frac_all_zero"] == pytest.approx(1 / 3)
    assert m["frac_constant"] == pytest.approx(2 / 3)
    assert m["frac_informative"] == pytest.approx(1 / 3)
    assert m["pass_at_k"] == pytest.approx({"1": 0.5, "4": 2 / 3})
    assert m["pass_at_k_first"] == pytest.approx({"1": 1 / 3, "4": 2 / 3})
    assert set(m["pass_at_k"]) == {"1", "4"}  # 8 and 16 exceed the group size


def test_metrics_partial_rewards_and_threshold():
    # Rewards 0.5 count as success only when the threshold allows it; all-zero needs exact zeros.
    sims = groups_to_sims({"x": [0.5, 0.5], "y": [0.0, 0.25]})
    strict = compute_metrics(sims)
    assert strict["success_rate"] == 0.0 and strict["frac_all_success"] == 0.0
    assert strict["frac_all_zero"] == 0.0  # y has a 0.25
    assert strict["frac_constant"] == 0.5  # x is constant
    assert strict["mean_reward"] == pytest.approx(1.25 / 4)
    loose = compute_metrics(sims, success_threshold=0.5)
    assert loose["success_rate"] == 0.5 and loose["frac_all_success"] == 0.5
    assert loose["pass_at_k"]["1"] == pytest.approx(0.5)


def test_unequal_group_sizes_limit_k_and_warn():
    # x = [1, 0] (n=2), y = [0, 0, 1, 1] (n=4): only k=1 fits every group.
    # pass@1: x 1/2, y 2/4 -> 0.5; first-1: x idx0 = 1, y idx0 = 0 -> 0.5
    m = compute_metrics(groups_to_sims({"x": [1, 0], "y": [0, 0, 1, 1]}))
    assert m["pass_at_k"] == pytest.approx({"1": 0.5})
    assert m["pass_at_k_first"] == pytest.approx({"1": 0.5})
    assert (m["min_group_size"], m["max_group_size"]) == (2, 4)
    errors, warnings = check_bands(m, Bands())
    assert any("unequal group sizes" in w for w in warnings)


def test_pass_at_k_estimator():
    assert pass_at_k(100, 1, 16) == pytest.approx(0.16)
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0
    for n, c, k in [(10, 3, 4), (16, 5, 8), (200, 7, 16)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)


def test_trial_is_the_sample_index_when_sample_idx_is_missing():
    sims = [sim("t", 1, 1.0, key="trial"), sim("t", 0, 0.0, key="trial")]
    assert compute_metrics(sims)["pass_at_k_first"]["1"] == 0.0  # trial 0 failed


def test_real_tau2_fixture():
    data = json.loads(AIRLINE.read_text())
    m = compute_metrics(data["simulations"])
    assert (m["n_samples"], m["n_groups"], m["success_rate"]) == (20, 20, 0.5)
    errors, warnings = check_bands(m, Bands())
    assert any("size 1" in w for w in warnings)
    assert any("frac_constant" in e for e in errors)  # one sample per task: no group can vary


def test_bands_validate():
    with pytest.raises(ValueError, match="swap"):
        Bands(min_mean_reward=0.7, max_mean_reward=0.6)
    with pytest.raises(ValueError):
        Bands(min_reward_std=1.5)
    with pytest.raises(ValueError):
        Bands(min_pass_at_k={0: 0.5})


def test_k_larger_than_smallest_group_is_refused(tmp_path, capsys):
    sims = groups_to_sims({t: [1, 0, 0, 0, 1, 0, 1, 0] for t in range(5)})
    path = write(tmp_path, sims)
    out = tmp_path / "cal.json"
    assert main([str(path), "--min-pass-at-k", "16=0.1", "--json-output", str(out)]) == 2
    assert "k=16 needs groups of at least 16 samples; smallest group has 8" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(InputError, match="k=16"):
        check_bands(compute_metrics(sims), Bands(max_pass_at_k={16: 0.9}))


def _calibrated_sims():
    # 10 groups of 8; group t succeeds on its first (t % 4) + 1 samples: 1,2,3,4,1,2,3,4,1,2 = 23 of 80
    groups = {t: [1 if i < (t % 4) + 1 else 0 for i in range(8)] for t in range(10)}
    return groups_to_sims(groups)


def test_cli_pass_writes_report(tmp_path, capsys):
    path = write(tmp_path, _calibrated_sims())
    out = tmp_path / "sub" / "cal.json"
    assert main([str(path), "--json-output", str(out), "--min-pass-at-k", "1=0.1", "--max-pass-at-k", "8=1.0"]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"metrics", "errors", "warnings"}
    assert report["errors"] == [] and report["warnings"] == []
    # successes per group: 1,2,3,4,1,2,3,4,1,2 = 23 of 80
    assert report["metrics"]["success_rate"] == pytest.approx(23 / 80)
    assert set(report["metrics"]["pass_at_k"]) == {"1", "4", "8"}
    assert "RESULT: PASS" in capsys.readouterr().out


def test_cli_band_failures_exit_1_each_listed(tmp_path, capsys):
    # 10 groups, 8 all-success and 2 all-zero: too easy, nothing informative.
    groups = {t: [1] * 4 if t < 8 else [0] * 4 for t in range(10)}
    path = write(tmp_path, groups_to_sims(groups))
    out = tmp_path / "cal.json"
    assert main([str(path), "--json-output", str(out), "--max-pass-at-k", "4=0.5"]) == 1
    errors = json.loads(out.read_text())["errors"]
    failed = {e.split(" ")[0] for e in errors}
    assert failed == {
        "mean_reward", "success_rate", "frac_all_success", "frac_constant", "frac_informative", "pass@4",
    }
    assert any("--max-frac-all-success" in e for e in errors)
    stdout = capsys.readouterr().out
    assert stdout.count("FAIL ") == len(errors)
    # Widening the bands turns the same file into a pass.
    assert main([str(path), "--max-mean-reward", "1", "--max-success-rate", "1", "--max-frac-all-success", "1",
                 "--max-frac-constant", "1", "--min-frac-informative", "0"]) == 0


BAD_INPUTS = {
    "broken_json": '{"simulations": [',
    "empty_file": "",
    "missing_simulations": json.dumps({"info": {}}),
    "empty_simulations": json.dumps({"simulations": []}),
    "no_task_id": json.dumps({"simulations": [{"sample_idx": 0, "reward_info": {"reward": 1.0}}]}),
    "no_reward": json.dumps({"simulations": [{"task_id": "1", "sample_idx": 0, "reward_info": {}}]}),
    "no_reward_info": json.dumps({"simulations": [{"task_id": "1", "sample_idx": 0}]}),
    "reward_above_1": json.dumps({"simulations": [sim("1", 0, 1.5)]}),
    "reward_negative": json.dumps({"simulations": [sim("1", 0, -0.1)]}),
    "reward_bool": json.dumps({"simulations": [sim("1", 0, True)]}),
    "reward_string": json.dumps({"simulations": [sim("1", 0, "1.0")]}),
    "duplicate": json.dumps({"simulations": [sim("1", 0, 1.0), sim("1", 0, 0.0)]}),
    "no_sample_idx": json.dumps({"simulations": [{"task_id": "1", "reward_info": {"reward": 1.0}}]}),
    "not_an_object": json.dumps([sim("1", 0, 1.0)]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, case):
    path = tmp_path / f"{case}.json"
    path.write_text(BAD_INPUTS[case])
    out = tmp_path / "cal.json"
    assert main([str(path), "--json-output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert not out.exists()


def test_missing_file_and_bad_flags_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.json")]) == 2
    path = write(tmp_path, _calibrated_sims())
    assert main([str(path), "--min-mean-reward", "0.9"]) == 2  # above the max: Bands refuses
    with pytest.raises(SystemExit) as exit_info:
        main([str(path), "--min-pass-at-k", "four=0.5"])
    assert exit_info.value.code == 2


def test_runs_as_a_script(tmp_path):
    path = write(tmp_path, _calibrated_sims())
    proc = subprocess.run(
        [sys.executable, str(REPO / "pipeline/calibrate_environment.py"), str(path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "RESULT: PASS" in proc.stdout


def test_reference_flag_names_work_as_aliases(tmp_path, capsys):
    """The reference's calibration command runs unchanged (its flags are aliases of ours)."""
    path = write(tmp_path, _calibrated_sims())
    out = tmp_path / "ref.json"
    ours = tmp_path / "ours.json"
    reference = ["--group-size", "8", "--mean-min", "0.2", "--mean-max", "0.6", "--success-min", "0.2",
                 "--success-max", "0.6", "--std-min", "0.05", "--max-all-success-groups", "0.2",
                 "--max-all-zero-groups", "0.2", "--max-constant-groups", "0.5", "--min-informative-groups", "0.5",
                 "--pass-at-k", "1,4,8", "--min-pass-at-k", "1=0.1,4=0.2", "--max-pass-at-k", "8:1.0"]
    assert main([str(path), *reference, "--json-output", str(out)]) == 0
    assert main([str(path), "--min-pass-at-k", "1=0.1", "--min-pass-at-k", "4=0.2", "--max-pass-at-k", "8=1.0",
                 "--json-output", str(ours)]) == 0
    assert json.loads(out.read_text()) == json.loads(ours.read_text())
    # An alias sets the same band as our name: a too-high minimum fails the same way.
    assert main([str(path), "--mean-min", "0.5"]) == 1
    assert "mean_reward = 0.2875 is below the minimum 0.5 (--min-mean-reward)" in capsys.readouterr().out


def test_group_size_flags_groups_that_are_too_small(tmp_path, capsys):
    path = write(tmp_path, _calibrated_sims())  # 10 groups of 8
    out = tmp_path / "cal.json"
    assert main([str(path), "--group-size", "16", "--json-output", str(out)]) == 1
    errors = json.loads(out.read_text())["errors"]
    assert errors == ["10 of 10 groups have fewer than --group-size 16 samples (smallest: 8); "
                      "collect --samples 16 per seed"]
    assert main([str(path), "--group-size", "16", "--allow-partial-groups", "--json-output", str(out)]) == 0
    assert json.loads(out.read_text())["warnings"] == errors
    assert main([str(path), "--pass-at-k", "1,16", "--json-output", str(out)]) == 0
    assert "pass@16 not computed: the smallest group has 8 samples" in json.loads(out.read_text())["warnings"]
    assert main([str(path), "--group-size", "0"]) == 2
    assert main([str(path), "--allow-partial-groups"]) == 2
    with pytest.raises(SystemExit):
        main([str(path), "--pass-at-k", "0,4"])


# ---- estimate_reward_spread: the share of GRPO-sized groups whose rewards differ ------------------------------


def spread(groups: dict, group_size: int) -> dict:
    from pipeline.calibrate_environment import estimate_reward_spread

    return estimate_reward_spread(groups_to_sims(groups), group_size)


def test_spread_estimate_on_hand_made_rewards():
    # Tasks [0, 0], [0, 0], [0, 0.6], [0.6, 0.6]. Task-averaged shares pi = (0 -> 2.5/4, 0.6 -> 1.5/4) = (5/8, 3/8);
    # S = 25/64 + 9/64 = 34/64. Two samples of a task agree in 3 of 4 tasks: A = 3/4. Concentration
    # alpha = (1 - A) / (A - S) = (1/4) / (14/64) = 8/7, so alpha*pi = (5/7, 3/7).
    # A group of 4 is constant with chance (5*12*19*26 + 3*10*17*24) / (8*15*22*29) = (29640 + 12240) / 76560;
    # a group of 2 with chance A itself.
    groups = {"a": [0.0, 0.0], "b": [0.0, 0.0], "c": [0.0, 0.6], "d": [0.6, 0.6]}
    four = spread(groups, 4)
    assert four["pair_agreement"] == pytest.approx(0.75)
    assert four["concentration"] == pytest.approx(8 / 7)
    assert four["spread_share"] == pytest.approx(1 - 41880 / 76560)
    assert spread(groups, 2)["spread_share"] == pytest.approx(0.25)
    assert spread(groups, 1)["spread_share"] == pytest.approx(0.0)  # one episode never varies


def test_spread_sees_partial_rewards_and_constant_tasks():
    # Every task scores 0 once and 0.6 once: no success, yet the tasks agree less than the pooled rewards do
    # (A = 0 < S = 1/2), so every task plays the pooled 50/50 and a group of 8 is constant with chance 2 / 2^8.
    partial = spread({t: [0.0, 0.6] for t in range(5)}, 8)
    assert partial["spread_share"] == pytest.approx(1 - 2 * 0.5 ** 8) and partial["concentration"] is None
    assert spread({t: [0.6, 0.6, 0.6] for t in range(5)}, 8)["spread_share"] == 0.0  # all rewards equal
    # Half the tasks always pass, half always fail: pooled rewards are 50/50 (a pooled guess would say 0.99),
    # but no task's group ever varies.
    split = spread({t: [1.0] * 4 if t < 4 else [0.0] * 4 for t in range(8)}, 8)
    assert split["spread_share"] == 0.0 and split["concentration"] == 0.0
    # Rewards equal to 9 decimals are one value (GRPO drops groups within 1e-8).
    assert spread({t: [0.5, 0.5 + 1e-12] for t in range(3)}, 8)["spread_share"] == 0.0
    # One sample per task: agreement unmeasured, the pooled shares are used.
    single = spread({0: [1.0], 1: [0.0]}, 8)
    assert single["pair_agreement"] is None and single["spread_share"] == pytest.approx(1 - 2 * 0.5 ** 8)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="group_size"):
            spread({0: [1.0]}, bad)


def test_spread_from_few_samples_per_task_estimates_the_share_at_the_grpo_group_size():
    """Tasks whose success chance p is drawn from Beta(1, 2), two samples each: a group of 8 is constant with
    chance E[p^8] + E[(1-p)^8] = B(9, 2)/B(1, 2) + B(1, 10)/B(1, 2) = 1/45 + 1/5, whatever two samples say.
    The estimate recovers 1 - 1/45 - 1/5 = 0.778; scoring each task by its own two samples would say about
    0.33 (the share of tasks whose two samples differ, 1/3), pooling them 0.96 (1 - (1/3)^8 - (2/3)^8)."""
    import random

    rng = random.Random(0)
    groups = {}
    for task in range(6000):
        p = rng.betavariate(1, 2)
        groups[task] = [float(rng.random() < p) for _ in range(2)]
    assert spread(groups, 8)["spread_share"] == pytest.approx(1 - 1 / 45 - 1 / 5, abs=0.03)
