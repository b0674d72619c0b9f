"""Issue 25 point 3, a gate that can choose "no adapter": router SFT learns the base slot from the base agent's own
successful target rollouts, leaves hinted GRPO rollouts out, balances its labels, and the demo report shows the
routing share of every slot per request kind on the target."""
from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from benchmarks.results import make_simulation, write_results
from game_registry import get_game
from moe_gate import build_capability_model, save_gate
from moe_gate.smoke_test import make_adapters, make_random_adapter, make_tiny_base, randomise_gate
from train.episodes import Episode, EpisodeRequest, episode_to_simulation
from train.gate_config import MoEGateConfig, SFTConfig
from train.train_router_sft import (IGNORE, LabeledSequence, collate, decided_labels, label_weights, load_sft_sequences,
                                    router_loss, train_router, usable_simulations)


CAP = "precondition_verification"  # a registered capability game (router SFT renders with its tool schemas)


def _chat(i: int) -> list[dict]:
    return [{"role": "system", "content": "You help customers of a store."},
            {"role": "user", "content": f"Please cancel order {i}."},
            {"role": "assistant", "content": f"Order {i} is cancelled."}]


def _grpo_rollout(seed: int, sample_idx: int, hinted: bool, reward: float) -> dict:
    """A rollout as GRPO saves it (train/grpo.py `_write_artifacts` -> `episode_to_simulation`)."""
    request = EpisodeRequest(seed=seed, sample_idx=sample_idx, hinted=hinted)
    episode = Episode(request=request, game=None, tools=[], conversation=_chat(seed), token_ids=[], loss_mask=[],
                      logprobs=[], prompt_len=0, n_prompt_messages=2, termination_reason="done",
                      summary={"reward": reward})
    return episode_to_simulation(episode, sim_id=f"it1-{seed}-{sample_idx}")


def _target_rollout(i: int, reward: float) -> dict:
    """A Step-1 analysis rollout of the base agent on the storefront (train/evaluate.py's records)."""
    return make_simulation(task_id=str(i), sample_idx=0, termination_reason="done", messages=_chat(100 + i),
                           reward_info={"reward": reward, "request_kinds": ["cancel"]})


def _demo_run(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, dict[str, str]]:
    """A demo run folder as far as Step 4 reads it: select/ with Step 1's analysis results, one capability's GRPO
    rollouts (3 successes, one of them hinted, 1 failure). Returns (the gate folder, the adapters)."""
    from train.policy import load_base_model

    run = tmp_path / "run"
    write_results(run / "select" / "analysis_seed500_sampled.json",
                  [_target_rollout(i, r) for i, r in enumerate([1.0, 0.0, 1.0])])
    adapter = make_random_adapter(lambda: load_base_model(str(tiny_model_dir))[0], run / "train" / "cap", r=2,
                                  alpha=4, seed=0, targets=["q_proj", "v_proj"])
    write_results(adapter / "rollouts" / "iter_000001.json",
                  [_grpo_rollout(7, 0, True, 1.0), _grpo_rollout(7, 1, False, 1.0), _grpo_rollout(8, 0, False, 1.0),
                   _grpo_rollout(8, 1, False, 0.0)])
    (run / "gate").mkdir()
    return run / "gate", {CAP: str(adapter)}


@pytest.mark.parametrize("gate_mode", ["token", "trajectory"])
def test_the_base_agents_successful_target_rollouts_reach_router_sft_labeled_base(tiny_model_dir, tmp_path, gate_mode):
    from demo.loop import train_gate
    from train.policy import load_tokenizer

    folder, adapters = _demo_run(tmp_path, tiny_model_dir)
    settings = SimpleNamespace(gate_sft_epochs=1, max_episode_tokens=4096, learning_rate=1e-3, gate_iterations=0,
                               groups_per_iteration=1, group_size=2, gate_mode=gate_mode)
    figures = train_gate(tiny_model_dir, adapters, {CAP: {}}, folder, settings)
    # Counted for the budget: 2 of the 3 target rollouts succeeded; 2 unhinted capability successes.
    assert figures["sft_data"] == {CAP: 2, "base": 2}
    assert figures["sft_hinted_left_out"] == {CAP: 1, "base": 0}
    assert figures["sft_balance_labels"] is True and figures["gate"] == str(folder / "gate_sft")
    config = yaml.safe_load((folder / "moe_gate.yaml").read_text())
    assert config["sft"]["balance_labels"] is True and config["mode"] == gate_mode  # loop.gate_mode reaches the gate
    base_entries = [d for d in config["sft"]["data"] if d["label"] == "base"]
    assert [Path(d["path"]).name for d in base_entries] == ["analysis_seed500_sampled.json"]
    # The sequences router SFT trained on: the target's successes with every assistant token labeled slot 0.
    train, validation = load_sft_sequences(MoEGateConfig(**config), load_tokenizer(str(tiny_model_dir)))
    labels = [sorted({label for label in s.labels if label != IGNORE}) for s in train + validation]
    assert sorted(labels) == [[0], [0], [1], [1]], labels
    assert (folder / "gate_sft" / "gate.safetensors").is_file()


def test_hinted_grpo_rollouts_are_left_out_of_router_sft(tiny_model_dir, tmp_path):
    from train.policy import load_tokenizer
    from train.train_router_sft import sequences_from_results

    hinted, plain = _grpo_rollout(1, 0, True, 1.0), _grpo_rollout(1, 1, False, 1.0)
    assert hinted["hinted"] is True and plain["hinted"] is False  # the field GRPO's rollouts files carry
    kept, left_out = usable_simulations([hinted, plain, _grpo_rollout(2, 0, True, 0.0)], min_reward=1.0)
    assert [s["id"] for s in kept] == [plain["id"]] and left_out == 1  # a failed hinted one is not "left out"
    write_results(tmp_path / "iter.json", [hinted, plain])
    sequences = sequences_from_results(tmp_path / "iter.json", 1, load_tokenizer(str(tiny_model_dir)), tools=[],
                                       min_reward=1.0, max_tokens=4096)
    assert len(sequences) == 1
    # Records without the field (an evaluation's, a target benchmark's) were not hinted.
    target = _target_rollout(0, 1.0)
    assert "hinted" not in target and usable_simulations([target], 1.0) == ([target], 0)


def test_label_weights_give_every_label_present_the_same_total_weight():
    sequences = [LabeledSequence(list(range(12)), [IGNORE] * 2 + [1] * 9 + [2]),
                 LabeledSequence([5, 6, 7, 8], [2, 2, 2, IGNORE])]  # its first token: no position decides it
    weights = label_weights(sequences, n_slots=3)  # [S]: counts 0 / 9 / 3 of 12 labeled tokens after a first
    assert torch.allclose(weights, torch.tensor([0.0, 12 / (2 * 9), 12 / (2 * 3)]))
    assert float(weights[1] * 9) == pytest.approx(float(weights[2] * 3))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)


def test_router_loss_with_class_weights_is_the_weighted_cross_entropy(adapters):
    model = build_capability_model(make_tiny_base(), adapters, mode="token").eval()
    randomise_gate(model, seed=3)
    batch = collate([LabeledSequence([3, 4, 5, 6], [1, 1, 1, 2]), LabeledSequence([9, 8], [0, 2])], 0,
                    torch.device("cpu"))
    weights = torch.tensor([0.5, 2.0, 4.0])  # [S]
    with torch.no_grad():
        loss, _ = router_loss(model, batch, 0.0, weights)
        plain, _ = router_loss(model, batch, 0.0)
    with torch.no_grad(), model.record_routing(keep_logits=True) as record:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    decided = decided_labels(batch.labels)  # [B, T]: each token's label at the position that decides it
    keep = decided != IGNORE  # [B, T]
    targets = decided[keep]  # [n]
    expected = []
    for event in record.events:
        ce = torch.nn.functional.cross_entropy(event.logits[keep].float(), targets, reduction="none")  # [n]
        expected.append(float((weights[targets] * ce).sum() / weights[targets].sum()))
    assert float(loss) == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    assert float(loss) != pytest.approx(float(plain), rel=1e-3)


def test_balance_labels_makes_a_rare_label_as_likely_as_a_frequent_one_on_tokens_the_gate_cannot_tell_apart(
        adapters):
    """Label 1 on 90% of the conversations, label 2 on 10%, the same tokens in both: the best gate without
    balancing gives label 2 its frequency (~0.1), with balancing the same probability as label 1 (~0.5)."""
    rng = random.Random(0)
    sequences = []
    for i in range(40):
        label = 2 if i % 10 == 0 else 1
        tokens = [rng.randrange(2, 8) for _ in range(12)]
        sequences.append(LabeledSequence(tokens, [label] * len(tokens)))

    def rare_probability(balance: bool) -> float:
        torch.manual_seed(0)
        model = build_capability_model(make_tiny_base(), adapters, mode="token")
        train_router(model, sequences, SFTConfig(epochs=3, learning_rate=0.3, batch_size=8, load_balance_weight=0.0,
                                                 balance_labels=balance), pad_token_id=0)
        batch = collate(sequences, 0, torch.device("cpu"))
        with torch.no_grad(), model.record_routing(keep_logits=True) as record:
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        probabilities = torch.stack([e.logits.softmax(-1) for e in record.events])  # [L, B, T, S]
        return float(probabilities[..., :-1, 2].mean())  # the positions that decide a labeled token

    assert rare_probability(False) < 0.2  # measured 0.09
    assert rare_probability(True) > 0.3  # measured 0.41 (longer training lets the gate memorise some conversations:
    # 0.26 after 5 epochs)


def test_sft_config_balance_labels_must_be_a_boolean():
    with pytest.raises(ValueError, match="sft.balance_labels must be true or false"):
        SFTConfig(balance_labels="yes")
    assert SFTConfig().balance_labels is False and SFTConfig(balance_labels=True).balance_labels is True


def test_routing_shares_per_kind_sum_to_one_and_count_each_conversation_under_its_kinds():
    from demo.loop import shares_by_kind

    slots = ["base", "a", "b"]
    conversations = [(["cancel"], torch.tensor([6, 2, 0])), (["cancel"], torch.tensor([0, 2, 0])),
                     (["return"], torch.tensor([1, 0, 3])), (["return", "exchange"], torch.tensor([0, 0, 4]))]
    table = shares_by_kind(conversations, slots)
    assert list(table) == ["cancel", "exchange", "return", "all"]
    for row in table.values():
        assert sum(row["shares"].values()) == pytest.approx(1.0)
    assert table["cancel"]["shares"] == {"base": 0.6, "a": 0.4, "b": 0.0}
    assert table["return"]["conversations"] == 2 and table["return"]["shares"]["b"] == pytest.approx(7 / 8)
    assert table["exchange"]["shares"] == {"base": 0.0, "a": 0.0, "b": 1.0}
    assert table["all"]["decisions"] == 18 and table["all"]["conversations"] == 4


def test_routing_by_kind_rescores_saved_conversations_and_the_report_shows_the_table(tiny_model_dir, tmp_path):
    from demo.loop import routing_by_kind
    from demo.report import routing_section
    from train.policy import load_base_model, load_tokenizer
    from train.train_router_sft import encode_conversation

    def base():
        return load_base_model(str(tiny_model_dir))[0]

    adapter = make_random_adapter(base, tmp_path / "cap", r=2, alpha=4, seed=0, targets=["q_proj", "v_proj"])
    model = build_capability_model(base(), {"cap": str(adapter)}, mode="token")
    randomise_gate(model, seed=1)
    save_gate(model, tmp_path / "gate")
    kinds = ["cancel", "return", "cancel", "exchange", "return", "cancel"]
    simulations = [make_simulation(task_id=str(i), sample_idx=0, termination_reason="done", messages=_chat(i),
                                   reward_info={"reward": 1.0, "request_kinds": [kind]})
                   for i, kind in enumerate(kinds)]
    write_results(tmp_path / "TRACE_seed1_greedy.json", simulations)
    measured = routing_by_kind(tiny_model_dir, tmp_path / "gate", [tmp_path / "TRACE_seed1_greedy.json"], per_kind=2)
    assert measured["slots"] == ["base", "cap"]
    rows = measured["kinds"]
    assert {k: r["conversations"] for k, r in rows.items()} == {"cancel": 2, "exchange": 1, "return": 2, "all": 5}
    for row in rows.values():
        assert sum(row["shares"].values()) == pytest.approx(1.0)
    # Every assistant token of every re-scored conversation, once per layer (the tiny model has 2).
    tools = get_game("storefront").make().get_tool_schemas()
    per_conversation = sum(encode_conversation(load_tokenizer(str(tiny_model_dir)), _chat(0), tools)[1])
    assert rows["exchange"]["decisions"] == 2 * per_conversation

    records = {"gate": {"figures": {"gate": str(tmp_path / "gate"), "sft_data": {"cap": 5, "base": 3},
                                    "sft_hinted_left_out": {"cap": 2, "base": 0}, "sft_balance_labels": True}},
               "final": {"figures": {"models": {"TRACE": {"1/greedy": {"path": "TRACE_seed1_greedy.json"}}},
                                     "routing": {}}}}
    results: dict = {}
    calls = []

    def measure(base_dir, gate_dir, paths):
        calls.append((base_dir, gate_dir, paths))
        return measured

    text = "\n".join(routing_section(tmp_path, records, results, measure=measure))
    assert calls == [(tmp_path / "base" / "model", tmp_path / "gate", [tmp_path / "TRACE_seed1_greedy.json"])]
    assert "cap 5, base 3" in text and "2 successful hinted rollouts left out" in text
    assert "| request kind | conversations | decisions | base | cap |" in text
    assert f"| exchange | 1 | {rows['exchange']['decisions']:,} |" in text, text
    assert results["routing"]["by_kind"] == measured and results["routing"]["sft_data"] == {"cap": 5, "base": 3}
    # A final step that recorded the shares itself is reported as recorded, without re-scoring.
    records["final"]["figures"]["routing"] = {"by_kind": measured}
    routing_section(tmp_path, records, {}, measure=measure)
    assert len(calls) == 1
    assert routing_section(tmp_path, {}, {}) == []  # no gate: no section
