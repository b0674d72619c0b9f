"""Trajectory/global routing is decided once per episode, from the conversation's first prompt (TRACE: "determined
once from the initial task prompt and held fixed throughout the interaction"), on every path that runs a turn:
the hf: agent (KV-cached generate), uncached generate, full-sequence scoring, the in-process rollout backend,
train.evaluate and moe_gate.serve. Each test runs many random gates over a three-turn episode with tool calls
and tool results appended between turns, and checks it is not vacuous: pooling over the whole conversation, as
before, changes the decision between turns for some of the same gates. Token routing is unchanged, bit for bit.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train.agents import HFAgent, VLLMAgent, render_prompt
from moe_gate import build_capability_model, save_gate
from moe_gate.model_builder import (CapabilityModel, assistant_header_ids, assistant_header_text, first_prompt_ends,
                                    first_prompt_text)
from moe_gate.serve import GlobalRouterFront
from moe_gate.smoke_test import make_random_adapter, randomise_gate
from train.backends import HFBackend, SamplingParams
from train.logprobs import token_logprobs
from train.policy import load_base_model

from test_gate_serving import FakeMultiLoRAServer, _serve

GATE_SEEDS = range(30)
TOOLS = [{"type": "function", "function": {"name": "find_order", "description": "Look up an order.",
                                           "parameters": {"type": "object", "properties": {}}}}]
OPENING = [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "Where is my order?"}]
CALL = {"type": "function", "function": {"name": "find_order", "arguments": {}}}
EPISODE = [  # the messages each turn sees: the opening, then a tool call and its result appended per turn
    OPENING,
    OPENING + [{"role": "assistant", "content": "", "tool_calls": [CALL]},
               {"role": "tool", "content": "Order 17 shipped on Monday, arriving Friday by courier."}],
    OPENING + [{"role": "assistant", "content": "", "tool_calls": [CALL]},
               {"role": "tool", "content": "Order 17 shipped on Monday, arriving Friday by courier."},
               {"role": "assistant", "content": "Let me check the address.", "tool_calls": [CALL]},
               {"role": "tool", "content": "Delivery address: 4 Harbour Street, Berlin; signature required."}],
]
OTHER_OPENINGS = [  # more episodes for the batched paths, each with its own first prompt
    [{"role": "system", "content": "You help customers."}, {"role": "user", "content": "I want a refund for the mug."}],
    [{"role": "user", "content": "Cancel my order now please, it is late again."}],
]


@pytest.fixture(scope="module")
def tiny_adapters(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    def base():
        return load_base_model(str(tiny_model_dir))[0]

    folder = tmp_path_factory.mktemp("episode-adapters")
    return {"orders": make_random_adapter(base, folder / "orders", r=4, alpha=8, seed=1, std=0.3,
                                          targets=["q_proj", "v_proj", "down_proj"]),
            "refunds": make_random_adapter(base, folder / "refunds", r=2, alpha=2, seed=2, std=0.3,
                                           targets=["o_proj", "up_proj"])}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_base_model(str(tiny_model_dir))[1]


def _routed(tiny_model_dir, adapters, mode: str, tokenizer) -> CapabilityModel:
    model = build_capability_model(load_base_model(str(tiny_model_dir))[0], adapters, mode=mode).eval()
    model.set_assistant_header(assistant_header_ids(tokenizer))
    return model


def _random_gate(model: CapabilityModel, seed: int) -> None:
    """Random gate weights without bias: the decision then depends on the pooled prompt, not on a fixed slot."""
    randomise_gate(model, seed=seed)
    with torch.no_grad():
        for gate in [model.gate] if model.mode == "global" else model.gate:
            gate.proj.bias.zero_()


def _prefill_decisions(record) -> list[tuple[int, ...]]:
    """Per row, the slot of every layer on the record's first pass (trajectory/global: one slot per row)."""
    first: dict[int, torch.Tensor] = {}
    for event in record.events:
        first.setdefault(event.layer, event.slots)  # [B, T]
    rows = first[0].shape[0]
    return [tuple(int(first[layer][row, -1]) for layer in sorted(first)) for row in range(rows)]


def _ids(tokenizer, messages) -> list[int]:
    """A turn's prompt as the trainer's episodes hold it: the first prompt encoded on its own, then the rest."""
    text = render_prompt(tokenizer, messages, TOOLS)
    first = first_prompt_text(text, assistant_header_text(tokenizer))
    pieces = [piece for piece in (first, text[len(first):]) if piece]
    return [i for piece in pieces for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]


def _whole_conversation_changes(model: CapabilityModel, tokenizer) -> int:
    """Gate seeds under which pooling over the whole conversation (no header: the behaviour before) changes the
    decision between turns; the checks are vacuous unless some do."""
    header, changed = model.assistant_header, 0
    model.set_assistant_header(())
    try:
        for seed in GATE_SEEDS:
            _random_gate(model, seed)
            turns = []
            for messages in EPISODE:
                with torch.no_grad(), model.record_routing() as record:
                    model(input_ids=torch.tensor([_ids(tokenizer, messages)]))
                turns.append(_prefill_decisions(record)[0])
            changed += len(set(turns)) > 1
    finally:
        model.set_assistant_header(header)
    return changed


def test_the_first_prompt_ends_after_the_first_assistant_header(tokenizer):
    header = assistant_header_ids(tokenizer)
    assert assistant_header_text(tokenizer) == "<|im_start|>assistant\n" and len(header) == 3
    turn1, turn3 = _ids(tokenizer, EPISODE[0]), _ids(tokenizer, EPISODE[2])
    assert turn3[: len(turn1)] == turn1 and turn1[-3:] == header
    pad = [0] * (len(turn3) - len(turn1))
    ids = torch.tensor([turn3, pad + turn1, turn3[:5] + [0] * (len(turn3) - 5)])  # [3, T]
    mask = torch.tensor([[1] * len(turn3), [0] * len(pad) + [1] * len(turn1), [1] * 5 + [0] * (len(turn3) - 5)])
    ends = first_prompt_ends(ids, mask, torch.tensor(header))
    assert ends.tolist() == [len(turn1), len(turn3), len(turn3)]  # left padding counted; no header: the whole row
    text = render_prompt(tokenizer, EPISODE[2], TOOLS)
    assert first_prompt_text(text, assistant_header_text(tokenizer)) == render_prompt(tokenizer, EPISODE[0], TOOLS)
    assert first_prompt_text("no chat here", "<|im_start|>assistant\n") == "no chat here"


@pytest.mark.parametrize("mode", ["trajectory", pytest.param("global", marks=pytest.mark.slow)])  # global: serve
def test_the_hf_agent_routes_every_turn_as_its_first(tiny_model_dir, tiny_adapters, tmp_path, mode):
    """The hf: agent on a gate folder: the slot of every layer, on every turn's prefill, is turn 1's; uncached
    generation and scoring the whole episode (train.logprobs) route it the same way."""
    save_gate(build_capability_model(load_base_model(str(tiny_model_dir))[0], tiny_adapters, mode=mode), tmp_path / "g")
    agent = HFAgent(tmp_path / "g", max_new_tokens=2)
    model, tokenizer = agent.model, agent.tokenizer
    assert model.assistant_header == tuple(assistant_header_ids(tokenizer))
    changed = {}
    for seed in GATE_SEEDS:
        _random_gate(model, seed)
        turns = []
        for messages in EPISODE:
            with model.record_routing() as record:
                agent.respond(messages, TOOLS)
            turns.append(_prefill_decisions(record)[0])
        ids = torch.tensor([agent.prompt_ids(render_prompt(tokenizer, EPISODE[-1], TOOLS))])  # [1, T]
        with torch.no_grad(), model.record_routing() as uncached:
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                           use_cache=False, pad_token_id=0, eos_token_id=None)
        with torch.no_grad(), model.record_routing() as scored:
            token_logprobs(model, ids, torch.ones_like(ids))
        others = [_prefill_decisions(uncached)[0], _prefill_decisions(scored)[0]]
        others += [tuple(int(s[0, -1]) for _, s in sorted(uncached.slots().items()))]  # its last uncached pass
        if set(turns + others) != {turns[0]}:
            changed[seed] = turns + others
    assert not changed, f"gate seeds whose decision changed within the episode: {changed}"
    assert _whole_conversation_changes(model, tokenizer) >= 3


@pytest.mark.parametrize("mode", ["trajectory", pytest.param("global", marks=pytest.mark.slow)])  # global: serve
def test_the_rollout_backend_routes_every_turn_as_its_first(tiny_model_dir, tiny_adapters, tokenizer, mode):
    """The in-process backend (train.evaluate, rollouts) prefills each turn's whole conversation in a left-padded
    batch of episodes at different turns: every row routes as its episode's first turn did."""
    model = _routed(tiny_model_dir, tiny_adapters, mode, tokenizer)
    episodes = [[_ids(tokenizer, messages) for messages in EPISODE]]
    episodes += [[_ids(tokenizer, opening + later[len(OPENING):]) for later in EPISODE] for opening in OTHER_OPENINGS]
    params = SamplingParams(max_new_tokens=2, temperature=0.0)
    changed = {}
    for seed in GATE_SEEDS:
        _random_gate(model, seed)
        backend = HFBackend(model, pad_token_id=0, seed=0)
        with model.record_routing() as record:
            backend.generate([turns[0] for turns in episodes], params)
        first = _prefill_decisions(record)
        for shift in (1, 2):  # episode e at turn (e + shift) % 3: lengths differ, rows are left-padded
            prompts = [turns[(e + shift) % 3] for e, turns in enumerate(episodes)]
            with model.record_routing() as record:
                backend.generate(prompts, params)
            if _prefill_decisions(record) != first:
                changed.setdefault(seed, []).append((shift, first, _prefill_decisions(record)))
    assert not changed, f"gate seeds whose decision changed within an episode: {changed}"
    assert _whole_conversation_changes(model, tokenizer) >= 3


@pytest.mark.slow  # ~3 s: a whole train.evaluate run; the agent and backend tests above check the routing
def test_train_evaluate_routes_every_turn_of_an_episode_as_its_first(tiny_model_dir, tiny_adapters, monkeypatch):
    """train.evaluate on a three-turn toy game, two sampled episodes per task: every turn the backend plays, each
    row routes as its episode's first prompt did (evaluate_model gives the model the tokenizer's header)."""
    import train.evaluate as evaluate
    from toy_games import make_spec, register_temporarily

    spec = make_spec(name="toy_vault_three_turns", max_turns=3, max_gen_tokens=4)
    register_temporarily(monkeypatch, spec)
    base, tokenizer = load_base_model(str(tiny_model_dir))
    model = build_capability_model(base, tiny_adapters, mode="trajectory").eval()  # no header yet
    header = torch.tensor(assistant_header_ids(tokenizer))
    seen: dict[tuple[int, ...], list[tuple[int, ...]]] = {}  # first prompt -> the decision of each row it began

    class RecordingBackend(HFBackend):
        def generate(self, prompts, params):
            with model.record_routing() as record:
                completions = super().generate(prompts, params)
            for prompt, decision in zip(prompts, _prefill_decisions(record)):
                ids = torch.tensor([prompt])
                first = tuple(prompt[: int(first_prompt_ends(ids, torch.ones_like(ids), header)[0])])
                seen.setdefault(first, []).append(decision)
            return completions

    def seeds_that_change_within_an_episode() -> list[int]:
        changed = []
        for seed in range(12):
            _random_gate(model, seed)
            seen.clear()
            evaluate.evaluate_model(model, tokenizer, spec.name, n_tasks=3, seed=1000, samples=2, temperature=1.0,
                                    max_episode_tokens=1024)
            assert len(seen) == 3 and all(len(rows) == 6 for rows in seen.values())  # 2 samples x 3 turns per task
            if any(len(set(rows)) > 1 for rows in seen.values()):
                changed.append(seed)
        return changed

    monkeypatch.setattr(evaluate, "HFBackend", RecordingBackend)
    assert seeds_that_change_within_an_episode() == []
    assert model.assistant_header == tuple(header.tolist())
    model.set_assistant_header(())  # not vacuous: without the header (and evaluate not setting it) some gates do
    monkeypatch.setattr(evaluate, "route_once_per_episode", lambda model, tokenizer: None)
    assert seeds_that_change_within_an_episode()


def _front_matching(model: CapabilityModel, front: GlobalRouterFront, seed: int) -> None:
    _random_gate(model, seed)
    front.router.load_state_dict(model.gate.state_dict())


def test_serve_routes_every_turn_of_a_conversation_as_its_first(tiny_model_dir, tiny_adapters, tokenizer, tmp_path):
    """moe_gate.serve keys the slot on the conversation's first prompt: chat and completion requests of turns
    1-3 get turn 1's slot, which is the in-process model's; through HTTP, a multi-turn client hits one adapter."""
    model = _routed(tiny_model_dir, tiny_adapters, "global", tokenizer)
    save_gate(model, tmp_path / "gate")
    front = GlobalRouterFront(tmp_path / "gate", base_served_name="tiny-base")
    changed, whole_changed = {}, []
    for seed in GATE_SEEDS:
        _front_matching(model, front, seed)
        with torch.no_grad(), model.record_routing() as record:
            model(input_ids=torch.tensor([_ids(tokenizer, EPISODE[0])]))
        in_process = model.slot_names[_prefill_decisions(record)[0][0]]
        slots = []
        for messages in EPISODE:
            slots.append(front.slot_for_request("/v1/chat/completions", {"messages": messages, "tools": TOOLS}))
            slots.append(front.slot_for_request("/v1/completions",
                                                {"prompt": render_prompt(tokenizer, messages, TOOLS)}))
        if set(slots) != {in_process}:
            changed[seed] = (in_process, slots)
        whole = {front.slot_for_ids(tokenizer(render_prompt(tokenizer, messages, TOOLS),
                                              add_special_tokens=False)["input_ids"]) for messages in EPISODE}
        if len(whole) > 1:
            whole_changed.append(seed)
    assert not changed, f"gate seeds whose slot changed within the conversation: {changed}"
    assert len(whole_changed) >= 3, "routing the whole conversation should change the slot for some gates"

    _front_matching(model, front, whole_changed[0])  # a gate under which the old routing switched adapters
    with FakeMultiLoRAServer() as upstream:
        server, url = _serve(front, upstream.url)
        try:
            agent = VLLMAgent(url, None, tiny_model_dir, timeout_s=30.0)
            answers = {agent.respond(messages, TOOLS) for messages in EPISODE}
        finally:
            server.shutdown()
            server.server_close()
    assert len(answers) == 1 and len(upstream.requests) == len(EPISODE)


def test_token_routing_is_unchanged_bit_for_bit(tiny_model_dir, tiny_adapters, tokenizer, tmp_path):
    """Token mode ignores the header: generation, scoring and the hf: agent's prompt are what they were."""
    with_header, plain = (_routed(tiny_model_dir, tiny_adapters, "token", tokenizer) for _ in range(2))
    plain.set_assistant_header(())
    ids = torch.tensor([_ids(tokenizer, EPISODE[2]), [0] * 9 + _ids(tokenizer, EPISODE[2])[9:]])  # [2, T]
    mask = torch.tensor([[1] * ids.shape[1], [0] * 9 + [1] * (ids.shape[1] - 9)])
    for seed in range(3):
        for model in (with_header, plain):
            randomise_gate(model, seed=seed)
        outputs = []
        for model in (with_header, plain):
            with torch.no_grad():
                outputs.append((model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                               pad_token_id=0, eos_token_id=None),
                                token_logprobs(model, ids, mask)))
        assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])
    save_gate(with_header, tmp_path / "gate")
    agent = HFAgent(tmp_path / "gate", max_new_tokens=4)
    text = render_prompt(tokenizer, EPISODE[2], TOOLS)
    assert agent.prompt_ids(text) == tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("mode", ["trajectory", "global"])
def test_without_a_header_a_caller_gives_the_first_prompt_length(tiny_model_dir, tiny_adapters, tokenizer, mode):
    """A model without the tokenizer's header pools over the whole input; `prompt_window(n)` around `generate`
    holds the window to the first n columns, so a later turn routes as its first n tokens (turn 1) alone."""
    model = _routed(tiny_model_dir, tiny_adapters, mode, tokenizer)
    model.set_assistant_header(())
    turn1, turn3 = _ids(tokenizer, EPISODE[0]), _ids(tokenizer, EPISODE[2])

    def decision(ids: list[int], window: int | None = None) -> tuple[int, ...]:
        with torch.no_grad(), model.prompt_window(window), model.record_routing() as record:
            model.generate(torch.tensor([ids]), max_new_tokens=1, do_sample=False, pad_token_id=0, eos_token_id=None)
        return _prefill_decisions(record)[0]

    differ = 0
    for seed in range(10):
        _random_gate(model, seed)
        assert decision(turn3, window=len(turn1)) == decision(turn1)
        differ += decision(turn3) != decision(turn1)
    assert differ  # the window is what keeps the decision


def test_the_assistant_header_must_be_token_ids(tiny_model_dir, tiny_adapters, tokenizer):
    from moe_gate import GateError

    model = _routed(tiny_model_dir, tiny_adapters, "trajectory", tokenizer)
    for bad in (["<|im_start|>"], [1, -2], [True]):
        with pytest.raises(GateError, match="must be token ids"):
            model.set_assistant_header(bad)
    assert model.assistant_header == tuple(assistant_header_ids(tokenizer))
