"""Reward targets for the gate (train/routing_targets.py, router SFT's `sft.objective: reward`): each slot's logit is
fitted to its measured reward per task, so the gate routes to the slot that succeeds; the demo's gate step trains
on them (loop.gate_labels "reward") and counts their new episodes."""
from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from benchmarks.results import make_simulation, write_results
from common.validation import InputError
from moe_gate import build_capability_model
from moe_gate.smoke_test import make_adapters, make_tiny_base
from train.gate_config import MoEGateConfig, SFTConfig
from train.routing_targets import best_slots, main, reward_targets, summarize
from train.train_router_sft import IGNORE, LabeledSequence, collate, reward_sequences, train_router

SLOTS = ["base", "precondition", "refund"]
REWARDS = {  # slot -> task -> rewards of its samples
    "base": {"a": [1, 1], "b": [1, 0], "c": [0, 0], "d": [0, 0], "e": [1, 0]},
    "precondition": {"a": [1, 1], "b": [1, 1], "c": [0, 1], "d": [0, 0], "e": [0, 0]},
    "refund": {"a": [0, 0], "b": [0, 0], "c": [1, 0], "d": [0, 0], "e": [1, 0]},
}


def _sim(task: str, sample: int, reward: float, slot: str, hinted: bool | None = None) -> dict:
    extra = {} if hinted is None else {"hinted": hinted}
    return make_simulation(task_id=task, sample_idx=sample, termination_reason="done",
                           messages=[{"role": "user", "content": f"Please help with order {task}."},
                                     {"role": "assistant", "content": f"{slot} did it."}],
                           reward_info={"reward": reward}, sim_id=f"{slot}-{task}-{sample}", **extra)


def _table(rewards: dict[str, dict[str, list[float]]]) -> dict[str, list[dict]]:
    return {slot: [_sim(task, i, r, slot) for task, rs in tasks.items() for i, r in enumerate(rs)]
            for slot, tasks in rewards.items()}


def test_each_slots_target_is_its_mean_reward_per_task_and_the_best_slots_keep_ties():
    targets = reward_targets(_table(REWARDS), SLOTS)
    assert targets == {"a": [1.0, 1.0, 0.0], "b": [0.5, 1.0, 0.0], "c": [0.0, 0.5, 0.5], "d": [0.0, 0.0, 0.0],
                       "e": [0.5, 0.0, 0.5]}
    assert best_slots(targets, SLOTS) == {"a": ["base", "precondition"], "b": ["precondition"],
                                          "c": ["precondition", "refund"], "d": [], "e": ["base", "refund"]}
    summary = summarize(targets, SLOTS)
    assert summary["tasks"] == 5 and summary["unsolved"] == 1
    assert {s: (v["best_tasks"], v["best_alone"]) for s, v in summary["slots"].items()} == {
        "base": (2, 0), "precondition": (3, 1), "refund": (2, 0)}
    assert summary["slots"]["precondition"]["mean_reward"] == pytest.approx(2.5 / 5)


def test_every_slot_must_have_played_the_same_tasks():
    with pytest.raises(InputError, match="same tasks"):
        reward_targets({"base": [_sim("a", 0, 1, "base"), _sim("b", 0, 0, "base")], "x": [_sim("a", 0, 1, "x")]},
                       ["base", "x"])
    with pytest.raises(InputError, match="none for \\['x'\\]"):
        reward_targets({"base": [_sim("a", 0, 1, "base")]}, ["base", "x"])
    with pytest.raises(InputError, match="not slots"):
        reward_targets({"base": [_sim("a", 0, 1, "base")], "y": [_sim("a", 0, 1, "y")]}, ["base"])


def test_the_cli_prints_each_slots_mean_reward_and_wins(tmp_path, capsys):
    args = []
    for slot, sims in _table(REWARDS).items():
        args += ["--slot", f"{slot}={write_results(tmp_path / f'{slot}.json', sims)}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "precondition: mean reward 0.500; best on 3 of 5 tasks (1 alone)" in out and "no slot solved 1" in out
    with pytest.raises(SystemExit):  # NAME=RESULTS is required
        main(["--slot", "base"])


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)


def test_a_gate_fitted_to_reward_targets_routes_to_the_slot_that_succeeds_most_where_tasks_look_alike(adapters):
    """Conversations that say nothing about the task; on half the tasks (the easy ones) every slot succeeds, on
    the other half slot 1 on 80% and slots 0 and 2 on 10% each: the gate's top-1 is slot 1 (labels of each task's
    best slots, ties kept, would give slot 0 almost as many tokens as slot 1)."""
    rng = random.Random(0)
    tokens = [rng.randrange(2, 8) for _ in range(12)]  # every conversation the same: nothing tells tasks apart
    sequences = []
    for i in range(40):
        easy = i % 2 == 0  # every slot succeeds; on the others only slot 1 (and slot 0 or 2 now and then)
        succeeds = [1.0, 1.0, 1.0] if easy else [float(i % 10 == 1), 1.0 if i % 5 != 3 else 0.0, float(i % 10 == 5)]
        sequences.append(LabeledSequence(tokens, [0] * len(tokens), succeeds))
    torch.manual_seed(0)
    model = build_capability_model(make_tiny_base(), adapters, mode="token")
    train_router(model, sequences, SFTConfig(epochs=5, learning_rate=0.1, batch_size=8, load_balance_weight=0.0,
                                             objective="reward"), pad_token_id=0)
    batch = collate(sequences, 0, torch.device("cpu"))
    with torch.no_grad(), model.record_routing(keep_logits=True) as record:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    top1 = torch.stack([e.logits.argmax(-1) for e in record.events])  # [L, B, T]
    assert float((top1 == 1).float().mean()) > 0.9


def test_reward_sequences_mark_every_unhinted_conversation_with_its_tasks_targets(tiny_model_dir, tmp_path):
    from train.policy import load_tokenizer

    sims = _table({"base": {"a": [1, 0]}, "cap": {"a": [1, 1]}})
    sims["cap"].append(_sim("a", 2, 0.0, "cap", hinted=True))  # left out, and not part of the target either
    data = [{"path": str(write_results(tmp_path / f"{slot}.json", s)), "label": slot} for slot, s in sims.items()]
    config = MoEGateConfig(adapters={"cap": "x"}, sft={"data": data, "objective": "reward"})
    sequences = reward_sequences(config, load_tokenizer(str(tiny_model_dir)))
    assert len(sequences) == 4  # failures too: a target says which slot fails
    assert all(s.rewards == [0.5, 1.0] for s in sequences)
    assert all(set(s.labels) == {IGNORE, 0} for s in sequences)  # the assistant tokens, marked


def test_the_reward_objective_is_checked():
    with pytest.raises(ValueError, match="sft.objective must be one of"):
        SFTConfig(objective="rewards")
    with pytest.raises(ValueError, match="balance_labels"):
        SFTConfig(objective="reward", balance_labels=True)
    assert SFTConfig().objective == "label"


def test_the_demo_gate_trains_on_reward_targets_and_counts_their_episodes(tiny_model_dir, tmp_path):
    from demo.loop import train_gate
    from demo.report_accounting import episode_accounting
    from test_router_sft_base_labels import CAP, _demo_run

    folder, adapters = _demo_run(tmp_path, tiny_model_dir)
    sims = _table({"base": REWARDS["base"], CAP: REWARDS["precondition"]})
    data = [{"path": str(write_results(folder / "routing" / f"{slot}.json", s)), "label": slot, "game": "storefront"}
            for slot, s in sims.items()]
    routing = {"data": data, "summary": summarize(reward_targets(sims, ["base", CAP]), ["base", CAP]), "episodes": 10}
    settings = SimpleNamespace(gate_sft_epochs=1, max_episode_tokens=4096, learning_rate=1e-3, gate_iterations=0,
                               groups_per_iteration=1, group_size=2, gate_mode="token")
    figures = train_gate(tiny_model_dir, adapters, {CAP: {}}, folder, settings, routing=routing)
    # Every conversation of both slots on the five tasks, not the GRPO rollouts or Step 1's successes.
    assert figures["sft_data"] == {"base": 10, CAP: 10} and figures["sft_labels"] == "reward"
    assert figures["routing_episodes"] == 10 and figures["routing_targets"]["tasks"] == 5
    config = yaml.safe_load((folder / "moe_gate.yaml").read_text())
    assert config["sft"]["objective"] == "reward" and config["sft"]["balance_labels"] is False
    assert config["sft"]["load_balance_weight"] == 0.0 and config["sft"]["data"] == data
    assert (folder / "gate_sft" / "gate.safetensors").is_file()
    # The new episodes are part of TRACE's training (so of the baselines' budget), played on the target.
    records = {"select": {"settings": {"tasks": 3, "samples": 1}},
               "environments": {"settings": {"calibration_tasks": 1, "calibration_samples": 1}, "figures": {}},
               "train": {"figures": {"adapters": {CAP: {"episodes": 8}}}}, "gate": {"figures": figures}}
    config_ns = SimpleNamespace(select=SimpleNamespace(tasks=3, samples=1),
                                loop=SimpleNamespace(calibration_tasks=1, calibration_samples=1))
    trace = episode_accounting(records, config_ns)["models"]["TRACE"]
    assert trace["training"] == 8 + 10 and trace["parts"]["router_sft_new"] == 10 and trace["target"] == 3 + 10


def test_gate_labels_are_checked_and_routing_tasks_must_not_be_evaluation_tasks():
    from demo.config import GATE_LABELS, LoopSettings
    from demo.run import Demo

    assert GATE_LABELS == ("game", "reward") and LoopSettings().gate_labels == "game"
    with pytest.raises(InputError, match="gate_labels"):
        LoopSettings(gate_labels="rewards")
    evaluate = SimpleNamespace(seeds=[1000, 2000], tasks=5)
    Demo.check_routing_is_held_out(SimpleNamespace(config=SimpleNamespace(
        evaluate=evaluate, select=SimpleNamespace(seed=500))), 100)  # Step 1's own tasks: fine
    with pytest.raises(InputError, match="select.seed"):
        Demo.check_routing_is_held_out(SimpleNamespace(config=SimpleNamespace(
            evaluate=evaluate, select=SimpleNamespace(seed=2000))), 3)
