"""moe_gate: the routed model (multi-LoRA gated linears, gates, builder, save/load, routing hooks)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_gate import GateError, build_capability_model, gate_parameter_count, load_balance_loss, save_gate
from moe_gate.model_builder import GATE_CONFIG, gate_state
from moe_gate.multi_lora import LayerRoute, LoRAWeights, MultiLoRAGatedLinear, Route
from moe_gate.smoke_test import make_adapters, make_random_adapter, make_tiny_base, randomise_gate, set_one_hot_gate

REPO = Path(__file__).resolve().parent.parent
IDS = torch.tensor([[5, 17, 33, 8, 61, 2, 44, 9, 70, 12], [3, 3, 90, 41, 7, 25, 66, 18, 5, 1]])  # [B, T]
MASK = torch.tensor([[1] * 10, [0, 0, 0] + [1] * 7])  # [B, T], row 1 left-padded


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)


def _logits(model, ids=IDS, mask=MASK) -> torch.Tensor:
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits  # [B, T, V]


def test_smoke_test_cli_exits_0_when_every_check_holds(capsys):
    from moe_gate.smoke_test import main

    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("PASS") for line in lines) == 8 and lines[-1].endswith("8 passed, 0 failed")


def test_smoke_test_exits_1_when_a_check_fails(monkeypatch, capsys):
    import moe_gate.smoke_test as smoke

    monkeypatch.setattr(smoke, "TOLERANCE", -1.0)  # no difference can pass: the equality checks must fail
    assert smoke.main([]) == 1
    assert "FAIL  one-hot gate on slot 1" in capsys.readouterr().out


@pytest.mark.parametrize("slot", [0, 1, 2])
def test_one_hot_gate_on_a_slot_equals_that_single_adapter_peft_model(adapters, slot):
    from peft import PeftModel

    model = build_capability_model(make_tiny_base(), adapters).eval()
    set_one_hot_gate(model, slot)
    name = model.slot_names[slot]
    reference = make_tiny_base() if name == "base" else PeftModel.from_pretrained(make_tiny_base(), str(adapters[name]))
    with torch.no_grad():
        assert torch.allclose(_logits(model), _logits(reference.eval()), atol=1e-5, rtol=0)
        if name != "base":  # the comparison means something: the adapter does move the logits
            assert (_logits(reference) - _logits(make_tiny_base())).abs().max() > 1e-2


def test_gated_linear_hard_path_equals_dense_path_masked_to_the_chosen_slot():
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 10)
    loras = [None] + [LoRAWeights(torch.randn(r, 12), torch.randn(10, r), s) for r, s in ((2, 0.5), (4, 2.0), (3, 1.0))]
    route = LayerRoute(0)
    module = MultiLoRAGatedLinear(base, loras, route)
    x = torch.randn(3, 7, 12)  # [B, T, in]
    slots = torch.randint(0, 4, (21,))  # [M]
    groups = {s: (slots == s).nonzero().squeeze(1) for s in range(4) if (slots == s).any()}
    route.current = Route(groups=groups)
    hard = module(x)
    route.current = Route(weights=torch.nn.functional.one_hot(slots, 4).float())
    dense = module(x)
    route.current = Route(slots=slots)
    masked = module(x)
    soft = torch.softmax(torch.randn(21, 4), -1)  # [M, S]: a soft mixture of every slot
    route.current = Route(weights=soft)
    mixed = module(x).reshape(-1, 10)
    # the masked dense sum written out by hand
    flat = x.reshape(-1, 12)
    expected = base(flat).clone()
    for m in range(21):
        lora = loras[int(slots[m])]
        if lora is not None:
            expected[m] += lora.scaling * (lora.B @ (lora.A @ flat[m]))
    assert torch.allclose(hard.reshape(-1, 10), expected, atol=1e-5)
    assert torch.allclose(dense.reshape(-1, 10), expected, atol=1e-5)
    assert torch.allclose(masked.reshape(-1, 10), expected, atol=1e-5)
    flat_base = base(x.reshape(-1, 12))
    mixture = flat_base + sum(soft[:, s : s + 1] * lora.scaling * (x.reshape(-1, 12) @ lora.A.T @ lora.B.T)
                              for s, lora in enumerate(loras) if lora is not None)
    assert torch.allclose(mixed, mixture, atol=1e-5)
    assert len(groups) > 2  # several slots were really exercised


def test_each_module_takes_the_masked_path_exactly_while_its_extra_multiply_adds_fit_the_budget():
    """Masked while M x sum_r x (in + out) <= masked_max_macs, grouped above (the grouped path leaves its groups on
    the Route, the masked path never makes them); both give each token its own slot's LoRA."""
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 10)
    loras = [None] + [LoRAWeights(torch.randn(r, 12), torch.randn(10, r), 1.5) for r in (2, 4, 3)]
    route = LayerRoute(0)
    module = MultiLoRAGatedLinear(base, loras, route)
    assert module.masked_macs_per_token == (2 + 4 + 3) * (12 + 10)
    x = torch.randn(3, 7, 12)  # [B, T, in]: M = 21
    slots = torch.randint(0, 4, (21,))  # [M]
    flat = x.reshape(-1, 12)
    expected = base(flat) + torch.stack([loras[s].scaling * loras[s].B @ loras[s].A @ flat[m] if loras[s] else
                                         torch.zeros(10) for m, s in enumerate(slots.tolist())])
    cost = 21 * module.masked_macs_per_token
    for budget, grouped in ((cost, False), (cost - 1, True), (0, True), (math.inf, False)):
        route.current = Route(slots=slots, masked_max_macs=budget)
        with torch.no_grad():
            out = module(x).reshape(-1, 10)
        assert (route.current.groups is not None) == grouped, budget
        assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("factor, bad", [("A", float("inf")), ("B", float("inf")), ("B", float("nan"))])
def test_a_non_finite_adapter_that_no_token_chose_leaves_the_output_finite(factor, bad):
    """The masked and grouped hard paths compute only what each token's own slot gives: an inf/NaN weight in
    an adapter no token is routed to must not reach the output (0 * inf would be NaN)."""
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 10)
    good = LoRAWeights(torch.randn(2, 12), torch.randn(10, 2), 0.5)
    broken = LoRAWeights(torch.randn(3, 12), torch.randn(10, 3), 2.0)
    getattr(broken, factor)[0, 1] = bad
    route = LayerRoute(0)
    module = MultiLoRAGatedLinear(base, [None, good, broken], route)
    x = torch.randn(2, 5, 12)  # [B, T, in]
    slots = torch.tensor([1, 0] * 5)  # [M]: slots 0 and 1 only, never the broken slot 2
    flat = x.reshape(-1, 12)  # [M, in]
    expected = base(flat) + (slots == 1)[:, None] * good.scaling * (flat @ good.A.T @ good.B.T)  # [M, out]
    groups = {s: (slots == s).nonzero().squeeze(1) for s in (0, 1)}
    for decision in (Route(slots=slots), Route(groups=groups)):
        route.current = decision
        with torch.no_grad():
            out = module(x).reshape(-1, 10)  # [M, out]
        assert torch.isfinite(out).all()
        assert torch.allclose(out, expected, atol=1e-5)
    route.current = Route(slots=torch.full((10,), 2))  # the check is not vacuous: the broken slot is broken
    with torch.no_grad():
        assert not torch.isfinite(module(x)).all()


# grouped path everywhere, masked path everywhere, and a budget that splits the modules (20 tokens x rank x
# (in + out): 5,120 for q/v_proj, 7,680 for down_proj, 10,240 to 15,360 for beta's modules): both paths in one pass
@pytest.mark.parametrize("masked_max_macs", [0, math.inf, 7_680])
def test_routed_model_hard_top1_equals_the_training_straight_through_dense_path(adapters, masked_max_macs):
    model = build_capability_model(make_tiny_base(), adapters)
    model.masked_max_macs = masked_max_macs
    randomise_gate(model, seed=11)
    with torch.no_grad(), model.record_routing() as record:
        hard = _logits(model.eval())
    assert len({int(s) for slots in record.slots().values() for s in slots.flatten()}) == 3  # all slots used
    dense = _logits(model.train())  # gate values carry gradients: every adapter computed, masked by 0/1
    assert dense.requires_grad
    assert torch.allclose(hard, dense.detach(), atol=1e-5)


def test_zero_initialised_gate_is_uniform_and_routes_to_base(adapters):
    model = build_capability_model(make_tiny_base(), adapters).eval()
    with torch.no_grad(), model.record_routing(keep_logits=True) as record:
        routed = _logits(model)
        plain = _logits(make_tiny_base())
    for event in record.events:
        probs = torch.softmax(event.logits, -1)
        assert torch.allclose(probs, torch.full_like(probs, 1 / 3))
        assert int(event.slots.max()) == 0  # ties go to slot 0: a fresh gate is the base model
    assert torch.equal(routed, plain)


@pytest.mark.parametrize("mode, soft", [("token", False), ("trajectory", False), ("global", False), ("global", True)])
def test_kv_cache_generation_equals_no_cache_generation(adapters, mode, soft):
    """Trajectory/global: without a cache every pass re-pools, and only the prompt window keeps the decision
    of the prefill; with one gate seed the grown pool often picks the same slot anyway, so many seeds are
    checked (with the window off, 3 to 6 of these 20 generate differently per mode)."""
    model = build_capability_model(make_tiny_base(), adapters, mode=mode, soft=soft).eval()
    kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    prompt, mask = IDS, MASK
    differ = []
    for seed in range(1 if mode == "token" else 20):
        randomise_gate(model, seed=3 + seed)
        cached = model.generate(prompt, attention_mask=mask, use_cache=True, **kwargs)
        uncached = model.generate(prompt, attention_mask=mask, use_cache=False, **kwargs)
        if not torch.equal(cached, uncached):
            differ.append(3 + seed)
    assert not differ, f"gate seeds where cached and uncached generation differ: {differ}"


@pytest.mark.parametrize("mode", ["trajectory", "global"])
def test_trajectory_routing_keeps_one_slot_per_layer_for_the_whole_generation(adapters, mode):
    model = build_capability_model(make_tiny_base(), adapters, mode=mode).eval()
    randomise_gate(model, seed=7, std=3.0)
    with model.record_routing() as record:
        out = model.generate(IDS, attention_mask=MASK, max_new_tokens=8, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    per_layer = record.slots()
    assert len(per_layer) == 2
    for slots in per_layer.values():
        assert slots.shape == (2, out.shape[1] - 1)  # prefill + 7 decode passes (the last token is not fed back)
        for row in slots:
            assert len(set(row.tolist())) == 1
    if mode == "global":
        assert torch.equal(per_layer[0], per_layer[1])
    # token routing on the same gate does change slot within a sequence (so the check above is not vacuous)
    token_model = build_capability_model(make_tiny_base(), adapters, mode="token").eval()
    randomise_gate(token_model, seed=7, std=3.0)
    with torch.no_grad(), token_model.record_routing() as record:
        _logits(token_model)
    assert any(len(set(row.tolist())) > 1 for slots in record.slots().values() for row in slots)


def test_only_gate_parameters_are_trainable_and_get_gradients(adapters):
    model = build_capability_model(make_tiny_base(), adapters).train()
    randomise_gate(model, seed=4, std=0.5)
    _logits(model).pow(2).mean().backward()
    gate = {id(p) for p in model.gate_parameters()}
    assert {id(p) for p in model.parameters() if p.requires_grad} == gate
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.gate_parameters())
    assert all(p.grad is None for p in model.parameters() if id(p) not in gate)


def test_gate_reads_its_input_detached(adapters):
    """Gradients through the gate do not flow into earlier layers' activations (the backbone is never pushed)."""
    model = build_capability_model(make_tiny_base(), adapters).train()
    embeds = model.get_base_model().get_input_embeddings()(IDS).detach().requires_grad_(True)
    with model.record_routing(keep_logits=True) as record:
        model(inputs_embeds=embeds, attention_mask=MASK)
    record.events[0].logits.sum().backward()
    assert embeds.grad is None


def test_save_load_round_trips_and_refuses_other_adapters_or_base(adapters, tmp_path):
    model = build_capability_model(make_tiny_base(), adapters).eval()
    randomise_gate(model, seed=5)
    save_gate(model, tmp_path / "gate")
    config = json.loads((tmp_path / "gate" / GATE_CONFIG).read_text())
    assert config["slots"] == ["base", "alpha", "beta"] and [a["name"] for a in config["adapters"]] == ["alpha", "beta"]
    loaded = build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "gate").eval()
    a, b = gate_state(model), gate_state(loaded)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        assert torch.equal(_logits(model), _logits(loaded))

    swapped = {"beta": adapters["beta"], "alpha": adapters["alpha"]}
    with pytest.raises(GateError, match="same adapters in the same order"):
        build_capability_model(make_tiny_base(), swapped, gate=tmp_path / "gate")
    retrained = make_random_adapter(make_tiny_base, tmp_path / "alpha2", r=4, alpha=8, seed=99,
                                    targets=["q_proj", "v_proj", "down_proj"])
    with pytest.raises(GateError, match="not the one the gate was trained with"):
        build_capability_model(make_tiny_base(), {"alpha": retrained, "beta": adapters["beta"]}, gate=tmp_path / "gate")
    with pytest.raises(GateError, match="base model's weights differ"):
        build_capability_model(make_tiny_base(seed=1), adapters, gate=tmp_path / "gate")
    with pytest.raises(GateError, match="mode 'token', not 'global'"):
        build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "gate", mode="global")


def _scaled_decoder(base):
    with torch.no_grad():
        for name, parameter in base.named_parameters():
            if ".layers." in name:
                parameter.mul_(1.5)
    return base


def _merged_lora(path):
    from peft import PeftModel

    return PeftModel.from_pretrained(make_tiny_base(), str(path)).merge_and_unload()


def test_the_base_identity_covers_every_weight(adapters, tmp_path):
    """A base whose decoder weights were scaled, or with a LoRA merged in, has the embedding and the numbers
    of the original, so only the hash of every weight tells them apart; the dtype it is loaded in does not."""
    save_gate(build_capability_model(make_tiny_base(), adapters), tmp_path / "gate")
    for other in (_scaled_decoder(make_tiny_base()), _merged_lora(adapters["alpha"])):
        assert torch.equal(other.get_input_embeddings().weight, make_tiny_base().get_input_embeddings().weight)
        with pytest.raises(GateError, match="base model's weights differ .* hash of its weights differs"):
            build_capability_model(other, adapters, gate=tmp_path / "gate")
    build_capability_model(make_tiny_base().to(torch.bfloat16), adapters, gate=tmp_path / "gate")  # same base
    # a gate saved before the hash: the embedding probe still refuses another base, a warning names the fix
    path = tmp_path / "gate" / GATE_CONFIG
    config = json.loads(path.read_text())
    del config["base_model"]["weights_sha256"]
    path.write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="save the gate again"):
        build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "gate")
    with pytest.raises(GateError, match="base model's weights differ"):
        build_capability_model(make_tiny_base(seed=1), adapters, gate=tmp_path / "gate")


def test_parameter_count_formula():
    assert gate_parameter_count(48, 2048, 5) == 491_760  # the reference: 48 layers x 2049 x 5 slots
    assert gate_parameter_count(48, 2048, 5, mode="global") == 2049 * 5


@pytest.mark.parametrize("mode", ["token", "trajectory", "global"])
def test_gate_parameter_count_matches_the_model(adapters, mode):
    model = build_capability_model(make_tiny_base(), adapters, mode=mode)
    actual = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert actual == gate_parameter_count(2, 32, 3, mode=mode)


def test_load_balance_loss_is_one_when_uniform_and_slots_when_collapsed():
    uniform = torch.eye(4).repeat(8, 1) * 5.0  # [32, 4]: each slot top-1 for a quarter of the tokens
    assert float(load_balance_loss(torch.zeros(32, 4))) == pytest.approx(1.0)
    assert float(load_balance_loss(uniform)) == pytest.approx(1.0, abs=1e-6)
    collapsed = torch.tensor([[30.0, 0, 0, 0]]).repeat(32, 1)
    assert float(load_balance_loss(collapsed)) == pytest.approx(4.0, rel=1e-4)


def test_bad_inputs_raise_gate_errors_that_name_the_fix(adapters, tmp_path):
    with pytest.raises(GateError, match="mode must be one of"):
        build_capability_model(make_tiny_base(), adapters, mode="layer")
    with pytest.raises(GateError, match="not a PEFT adapter folder"):
        build_capability_model(make_tiny_base(), {"x": tmp_path})
    head = make_random_adapter(make_tiny_base, tmp_path / "head", r=2, alpha=2, seed=1, targets=["q_proj", "lm_head"])
    with pytest.raises(GateError, match="not lm_head"):
        build_capability_model(make_tiny_base(), {"head": head})
    with pytest.raises(GateError, match="unique and not 'base'"):
        build_capability_model(make_tiny_base(), {"base": adapters["alpha"]})
    with pytest.raises(GateError, match="not a gate folder"):
        build_capability_model(make_tiny_base(), adapters, gate=tmp_path)


def test_moe_gate_imports_neither_train_nor_the_games():
    code = ("import sys, moe_gate, moe_gate.smoke_test, moe_gate.model_builder; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('train', 'game_registry', 'games', 'benchmarks')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_trajectory_pools_over_the_prompt_window_only(adapters):
    """An uncached pass over prompt + continuation routes as the prompt alone does when the window is set
    (generate sets it), so scoring a whole sequence routes it as it was generated."""
    model = build_capability_model(make_tiny_base(), adapters, mode="trajectory").eval()

    def slots(ids, mask, window=None):
        with torch.no_grad(), model.prompt_window(window), model.record_routing() as record:
            _logits(model, ids, mask)
        return {layer: s[:, 0].tolist() for layer, s in record.slots().items()}

    for seed in range(50):  # a gate for which the continuation would change the decision
        randomise_gate(model, seed=seed, std=3.0)
        if slots(IDS, MASK) != slots(IDS[:, :5], MASK[:, :5]):
            break
    else:
        pytest.fail("no gate seed where the continuation changes the trajectory decision")
    assert slots(IDS, MASK, window=5) == slots(IDS[:, :5], MASK[:, :5])
