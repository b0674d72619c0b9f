"""Direct GRPO in two settings (issue 29 point 2): GRPO on a fixed pool of target tasks (`GRPOConfig.task_pool`,
train/config.py; the trainer's requests, train/grpo.py), the demo's second direct-GRPO run on it (demo/run.py,
`loop.direct_task_pool`) and the report's side-by-side section (demo/report.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from test_demo_efficiency import letter_game  # noqa: F401  (the fixture: the test game, registered for one test)
from test_demo_stats import SEEDS, heterogeneous, write_runs

REPO = Path(__file__).resolve().parent.parent


def config(**fields):
    from train.config import GRPOConfig

    return GRPOConfig(game="storefront", **fields)


# ---- which tasks a run plays ---------------------------------------------------------------------------------


def test_fresh_tasks_are_consecutive_seeds_never_played_twice():
    c = config(groups_per_iteration=3)
    seeds = [c.task_seed(i, g) for i in range(5) for g in range(3)]
    assert seeds == list(range(c.train_seed_start, c.train_seed_start + 15))


def test_a_fixed_pool_plays_each_of_its_tasks_once_per_pass_in_a_new_order():
    c = config(groups_per_iteration=3, task_pool=7)
    seeds = [c.task_seed(i, g) for i in range(14) for g in range(3)]  # 42 groups: 6 passes over 7 tasks
    pool = set(range(c.train_seed_start, c.train_seed_start + 7))
    passes = [seeds[k:k + 7] for k in range(0, 42, 7)]
    assert all(sorted(p) == sorted(pool) for p in passes), passes
    assert len({tuple(p) for p in passes}) > 1, "every pass in the same order"
    assert seeds == [c.task_seed(i, g) for i in range(14) for g in range(3)]  # a function of (seed, iteration, group)
    other = dataclasses.replace(c, seed=1)
    assert [other.task_seed(i, g) for i in range(14) for g in range(3)] != seeds
    # a pool bigger than the run: every group a different task of the pool
    big = config(groups_per_iteration=4, task_pool=164)
    played = [big.task_seed(i, g) for i in range(20) for g in range(4)]
    assert len(set(played)) == 80 and all(big.train_seed_start <= s < big.train_seed_start + 164 for s in played)


def test_a_bad_pool_says_what_to_give():
    with pytest.raises(ValueError, match=r"task_pool must be an int >= 0 \(0 = a fresh task for every group; N = a "
                                         r"fixed pool of N tasks, e\.g\. 164"):
        config(task_pool=-1)


@pytest.mark.parametrize("bad, why", [(True, "got True"), (1.5, "write 1 or 2"), ("40", "not text")])
def test_a_pool_that_is_not_a_whole_number_is_refused(bad, why):
    with pytest.raises(ValueError, match=rf"task_pool expects int.*{why}"):
        config(task_pool=bad)


def test_the_trainer_plays_only_the_pools_tasks(tiny_model_dir, tmp_path, letter_game):  # noqa: F811
    """GRPO with task_pool 2 plays the pool's two seeds in every iteration's rollouts (3 passes in 6 groups); without
    a pool, six different seeds."""
    from benchmarks.results import load_results
    from demo.config import LoopSettings
    from demo.loop import train_lora

    settings = LoopSettings(groups_per_iteration=2, group_size=2, max_episode_tokens=96)

    def played(folder: Path) -> list[int]:
        return [int(s["task_id"]) for path in sorted((folder / "rollouts").glob("iter_*.json"))
                for s in load_results(path)["simulations"]]

    pooled = train_lora(letter_game, tiny_model_dir, tmp_path / "pool", {}, settings, 3, task_pool=2)
    first = 1_000_000
    assert set(played(tmp_path / "pool")) == {first, first + 1}
    assert pooled["tasks"] == {"pool": 2, "groups": 6, "distinct": 2, "passes": 3.0}
    fresh = train_lora(letter_game, tiny_model_dir, tmp_path / "fresh", {}, settings, 3)
    assert sorted(set(played(tmp_path / "fresh"))) == list(range(first, first + 6))
    assert fresh["tasks"] == {"pool": 0, "groups": 6, "distinct": 6, "passes": None}


# ---- the demo -----------------------------------------------------------------------------------------------


def test_the_demo_pool_is_checked_against_the_evaluation_tasks(tmp_path):
    from common.validation import InputError
    from demo.config import load_demo_config
    from demo.run import Demo

    demo = Demo(load_demo_config(REPO / "configs" / "demo.yaml"), tmp_path, fresh=False, profile="default")
    demo.check_pool_is_held_out(164)  # τ²-Bench's count: none of the 150 evaluation tasks
    with pytest.raises(InputError, match=r"loop\.direct_task_pool 4294967296: the pool's task seeds .* include "
                                         r"evaluation tasks"):
        demo.check_pool_is_held_out(2 ** 32)  # every 32-bit seed: the evaluation's are in it


def test_the_pool_setting_is_validated_and_the_default_is_tau2_benchs_count(tmp_path):
    from common.validation import InputError
    from demo.config import LoopSettings, load_demo_config

    assert LoopSettings().direct_task_pool == 164
    assert load_demo_config(REPO / "configs" / "demo.yaml").loop.direct_task_pool == 40
    assert LoopSettings(direct_task_pool=0).direct_task_pool == 0  # leaves the pool run out
    path = tmp_path / "bad.yaml"
    path.write_text("loop: {direct_task_pool: -3}\n")
    with pytest.raises(InputError, match=r"loop\.direct_task_pool must be an int >= 0, got -3 \(0 leaves direct "
                                         r"GRPO's fixed-pool run out"):
        load_demo_config(path)


def outcomes(extra: int) -> dict:
    return {seed: {"greedy": [[r] for r in heterogeneous(extra=extra)],
                   "sampled": [[r, r] for r in heterogeneous(extra=extra)]} for seed in SEEDS}


def baselines(pool: int, groups: int) -> dict:
    return {"budget_episodes": 128,
            "direct": {"episodes": 128, "tasks": {"pool": 0, "groups": groups, "distinct": groups, "passes": None}},
            "direct_pool": {"episodes": 128, "tasks": {"pool": pool, "groups": groups, "distinct": min(pool, groups),
                                                       "passes": groups / pool}}}


def test_the_report_sets_both_settings_side_by_side_with_a_paired_difference(tmp_path):
    from demo.config import DemoConfig
    from demo.report_efficiency import direct_settings_section
    from demo.report_accounting import episode_accounting
    from demo.run import summarize_runs

    evaluate = {"direct GRPO": write_runs(tmp_path, "direct", outcomes(0)),
                "direct GRPO (task pool)": write_runs(tmp_path, "direct_pool", outcomes(10))}
    records = {"baselines": {"figures": baselines(4, 16)}}
    lines, results, printed = direct_settings_section(tmp_path, records, evaluate, DemoConfig(), summarize_runs,
                                                      resamples=500)
    text = "\n".join(lines)
    assert "## Direct GRPO: a fixed task pool and fresh tasks" in text
    assert "| direct GRPO | fresh | 16 | 16 | - | 0.400 ± 0.000 | 0.400 ± 0.000 |" in text, text
    assert "| direct GRPO (task pool) | 4 | 16 | 4 | 4.00 | 0.600 ± 0.000 | 0.600 ± 0.000 |" in text, text
    assert results["pool_minus_fresh"]["greedy"]["difference"] == pytest.approx(0.2)
    assert "Task pool − fresh, paired over the evaluation's (seed, task) pairs: greedy +0.200 [" in text
    assert "at most once" not in text
    assert printed[0].startswith("direct GRPO, task pool (4 tasks) - fresh: greedy +0.200 [")
    # a pool the run did not go through twice: it says the settings then differ only by chance
    once = {"baselines": {"figures": baselines(164, 160)}}
    assert "played each of its tasks at most once (160 groups, 164 tasks)" in "\n".join(
        direct_settings_section(tmp_path, once, evaluate, DemoConfig(), summarize_runs, resamples=200)[0])
    # no pool run: no section
    assert direct_settings_section(tmp_path, {"baselines": {"figures": {"direct": {"episodes": 1}}}}, evaluate,
                                   DemoConfig(), summarize_runs) == ([], {}, [])
    # the pool run played the target only: all its episodes count on the target, with the budget it was given
    row = episode_accounting(records, DemoConfig())["models"]["direct GRPO (task pool)"]
    assert (row["training"], row["all"], row["target"]) == (128, 128, 128)
    assert row["budget"].startswith("TRACE's Steps 3-4 training episodes (128)")


def test_every_lora_run_of_the_demo_takes_the_loops_optimizer_steps_per_iteration():
    """loop.ppo_epochs x loop.minibatches_per_iteration reach the GRPO config of every LoRA run (adapters and both
    GRPO baselines build theirs with demo.loop.grpo_config); a mini-batch count above the groups is refused."""
    from common.validation import InputError
    from demo.config import LoopSettings
    from demo.loop import grpo_config

    settings = LoopSettings(ppo_epochs=4, minibatches_per_iteration=4, groups_per_iteration=8)
    config = grpo_config("storefront", Path("."), Path("."), {}, settings, 2)
    assert (config.ppo_epochs, config.minibatches_per_iteration, config.steps_per_iteration) == (4, 4, 16)
    one = grpo_config("storefront", Path("."), Path("."), {}, LoopSettings(), 2)
    assert (one.ppo_epochs, one.minibatches_per_iteration) == (1, 1)
    with pytest.raises(InputError, match="minibatches_per_iteration"):
        LoopSettings(minibatches_per_iteration=9, groups_per_iteration=8)
    with pytest.raises(InputError, match="ppo_epochs"):
        LoopSettings(ppo_epochs=0)


def test_the_gate_mode_is_checked_before_any_step_and_names_moe_gates_modes():
    from common.validation import InputError
    from demo.config import GATE_MODES, LoopSettings
    from moe_gate.model_builder import MODES

    assert GATE_MODES == MODES and LoopSettings().gate_mode == "token"  # the paper's token-level routing
    assert LoopSettings(gate_mode="trajectory", gate_iterations=0).gate_mode == "trajectory"
    with pytest.raises(InputError, match="gate_iterations: 0"):  # gate GRPO trains token routing only
        LoopSettings(gate_mode="trajectory", gate_iterations=4)
    with pytest.raises(InputError, match="gate_mode must be one of token, trajectory, global"):
        LoopSettings(gate_mode="sequence")
