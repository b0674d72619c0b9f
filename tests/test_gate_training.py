"""Step 4 training: router SFT (gate cross-entropy + load balance) and GRPO over the gates (GatePolicy)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import game_registry
from moe_gate import build_capability_model, save_gate
from moe_gate.smoke_test import make_adapters, make_random_adapter, make_tiny_base, randomise_gate
from common.validation import InputError
from train.backends import HFBackend, SamplingParams
from train.gate_config import MoEGateConfig, SFTConfig, load_gate_config
from train.gate_policy import GatePolicy
from train.logprobs import token_logprobs, token_logprobs_after_prefix
from train.train_router_sft import LabeledSequence, routing_accuracy, train_router

from tracking_readback import (GRPO_NAMES, ROUTER_NAMES, assert_same_series, expected_series, rows,
                               tensorboard_scalars)

REPO = Path(__file__).resolve().parent.parent
GAMES_DIR = REPO / "tests" / "games"
GAME = "capability_letter_density"
# Token ranges per slot: few distinct tokens per class, so the classes are linearly separable in the
# embedding space the first gate reads (random vectors; 18 points in 32 dimensions).
RANGES = [(2, 8), (32, 38), (64, 70)]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)


def _synthetic(n: int, seed: int) -> list[LabeledSequence]:
    """Sequences whose every token after the first is labeled with the slot the token before it belongs to by its
    range (labels mixed per token): router SFT trains a token's label at the position before it, which decides it."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        slots = [rng.randrange(3) for _ in range(rng.randint(10, 20))]
        out.append(LabeledSequence([rng.randrange(*RANGES[slot]) for slot in slots], [-100] + slots[:-1]))
    return out


def test_router_sft_on_separable_data_raises_routing_accuracy_from_chance_to_90_percent(adapters):
    torch.manual_seed(0)
    model = build_capability_model(make_tiny_base(), adapters, mode="token")
    train, held_out = _synthetic(64, 0), _synthetic(16, 1)
    before = routing_accuracy(model, held_out, pad_token_id=0)
    assert before < 0.45  # chance: a fresh gate sends every token to slot 0, a third of the labels
    base_state = {k: v.clone() for k, v in model.get_base_model().state_dict().items()}
    history = train_router(model, train, SFTConfig(epochs=10, learning_rate=0.5, batch_size=16,
                                                   load_balance_weight=0.01), pad_token_id=0, validation=held_out)
    assert history[-1]["validation_accuracy"] >= 0.9, [round(h["validation_accuracy"], 3) for h in history]
    after = model.get_base_model().state_dict()
    assert all(torch.equal(base_state[k], after[k]) for k in base_state)  # backbone untouched


def test_router_sft_trajectory_mode_learns_one_label_per_conversation(adapters):
    torch.manual_seed(0)
    rng = random.Random(2)
    sequences = []
    for _ in range(48):  # prompt tokens from the label's range, then labeled "assistant" tokens
        label = rng.randrange(3)
        prompt = [rng.randrange(*RANGES[label]) for _ in range(rng.randint(4, 8))]
        answer = [rng.randrange(80, 95) for _ in range(5)]
        sequences.append(LabeledSequence(prompt + answer, [-100] * len(prompt) + [label] * len(answer)))
    model = build_capability_model(make_tiny_base(), adapters, mode="trajectory")
    history = train_router(model, sequences[:40], SFTConfig(epochs=8, learning_rate=0.5, batch_size=8,
                                                            load_balance_weight=0.0),
                           pad_token_id=0, validation=sequences[40:])
    assert history[-1]["train_accuracy"] >= 0.9, [round(h["train_accuracy"], 3) for h in history]


def test_routed_model_works_with_the_rollout_backend_and_the_log_prob_scorers(adapters):
    model = build_capability_model(make_tiny_base(), adapters, mode="token").eval()
    randomise_gate(model, seed=1)
    prompts = [[5, 17, 33, 8], [3, 90, 41, 7, 25, 66]]
    backend = HFBackend(model, pad_token_id=0, seed=0)
    completions = backend.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    for prompt, completion in zip(prompts, completions):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
        assert completion.token_ids == reference[0, len(prompt):].tolist()
    prefix = torch.tensor([5, 17, 33])
    rows = torch.tensor([[8, 61, 2, 44], [8, 9, 70, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    with torch.no_grad():
        shared = token_logprobs_after_prefix(model, prefix, rows, mask)
        full = token_logprobs(model, torch.cat([prefix.expand(2, 3), rows], 1),
                              torch.cat([torch.ones(2, 3, dtype=torch.long), mask], 1))[:, 3:]
    assert torch.allclose(shared, full, atol=1e-5)


@pytest.mark.parametrize("mode", ["token", "trajectory", "global"])
def test_routed_batch_whose_rows_stop_at_different_steps_samples_each_row_as_alone(adapters, mode):
    """The sampler drops rows that stopped from its batch; trajectory/global routing keeps per-row decisions
    from the prefill, so it must keep every row (supports_row_dropping), token routing may drop them."""
    model = build_capability_model(make_tiny_base(), adapters, mode=mode).eval()
    randomise_gate(model, seed=1)
    prompts = [[5, 17, 33, 8], [3, 90, 41, 7, 25, 66], [64, 2, 33, 33, 9], [70, 71, 5, 32]]
    free = HFBackend(model, pad_token_id=0, seed=0).generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
    stops = (free[0].token_ids[1], free[2].token_ids[3])  # rows stop early at different steps
    params = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=stops)
    batched = HFBackend(model, pad_token_id=0, seed=0).generate(prompts, params)
    assert len({len(c.token_ids) for c in batched}) > 1
    for prompt, completion in zip(prompts, batched):
        (alone,) = HFBackend(model, pad_token_id=0, seed=0).generate([prompt], params)
        assert completion.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(completion.logprobs), torch.tensor(alone.logprobs), atol=1e-5)


def test_gate_config_refuses_lora_keys_and_unknown_labels(tmp_path):
    with pytest.raises(ValueError, match="trains only the gates"):
        MoEGateConfig(adapters={"a": "x"}, grpo={"lora_r": 8})
    with pytest.raises(ValueError, match="label 'b' is not a slot"):
        MoEGateConfig(adapters={"a": "x"}, sft={"data": [{"path": "p.json", "label": "b"}]})
    path = tmp_path / "c.yaml"
    path.write_text("adapters: {a: x}\nsft: {epochs: 2, learnin_rate: 1}\n")
    with pytest.raises(InputError, match="unknown sft keys"):
        load_gate_config(path)
    config = load_gate_config(Path(REPO / "configs" / "moe_gate.yaml"))
    assert config.slot_names[0] == "base" and len(config.grpo_games) == 4 and config.grpo_config().game == ""


def test_router_sft_cli_writes_a_loadable_gate(tiny_model_dir, tmp_path):
    from benchmarks.results import make_simulation, write_results
    from train.policy import load_base_model
    from train.train_router_sft import main

    def base():
        return load_base_model(str(tiny_model_dir))[0]

    adapter = make_random_adapter(base, tmp_path / "cap", r=2, alpha=4, seed=0, targets=["q_proj", "v_proj"])
    simulations = [make_simulation(task_id=str(i), sample_idx=0, termination_reason="done", reward_info={"reward": r},
                                   messages=[{"role": "user", "content": f"order {i}?"},
                                             {"role": "assistant", "content": "It ships today."}])
                   for i, r in enumerate([1.0, 1.0, 0.0])]
    write_results(tmp_path / "rollouts.json", simulations)
    config = {"model": str(tiny_model_dir), "adapters": {"cap": str(adapter)}, "output_dir": str(tmp_path / "gate"),
              "sft": {"data": [{"path": str(tmp_path / "rollouts.json"), "label": "cap"}], "epochs": 2,
                      "validation_fraction": 0.0}, "report_to": ["tensorboard"]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "c.yaml")]) == 0
    out = tmp_path / "gate"
    metrics = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2]
    # report_to (the config's key): TensorBoard holds sft_metrics.jsonl's numbers, one step per epoch
    assert_same_series(tensorboard_scalars(out / "tb"), expected_series(metrics, ROUTER_NAMES, "epoch"), float32=True)
    assert (out / "moe_gate.yaml").is_file()
    assert json.loads((out / "gate_config.json").read_text())["slots"] == ["base", "cap"]
    build_capability_model(base(), {"cap": adapter}, gate=out)  # loads against the same base and adapter


# ------------------------------------------------------------------------------------------------------
# GRPO over the gates
# ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def letter_game():
    game_registry._import_game_file(GAMES_DIR / f"{GAME}_game.py")
    return game_registry.get_game(GAME)


@pytest.fixture(scope="module")
def tiny_adapters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    from train.policy import load_base_model

    def base():
        return load_base_model(str(tiny_model_dir))[0]

    folder = tmp_path_factory.mktemp("tiny-adapters")
    return {"fast": make_random_adapter(base, folder / "fast", r=4, alpha=8, seed=1, std=0.3,
                                        targets=["q_proj", "v_proj", "down_proj"]),
            "slow": make_random_adapter(base, folder / "slow", r=2, alpha=2, seed=2, std=0.3,
                                        targets=["o_proj", "up_proj"])}


GRPO_SMALL = {"game": GAME, "iterations": 1, "groups_per_iteration": 4, "group_size": 4, "learning_rate": 0.05,
              "max_episode_tokens": 128, "save_every": 1, "hint_fraction": 0.0}


def test_one_grpo_gater_iteration_changes_only_gate_parameters(tiny_model_dir, tiny_adapters, letter_game, tmp_path):
    from train.config import GRPOConfig
    from train.grpo import GRPOTrainer
    from train.policy import load_base_model

    base, tokenizer = load_base_model(str(tiny_model_dir))
    model = build_capability_model(base, tiny_adapters)
    randomise_gate(model, seed=0, std=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    config = GRPOConfig(model=str(tiny_model_dir), output_dir=str(tmp_path / "out"), **GRPO_SMALL)
    torch.manual_seed(0)
    trainer = GRPOTrainer(config, letter_game, GatePolicy(model), tokenizer, HFBackend(model, tokenizer.pad_token_id))
    metrics = trainer.run()
    assert metrics["skipped_update"] == 0.0  # some group had reward variance: there was something to learn
    # on-policy: the update's dense straight-through forward scores tokens as the hard sampling path did
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["clip_fraction"] == 0.0
    after = model.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all(k.startswith("gate.") for k in changed), changed
    assert all(torch.equal(buffers[k], v) for k, v in model.named_buffers())  # adapters untouched
    saved = load_file(str(tmp_path / "out" / "gate.safetensors"))
    assert all(torch.equal(saved[k], model.gate.state_dict()[k]) for k in saved)


def test_grpo_gater_cli_resumes_bitwise(tiny_model_dir, tiny_adapters, letter_game, tmp_path):
    from train.grpo_gater import main

    start = build_capability_model(make_base(tiny_model_dir), tiny_adapters)
    randomise_gate(start, seed=0, std=0.5)
    save_gate(start, tmp_path / "start")

    def config(out: str, iterations: int) -> Path:
        path = tmp_path / f"{out}-{iterations}.yaml"
        path.write_text(yaml.safe_dump({
            "model": str(tiny_model_dir), "adapters": {k: str(v) for k, v in tiny_adapters.items()},
            "output_dir": str(tmp_path / out), "init_gate": str(tmp_path / "start"),
            "grpo": {**GRPO_SMALL, "iterations": iterations, "groups_per_iteration": 2}}))
        return path

    assert main(["--config", str(config("straight", 2))]) == 0
    assert main(["--config", str(config("resumed", 1)), "--report_to", "tensorboard"]) == 0
    assert main(["--config", str(config("resumed", 2)), "--resume", str(tmp_path / "resumed"),
                 "--report_to", "tensorboard"]) == 0
    a = load_file(str(tmp_path / "straight" / "gate.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "gate.safetensors"))
    start_state = load_file(str(tmp_path / "start" / "gate.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed gate differs"
    assert any(not torch.equal(a[k], start_state[k]) for k in a)  # training did move the gate

    def comparable(path: Path) -> list[dict]:
        timing = {"gen_tokens_per_s", "train_tokens_per_s", "seconds"}
        return [{k: v for k, v in json.loads(l).items() if k not in timing} for l in path.read_text().splitlines()]

    assert comparable(tmp_path / "straight" / "metrics.jsonl") == comparable(tmp_path / "resumed" / "metrics.jsonl")
    # --report_to: TensorBoard holds the resumed run's metrics.jsonl, steps 1 and 2 once each, in one run
    assert_same_series(tensorboard_scalars(tmp_path / "resumed" / "tb"),
                       expected_series(rows(tmp_path / "resumed" / "metrics.jsonl"), GRPO_NAMES, "iteration"),
                       float32=True)
    assert json.loads((tmp_path / "resumed" / "tracking.json").read_text())["run_name"].startswith("gate_grpo-resumed-")
    assert (tmp_path / "resumed" / "moe_gate.yaml").is_file()


def make_base(model_dir: Path):
    from train.policy import load_base_model

    return load_base_model(str(model_dir))[0]


def test_grpo_gater_refuses_trajectory_mode(tiny_model_dir, letter_game, tmp_path, capsys):
    """A registered game and an existing model, so the mode refusal is what stops the run (without it the run
    would go on to load the adapter "x" and fail with another message)."""
    from train.grpo_gater import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"adapters": {"a": "x"}, "mode": "trajectory", "model": str(tiny_model_dir),
                                    "output_dir": str(tmp_path / "out"), "grpo": {"game": GAME}}))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "grpo_gater trains token routing only (mode: token), not mode 'trajectory'" in err, err


def test_a_game_mix_cycles_through_its_games_by_seed(tiny_model_dir, tiny_adapters, tmp_path):
    """grpo_gater on a mix: groups alternate between the games, each with its own prompt and turn limit."""

    from train.config import GRPOConfig
    from train.game_mix import mixed_spec
    from train.grpo import GRPOTrainer
    from train.policy import load_base_model

    import toy_games

    short = toy_games.make_spec(name="vault_short", max_turns=1, max_gen_tokens=8, base_prompt="Count carefully.")
    long = toy_games.make_spec(name="vault_long", max_turns=3, max_gen_tokens=8)
    spec = mixed_spec([short, long])
    base, tokenizer = load_base_model(str(tiny_model_dir))
    model = build_capability_model(base, tiny_adapters)
    config = GRPOConfig(model=str(tiny_model_dir), output_dir=str(tmp_path / "out"),
                        **{**GRPO_SMALL, "game": spec.name, "groups_per_iteration": 2, "group_size": 2,
                           "max_episode_tokens": 600})
    GRPOTrainer(config, spec, GatePolicy(model), tokenizer, HFBackend(model, tokenizer.pad_token_id)).run()
    rollouts = json.loads((tmp_path / "out" / "rollouts" / "iter_000001.json").read_text())["simulations"]
    games = {int(s["task_id"]): s["reward_info"]["game"] for s in rollouts}
    assert {seed % 2: name for seed, name in games.items()} == {0: "vault_short", 1: "vault_long"}
    turns = {"vault_short": [], "vault_long": []}
    for sim in rollouts:
        game = sim["reward_info"]["game"]
        assert ("Count carefully." in sim["messages"][0]["content"]) == (game == "vault_short")
        turns[game].append(sum(m["role"] == "assistant" for m in sim["messages"]))
    assert max(turns["vault_short"]) == 1 and max(turns["vault_long"]) > 1, turns  # each game's own limit
    with pytest.raises(ValueError, match="at least two games"):
        mixed_spec([short])


def test_gate_policy_reference_is_the_base_model(adapters):
    model = build_capability_model(make_tiny_base(), adapters).eval()
    randomise_gate(model, seed=2)
    policy = GatePolicy(model)
    ids = torch.tensor([[5, 17, 33, 8, 61, 2]])
    with torch.no_grad():
        routed = model(input_ids=ids).logits
        with policy.reference():
            reference = model(input_ids=ids).logits
        base = make_tiny_base()(input_ids=ids).logits
    assert torch.equal(reference, base) and not torch.allclose(routed, base)
    no_base = GatePolicy(build_capability_model(make_tiny_base(), adapters, include_base_slot=False))
    with pytest.raises(ValueError, match="set kl_beta: 0"):
        with no_base.reference():
            pass
