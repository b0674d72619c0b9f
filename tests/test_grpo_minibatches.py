"""Learning per rollout: several optimizer steps per iteration (mini-batches of whole groups x ppo_epochs) and
the learning-rate schedule that counts them (train/config.py's docstring)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import game_registry
from common.validation import InputError
from train.backends import HFBackend
from train.config import GRPOConfig, load_config
from train.grpo import GRPOTrainer, Sequence, lr_factor_schedule, split_by_group
from train.policy import LoraPolicy, load_base_model

GAMES_DIR = Path(__file__).resolve().parent / "games"
GAME = "capability_letter_density"


@pytest.fixture(scope="module")
def letter_game():
    game_registry._import_game_file(GAMES_DIR / f"{GAME}_game.py")
    return game_registry.get_game(GAME)


def _trainer(tiny_model_dir: Path, out: Path, spec, **overrides: str) -> GRPOTrainer:
    options = {"groups_per_iteration": "4", "group_size": "2", "lora_r": "4", "learning_rate": "1e-2",
               "lora_target_modules": "[q_proj, v_proj, lm_head]", "max_episode_tokens": "128", **overrides}
    config = load_config(None, options, game=spec.name, model=str(tiny_model_dir), output_dir=str(out))
    torch.manual_seed(0)
    base, tokenizer = load_base_model(config.model)
    policy = LoraPolicy.create(base, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                               target_modules=config.lora_target_modules)
    return GRPOTrainer(config, spec, policy, tokenizer, HFBackend(policy.model, tokenizer.pad_token_id))


def _sequences(tokenizer, texts_by_group: list[list[tuple[str, float]]]) -> list[Sequence]:
    out = []
    for group, members in enumerate(texts_by_group):
        for text, advantage in members:
            ids = tokenizer(text)["input_ids"]
            out.append(Sequence(list(ids), [0] + [1] * (len(ids) - 1), [-4.0] * len(ids), advantage, 0, group))
    return out


def test_split_by_group_keeps_groups_whole_and_sizes_within_one_group():
    sequences = [Sequence([1, 2], [0, 1], [0.0, 0.0], 0.0, 0, group) for group in (3, 3, 5, 5, 8, 8, 9, 9, 11, 11)]
    parts = split_by_group(sequences, 3)
    assert [sorted({s.group for s in part}) for part in parts] == [[3, 5], [8, 9], [11]]
    assert sum(len(p) for p in parts) == len(sequences)
    assert [len(p) for p in split_by_group(sequences[:2], 3)] == [2, 0, 0]  # fewer groups than parts


def test_each_minibatch_of_each_pass_is_one_optimizer_step_and_one_schedule_step(tiny_model_dir, letter_game,
                                                                                 tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, letter_game, minibatches_per_iteration="2", ppo_epochs="3",
                       warmup_iterations="1")
    tokenizer = trainer.chat.tokenizer
    sequences = _sequences(tokenizer, [[("Say: aaaa", 1.0), ("Say: bbbb", -1.0)],
                                       [("Say: cccc", 1.0), ("Say: dddd", -1.0)],
                                       [("Say: eeee", 1.0), ("Say: ffff", -1.0)]])
    steps = []
    original_step = trainer.optimizer.step

    def counting_step(*args, **kwargs):
        steps.append(trainer.scheduler.last_epoch)
        return original_step(*args, **kwargs)

    trainer.optimizer.step = counting_step
    stats = trainer.update(sequences)
    assert stats["optimizer_steps"] == 6.0 and len(steps) == 6  # 3 passes x 2 mini-batches
    assert trainer.scheduler.last_epoch == 6
    # warm-up of 1 iteration = 6 optimizer steps: the lr rises step by step
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)
    assert stats["grad_norm"] > 0 and math.isfinite(stats["loss"])


def test_a_minibatch_without_loss_tokens_takes_no_step(tiny_model_dir, letter_game, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, letter_game, minibatches_per_iteration="4")
    tokenizer = trainer.chat.tokenizer
    stats = trainer.update(_sequences(tokenizer, [[("Say: aaaa", 1.0), ("Say: bbbb", -1.0)]]))
    assert stats["optimizer_steps"] == 1.0 and trainer.scheduler.last_epoch == 1


def test_more_steps_per_batch_move_the_policy_further_toward_the_advantaged_sequence(tiny_model_dir, letter_game,
                                                                                      tmp_path):
    """The same batch, 1 step against 2 passes x 2 mini-batches: the positive-advantage sequences gain more
    log-probability with more steps (a trainer that ignored the mini-batches or passes would tie)."""
    gains = []
    for minibatches, epochs in ((1, 1), (2, 2)):
        trainer = _trainer(tiny_model_dir, tmp_path / f"m{minibatches}", letter_game, learning_rate="3e-3",
                           minibatches_per_iteration=str(minibatches), ppo_epochs=str(epochs), clip_eps="0.5")
        tokenizer = trainer.chat.tokenizer
        sequences = _sequences(tokenizer, [[("Say: aaaa", 1.0), ("Say: bbbb", -1.0)],
                                           [("Say: abab", 1.0), ("Say: baba", -1.0)]])
        trainer._recompute_old_logprobs(sequences)  # on-policy old log-probs: ratio 1 at the first step
        before = [sum(seq.old_logprobs) for seq in sequences]
        trainer.update(sequences)
        after_seqs = [Sequence(s.token_ids, s.loss_mask, [0.0] * len(s.token_ids), s.advantage, 0, s.group)
                      for s in sequences]
        trainer._recompute_old_logprobs(after_seqs)
        after = [sum(seq.old_logprobs) for seq in after_seqs]
        gains.append(sum((a - b) * s.advantage for a, b, s in zip(after, before, sequences)))
    assert gains[0] > 0
    assert gains[1] > 1.5 * gains[0]


@pytest.mark.parametrize("schedule, expected", [
    ("constant", [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.5, 1.0, 1.0, 1.0 - 0.9 * 1 / 4, 1.0 - 0.9 * 2 / 4, 1.0 - 0.9 * 3 / 4]),
    ("cosine", [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in (0, 1, 2, 3)]),
])
def test_lr_schedule_warms_up_then_decays_over_every_optimizer_step(schedule, expected):
    config = GRPOConfig(iterations=3, minibatches_per_iteration=2, warmup_iterations=1, lr_schedule=schedule,
                        min_lr_ratio=0.1, groups_per_iteration=4)
    factor = lr_factor_schedule(config)
    assert [factor(step) for step in range(6)] == pytest.approx(expected)
    assert factor(100) == pytest.approx(1.0 if schedule == "constant" else 0.1)  # decayed to min_lr_ratio


@pytest.mark.parametrize("field, value, message", [
    ("lr_schedule", "step", "lr_schedule must be one of constant, linear, cosine"),
    ("min_lr_ratio", 1.5, "min_lr_ratio must be in"),
    ("minibatches_per_iteration", 0, "minibatches_per_iteration must be in"),
    ("minibatches_per_iteration", 9, "each optimizer step needs at least one group"),
])
def test_config_rejects_bad_learning_per_rollout_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(groups_per_iteration=8, **{field: value})


def test_learning_bench_reads_settings_and_refuses_a_run_folder_without_the_demos_steps(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import grpo_learning

    assert grpo_learning.parse_setting("one_step=1x1") == ("one_step", 1, 1, None)
    assert grpo_learning.parse_setting("wide=2x4") == ("wide", 2, 4, None)
    assert grpo_learning.parse_setting("fast=2x4@3e-3") == ("fast", 2, 4, 3e-3)
    assert grpo_learning.parse_setting("default") == ("default", None, None, None)
    for bad in ("x=0x1", "x=2", "=1x1", "x=ax2", "x=1x1@", "x=1x1@fast", "x=1x1@0", "x=1x1@2"):
        with pytest.raises(InputError, match="is not NAME=ExM"):
            grpo_learning.parse_setting(bad)
    assert grpo_learning.main(["--run_dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "base/model not found" in capsys.readouterr().err
    (tmp_path / "base" / "model").mkdir(parents=True)
    assert grpo_learning.main(["--run_dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "environments/step.json not found" in capsys.readouterr().err


def test_learning_bench_adds_to_an_out_folder_only_figures_of_the_same_experiment(tmp_path, monkeypatch, capsys):
    """A later invocation may add settings, seeds or games to --out; figures measured with other iterations, tasks,
    samples, ... are refused before any training (they would be kept beside the new ones), and so is a second bench
    on the same folder."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import grpo_learning
    from common.run_folder import claimed_run_folder

    (tmp_path / "base" / "model").mkdir(parents=True)
    monkeypatch.setattr(grpo_learning, "trainable_games", lambda run_dir, group_size: {"precondition_verification": {}})
    trained = []
    monkeypatch.setattr(grpo_learning, "train_run", lambda *a, **k: trained.append(a))
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--run_dir", str(tmp_path), "--out", str(out), "--iterations", "4"]
    (out / "results.json").write_text(json.dumps({"games": {}, "arguments": {
        "run_dir": str(tmp_path), "config": "configs/demo.yaml", "iterations": 8, "eval_every": 4, "tasks": 40,
        "samples": 2, "eval_seed": 7000}}))
    assert grpo_learning.main(argv) == 2
    err = capsys.readouterr().err
    assert "measured with other iterations (iterations=8)" in err and len(err.strip().splitlines()) == 1, err
    with claimed_run_folder(out, "--out", fresh=False, command="another bench"):
        assert grpo_learning.main(argv[:-2]) == 2
    assert "is in use by another run" in capsys.readouterr().err
    assert trained == []


def test_learning_bench_summary_reports_pass_rate_and_mean_reward_gains_per_seed():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import grpo_learning

    def point(pass1: float, reward: float) -> dict:
        return {"episodes": 512, "pass1_greedy": pass1, "pass1_t1": pass1, "reward_greedy": reward, "reward_t1": reward}

    results = {"games": {"tool_calling_precision": {
        "base": point(0.0, 0.125),
        "settings": {"default": {"0": {"curve": [point(0.0, 0.25)]}, "1": {"curve": [point(0.0, 0.05)]}}}}}}
    per_class, line = grpo_learning.summarize(results)
    assert "learning counts on 0 of 2 seeds (gain +0.000 < +0.15" in per_class
    # pass^1 does not move; the mean reward does, by seed, and seed 1 fell below half the base's reward
    assert "pass^1 T=1 0.000 -> 0.000 (gain per seed +0.000, +0.000)" in line
    assert "mean reward T=1 0.125 -> 0.150 (gain per seed +0.125, -0.075)" in line
    assert "collapsed seeds: ['1']" in line
