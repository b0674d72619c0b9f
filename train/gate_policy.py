"""`GatePolicy`: Step 4's policy for the GRPO loop: the routed model of `moe_gate`, gates trainable.

The GRPO update (train/grpo.py) sees only `policy.model` and `policy.trainable_parameters()`, so it trains
the gates exactly as it trains a LoRA adapter. The reference policy (KL term) is the base model: every
token routed to slot 0. Checkpoints hold the gate (gate.safetensors + gate_config.json) where a LoRA
policy writes its adapter.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from moe_gate.model_builder import BASE_SLOT, CapabilityModel, gate_state, save_gate
from train.policy import Policy


class GatePolicy(Policy):
    def __init__(self, model: CapabilityModel, training_info: dict | None = None):
        self.model = model
        self.training_info = training_info or {}

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.model.gate_parameters()

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        if BASE_SLOT not in self.model.slot_names:
            raise ValueError("the KL reference of a gate policy is the base model, but this routed model has no "
                             "base slot (include_base_slot: false); set kl_beta: 0")
        with self.model.force_slot(BASE_SLOT):
            yield

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return gate_state(self.model)

    def write_adapter(self, directory: str | Path, state: dict[str, torch.Tensor]) -> None:
        save_gate(self.model, directory, state, extra=self.training_info)
