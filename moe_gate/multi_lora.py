"""A frozen base `nn.Linear` plus N capability LoRAs, mixed per token by a gate.

    y = W x + sum_i g_i * s_i * B_i A_i x            (slot 0, "base", has no LoRA)

The LoRA weights come from PEFT adapter folders (`adapter_config.json` + `adapter_model.safetensors`,
read with peft's own `LoraConfig.from_pretrained` and `load_peft_weights`); adapters may differ in
rank, alpha and target modules, so a slot simply has no LoRA on a module its adapter does not target.

Why not peft: peft mixes adapters by weighted sums over every adapter (`add_weighted_adapter`, X-LoRA),
which is dense and, for a hard top-1 choice, gives the gate no gradient. Here a `Route` (made once per
decoder layer by the model, see `model_builder.py`) says per token which slot to use:

- hard path (inference, or no gradient needed): tokens are grouped by slot and each group runs only its
  own adapter (gather, two small matmuls, scatter-add), so the cost stays near one LoRA's, not N.
- dense path (training with gradients, or soft routing): every adapter runs on every token and is scaled
  by the gate value; with a straight-through gate the values are exactly 0/1 in the forward pass (so the
  output equals the hard path) while the gradient reaches every slot's gate logit.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn


class GateError(ValueError):
    """A bad input to the routed model (adapter folders, gate files, options); the message says the fix."""


# PEFT LoRA features this composition does not implement, with the value that means "off".
_UNSUPPORTED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "lora_bias": False,
    "layer_replication": None,
    "trainable_token_indices": None,
    "modules_to_save": None,
}


@dataclass(frozen=True)
class LoRAWeights:
    """One module's LoRA: delta(x) = scaling * (x @ A.T) @ B.T."""

    A: torch.Tensor  # [r, in]
    B: torch.Tensor  # [out, r]
    scaling: float


@dataclass
class AdapterFile:
    """A PEFT LoRA adapter folder, read into per-module weights (module paths as in the base model)."""

    name: str
    path: Path
    modules: dict[str, LoRAWeights]
    sha256: str  # of adapter_model.safetensors: a gate trained against other weights is refused
    base_model_name_or_path: str | None = None
    target_modules: list[str] = field(default_factory=list)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_peft_adapter(name: str, path: str | Path) -> AdapterFile:
    """Read a PEFT LoRA adapter folder into per-module `LoRAWeights` (fp32, on the CPU)."""
    from peft import LoraConfig, load_peft_weights
    from peft.utils.other import get_pattern_key

    folder = Path(path)
    weights_file = folder / "adapter_model.safetensors"
    if not (folder / "adapter_config.json").is_file() or not weights_file.is_file():
        raise GateError(f"adapter {name!r}: {folder} is not a PEFT adapter folder (needs adapter_config.json and "
                        "adapter_model.safetensors; train one with `python -m train`)")
    config = LoraConfig.from_pretrained(str(folder))
    if str(config.peft_type.value if hasattr(config.peft_type, "value") else config.peft_type) != "LORA":
        raise GateError(f"adapter {name!r} at {folder} is a {config.peft_type} adapter; only LoRA adapters compose")
    for option, off in _UNSUPPORTED.items():
        value = getattr(config, option, off)
        if value not in (off, None, False, [], {}):
            raise GateError(f"adapter {name!r} at {folder} uses {option}={value!r}, which moe_gate does not "
                            f"implement; retrain it without {option}")
    if config.bias != "none":
        raise GateError(f"adapter {name!r} at {folder} trains biases (bias={config.bias!r}); retrain with bias='none'")
    state = load_peft_weights(str(folder), device="cpu")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0].removeprefix("base_model.model.")
                pairs.setdefault(module, {})[part] = tensor
                break
        else:
            raise GateError(f"adapter {name!r} at {folder} holds {key!r}, which is not a LoRA A/B weight; "
                            "only plain LoRA adapters compose")
    modules = {}
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"lora_A", "lora_B"}:
            raise GateError(f"adapter {name!r} at {folder}: module {module} lacks {({'lora_A', 'lora_B'} - set(pair))}")
        a, b = pair["lora_A"].float(), pair["lora_B"].float()  # [r, in], [out, r]
        rank = a.shape[0]
        alpha_key = get_pattern_key(list(config.alpha_pattern or {}), module) if config.alpha_pattern else None
        alpha = config.alpha_pattern[alpha_key] if alpha_key in (config.alpha_pattern or {}) else config.lora_alpha
        scaling = alpha / (math.sqrt(rank) if config.use_rslora else rank)
        modules[module] = LoRAWeights(a, b, float(scaling))
    if not modules:
        raise GateError(f"adapter {name!r} at {folder} holds no LoRA weights")
    targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
    return AdapterFile(name, folder, modules, _file_sha256(weights_file), config.base_model_name_or_path, targets)


@dataclass
class Route:
    """The routing decision a decoder layer's gated modules apply to the current forward pass.

    `weights` [M, S] (M = tokens of the pass, flattened) are used by the dense path; `groups` (slot -> token
    indices [m]) by the grouped hard path; `slots` [M] by the gathered hard path, which fetches each token's
    own A and B from stacked weights and runs one batched matmul pair for all tokens (no host sync, a
    constant number of kernels whatever N is; its gathered weights grow with M, so the model uses it for
    small passes such as decoding steps). Exactly one of them is set.
    """

    weights: torch.Tensor | None = None  # [M, S] gate values (straight-through 0/1, Gumbel one-hot or soft)
    groups: dict[int, torch.Tensor] | None = None  # slot -> [m] flat token indices routed to it
    slots: torch.Tensor | None = None  # [M] slot per token, for the gathered path (few tokens: decoding)


class LayerRoute:
    """Holder shared by the gated modules of one decoder layer; the model writes `current` before the layer runs."""

    def __init__(self, layer: int):
        self.layer = layer
        self.current: Route | None = None


class MultiLoRAGatedLinear(nn.Module):
    """`base(x) + sum_i g_i s_i B_i A_i x` over the slots that have a LoRA on this module (base frozen)."""

    def __init__(self, base: nn.Linear, slot_weights: list[LoRAWeights | None], route: LayerRoute):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise GateError(f"can only gate nn.Linear modules, got {type(base).__name__}")
        self.base = base
        self.route = route
        self.n_slots = len(slot_weights)
        self.slots: list[int] = []  # slots with a LoRA here
        self.scalings: list[float] = []
        param = base.weight
        max_rank = max((lora.A.shape[0] for lora in slot_weights if lora is not None), default=0)
        # One stacked copy for the gathered path: slot s holds [A_s | s_s * B_s^T], zero-padded to the largest
        # rank (a slot without a LoRA here is all zeros), so one gather fetches both factors of a token's LoRA.
        stack = torch.zeros(self.n_slots, max_rank, base.in_features + base.out_features)  # [S, R, in + out]
        for slot, lora in enumerate(slot_weights):
            if lora is None:
                continue
            if lora.A.shape[1] != base.in_features or lora.B.shape[0] != base.out_features:
                raise GateError(f"LoRA for slot {slot} has shapes A{tuple(lora.A.shape)} B{tuple(lora.B.shape)}, "
                                f"which do not fit Linear({base.in_features}, {base.out_features}): the adapter "
                                "was trained on another base model")
            self.register_buffer(f"lora_A_{slot}", lora.A.to(param.device, param.dtype), persistent=False)
            self.register_buffer(f"lora_B_{slot}", lora.B.to(param.device, param.dtype), persistent=False)
            self.slots.append(slot)
            self.scalings.append(lora.scaling)
            rank = lora.A.shape[0]
            stack[slot, :rank, : base.in_features] = lora.A
            stack[slot, :rank, base.in_features :] = lora.B.T * lora.scaling
        self.register_buffer("lora_stack", stack.to(param.device, param.dtype), persistent=False)

    def extra_repr(self) -> str:
        return f"in={self.base.in_features}, out={self.base.out_features}, lora_slots={self.slots}/{self.n_slots}"

    def _delta(self, slot: int, scaling: float, x: torch.Tensor) -> torch.Tensor:
        a = getattr(self, f"lora_A_{slot}")  # [r, in]
        b = getattr(self, f"lora_B_{slot}")  # [out, r]
        return (x @ a.T) @ b.T * scaling  # [m, out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in]
        y = self.base(x)  # [..., out]
        route = self.route.current
        if route is None:
            raise RuntimeError(f"layer {self.route.layer}: no routing decision was made before this module ran; "
                               "call the model built by build_capability_model, not its inner modules")
        if not self.slots:
            return y
        flat_x = x.reshape(-1, x.shape[-1])  # [M, in]
        flat_y = y.reshape(-1, y.shape[-1])  # [M, out]
        if route.weights is not None:  # dense: every adapter on every token, scaled by its gate value
            for slot, scaling in zip(self.slots, self.scalings):
                flat_y = flat_y + route.weights[:, slot : slot + 1].to(flat_y.dtype) * self._delta(slot, scaling, flat_x)
            return flat_y.view(y.shape)
        if route.slots is not None:  # gathered: each token's own adapter, two batched matmuls
            factors = self.lora_stack.index_select(0, route.slots)  # [M, R, in + out]
            a = factors[:, :, : flat_x.shape[-1]]  # [M, R, in]
            scaled_b = factors[:, :, flat_x.shape[-1] :].transpose(1, 2)  # [M, out, R]
            low = torch.bmm(a, flat_x.unsqueeze(-1))  # [M, R, 1]
            return torch.baddbmm(flat_y.unsqueeze(-1), scaled_b, low).view(y.shape)  # y + s B A x
        groups = route.groups or {}
        for slot, scaling in zip(self.slots, self.scalings):
            index = groups.get(slot)
            if index is None:
                continue
            flat_y = flat_y.index_add(0, index, self._delta(slot, scaling, flat_x.index_select(0, index)))
        return flat_y.view(y.shape)
