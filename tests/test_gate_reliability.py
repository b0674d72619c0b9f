"""moe_gate reliability (audit findings): a routed model is built in eval mode and a Gumbel gate never samples
without gradients; a saved gate refuses an adapter whose adapter_config.json changes its scaling; the serving
front checks the whole embedding matrix of its base model, not a patch of it.

Tiny and fast: the smoke test's 32-wide Qwen3 base and its two random adapters."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from moe_gate import GateError, build_capability_model, save_gate, select
from moe_gate.model_builder import GATE_CONFIG
from moe_gate.serve import GlobalRouterFront
from moe_gate.smoke_test import make_adapters, make_tiny_base, randomise_gate, save_tiny_base

IDS = torch.tensor([[5, 17, 33, 8, 61, 2, 44, 9, 70, 12]])


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    return make_adapters(tmp_path_factory.mktemp("adapters"), make_tiny_base)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """make_tiny_base() saved with a word-level tokenizer: a base model folder the serving front can read."""
    return save_tiny_base(tmp_path_factory.mktemp("base") / "model")


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


# 1: eval mode, no sampling without gradients -------------------------------------------------------------------
def test_a_model_built_from_a_gumbel_gate_is_in_eval_mode_and_routes_top1(adapters, tmp_path):
    trained = build_capability_model(make_tiny_base(), adapters, estimator="gumbel")
    assert not trained.training and not trained.base.training and not any(g.training for g in trained.gate)
    randomise_gate(trained, 2, std=0.5)
    reference = _logits(trained)
    save_gate(trained, tmp_path / "gate")
    loaded = build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "gate")
    assert not loaded.training and not any(g.training for g in loaded.gate)
    assert {g.estimator for g in loaded.gate} == {"gumbel"}
    for seed in range(4):
        torch.manual_seed(seed)
        assert torch.equal(_logits(loaded), reference)


def test_a_gumbel_gate_in_train_mode_samples_only_with_gradients(adapters):
    model = build_capability_model(make_tiny_base(), adapters, estimator="gumbel")
    randomise_gate(model, 2, std=0.5)
    reference = _logits(model)  # eval mode: top-1
    model.train()
    for seed in range(4):  # train mode under no_grad: still top-1, whatever the seed
        torch.manual_seed(seed)
        assert torch.equal(_logits(model), reference)
    flat = torch.zeros(64, 3)
    with torch.no_grad():
        chosen = select(flat, training=True, estimator="gumbel")
    assert chosen.weights is None and torch.equal(chosen.slots, torch.zeros(64, dtype=torch.long))
    torch.manual_seed(0)
    sampled = select(flat.requires_grad_(), training=True, estimator="gumbel")  # training with gradients: samples
    assert sampled.weights is not None and len(set(sampled.slots.tolist())) > 1


# 2: adapter_config.json is part of what a gate checks ------------------------------------------------------------
def _edit_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_a_saved_gate_refuses_an_adapter_whose_config_changes_its_scaling(adapters, tmp_path):
    mine = {name: shutil.copytree(folder, tmp_path / name) for name, folder in adapters.items()}
    save_gate(build_capability_model(make_tiny_base(), mine), tmp_path / "gate")
    _edit_config(mine["alpha"], base_model_name_or_path="elsewhere", inference_mode=False)  # computes the same
    build_capability_model(make_tiny_base(), mine, gate=tmp_path / "gate")
    for change in ({"lora_alpha": 64}, {"use_rslora": True}, {"alpha_pattern": {"down_proj": 1}}):
        original = (mine["alpha"] / "adapter_config.json").read_text()
        _edit_config(mine["alpha"], **change)
        base = make_tiny_base()
        with pytest.raises(GateError, match="adapter 'alpha' .* another LoRA scaling"):
            build_capability_model(base, mine, gate=tmp_path / "gate")
        assert not any(type(m).__name__ == "MultiLoRAGatedLinear" for m in base.modules())  # refused before the swap
        (mine["alpha"] / "adapter_config.json").write_text(original)
    build_capability_model(make_tiny_base(), mine, gate=tmp_path / "gate")


def test_a_gate_saved_before_the_scaling_hash_still_loads(adapters, tmp_path):
    save_gate(build_capability_model(make_tiny_base(), adapters), tmp_path / "gate")
    config = json.loads((tmp_path / "gate" / GATE_CONFIG).read_text())
    assert all("scaling_sha256" in entry for entry in config["adapters"])
    for entry in config["adapters"]:
        del entry["scaling_sha256"]
    (tmp_path / "gate" / GATE_CONFIG).write_text(json.dumps(config))
    build_capability_model(make_tiny_base(), adapters, gate=tmp_path / "gate")  # checked on the weights, as before


# 3: the serving front checks the whole embedding -----------------------------------------------------------------
def _global_gate(directory: Path, adapters, base: torch.nn.Module) -> Path:
    model = build_capability_model(base, adapters, mode="global")
    randomise_gate(model, 0, std=30.0)
    return save_gate(model, directory)


def _other_base(model_dir: Path, directory: Path, first_changed_row: int) -> Path:
    """A copy of the base whose embedding rows from `first_changed_row` on are redrawn."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, directory)
    state = load_file(str(directory / "model.safetensors"))
    key = next(k for k in state if k.endswith("embed_tokens.weight"))
    state[key] = state[key].clone()
    generator = torch.Generator().manual_seed(1)
    state[key][first_changed_row:] = torch.randn(state[key][first_changed_row:].shape, generator=generator)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_the_serving_front_refuses_a_base_whose_embedding_differs_outside_the_probe(model_dir, adapters, tmp_path):
    from transformers import AutoModelForCausalLM

    gate = _global_gate(tmp_path / "gate", adapters, AutoModelForCausalLM.from_pretrained(model_dir))
    assert "embedding_sha256" in json.loads((gate / GATE_CONFIG).read_text())["base_model"]
    GlobalRouterFront(gate)  # the recorded base
    other = _other_base(model_dir, tmp_path / "other", first_changed_row=4)  # rows 0-3 (the probe) unchanged
    with pytest.raises(GateError, match="not the base model the gate was trained on"):
        GlobalRouterFront(gate, base_model=str(other))
    # a gate saved from a bfloat16 load of the same checkpoint matches the front's float32 read of it
    bf16 = _global_gate(tmp_path / "bf16", adapters, AutoModelForCausalLM.from_pretrained(model_dir,
                                                                                          dtype=torch.bfloat16))
    GlobalRouterFront(bf16, base_model=str(model_dir))


def test_a_gate_saved_before_the_embedding_hash_is_checked_on_its_probe(model_dir, adapters, tmp_path):
    from transformers import AutoModelForCausalLM

    gate = _global_gate(tmp_path / "gate", adapters, AutoModelForCausalLM.from_pretrained(model_dir))
    config = json.loads((gate / GATE_CONFIG).read_text())
    del config["base_model"]["embedding_sha256"]
    (gate / GATE_CONFIG).write_text(json.dumps(config))
    GlobalRouterFront(gate)
    with pytest.raises(GateError, match="not the base model the gate was trained on"):
        GlobalRouterFront(gate, base_model=str(_other_base(model_dir, tmp_path / "other", first_changed_row=0)))
