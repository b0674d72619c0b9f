"""Step 4: capability LoRA adapters composed by learned top-1 gates (see moe_gate/README.md).

This package knows nothing about how the gates are trained or on what: it imports neither `train` nor
the games.
"""
from moe_gate.gater import LayerCapabilityGater, TrajectoryGlobalRouter, load_balance_loss, select
from moe_gate.model_builder import (
    CapabilityModel,
    RoutingEvent,
    build_capability_model,
    gate_parameter_count,
    load_capability_model,
    load_gate,
    save_gate,
)
from moe_gate.multi_lora import GateError, MultiLoRAGatedLinear, read_peft_adapter

__all__ = [
    "CapabilityModel", "GateError", "LayerCapabilityGater", "MultiLoRAGatedLinear", "RoutingEvent",
    "TrajectoryGlobalRouter", "build_capability_model", "gate_parameter_count", "load_balance_loss",
    "load_capability_model", "load_gate", "read_peft_adapter", "save_gate", "select",
]
