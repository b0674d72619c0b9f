"""A frozen base `nn.Linear` plus N capability LoRAs, mixed per token by a gate.

    y = W x + sum_i g_i * s_i * B_i A_i x            (slot 0, "base", has no LoRA)

The LoRA weights come from PEFT adapter folders (`adapter_config.json` + `adapter_model.safetensors`,
read with peft's own `LoraConfig.from_pretrained` and `load_peft_weights`); adapters may differ in
rank, alpha and target modules, so a slot simply has no LoRA on a module its adapter does not target.

Why not peft: peft mixes adapters by weighted sums over every adapter (`add_weighted_adapter`, X-LoRA),
which is dense and, for a hard top-1 choice, gives the gate no gradient. Here a `Route` (made once per
decoder layer by the model, see `model_builder.py`) says per token which slot to use:

- grouped hard path (inference on large passes: prompts, scoring): tokens are grouped by slot and each
  group runs only its own adapter (gather, two small matmuls, scatter-add), so the cost stays near one
  LoRA's, not N.
- masked hard path (inference on small passes: decoding steps): one matmul of the tokens with every
  adapter's A concatenated, the rank columns of the other slots selected away, one addmm with the
  concatenated s * B^T. Why: a decoding step has a handful of tokens, so its cost is the number of kernels
  and the bytes of weights read, not FLOPs; the masked path runs 4 kernels whatever N is (grouping runs ~4
  per slot present, plus a sort and a host sync per layer). Its price is every adapter's low-rank product
  for every token: M * sum_r * (in + out) multiply-adds for M tokens (sum_r = the ranks of this module's
  adapters added up), against M * r * (in + out) for the token's own adapter, and reading all N adapters'
  factors where grouping reads only the slots present. So the choice is made per module and per pass
  from that count: the masked path while M * sum_r * (in + out) <= `Route.masked_max_macs` (the model's
  `masked_max_macs`, default `MASKED_MAX_MACS` in model_builder.py), the grouped path above it. With the
  default (2^21), a 4096-wide square layer takes the masked path for up to 16 tokens at 2 adapters of rank
  8, 2 tokens at 2 of rank 64 and never at 8 of rank 64, where the extra products are 25% of the base
  layer's own (N r (in + out) / (in out)); the CPU demo's 192-wide model (2 adapters of rank 8) for up to
  ~170 tokens, so its decoding steps stay masked and its prompts are grouped. Measured per shape with
  bench/gate_overhead.py (`--shapes`, `--path`; figures in moe_gate/README.md). Columns of the other slots
  are selected away (torch.where, not x0), and a module with a non-finite adapter weight takes the grouped
  path, so an unchosen adapter cannot turn a token's output into NaN.
- dense path (training with gradients, or soft routing): every adapter runs on every token and is scaled
  by the gate value; with a straight-through gate the values are exactly 0/1 in the forward pass (so the
  output equals the hard path) while the gradient reaches every slot's gate logit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.validation import InputError


class GateError(InputError):
    """A bad input to the routed model (adapter folders, gate files, options); the message says the fix. An
    InputError, so a command refuses it as any bad input: `error: ...`, exit 2."""


# LoraConfig fields this composition reads, or that do not change what a saved plain LoRA computes (metadata,
# module selection, training-time dropout and initialisation, placement). Any other field away from LoraConfig's
# default is a variant moe_gate does not implement -- DoRA, aLoRA (acts from its invocation tokens on), QALoRA,
# Arrow, KaSA, LoRA on parameters, trained biases or whole modules, and the options later PEFT versions add -- so
# such an adapter is refused rather than composed as if it were plain LoRA.
_PLAIN_LORA_FIELDS = {
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
    "inference_mode", "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules",
    "exclude_modules", "layers_to_transform", "layers_pattern", "lora_dropout", "bias", "init_lora_weights",
    "loftq_config", "eva_config", "corda_config", "lora_ga_config", "qalora_group_size", "runtime_config",
    "megatron_core", "ensure_weight_tying",
}
# Initialisations whose adapter applies to the unchanged base. PiSSA, OLoRA, CorDA, LoftQ and LoRA-GA rewrite the
# base weights the adapter was trained on, unless the adapter was saved with PEFT's
# path_initial_model_for_weight_conversion (which records init_lora_weights: true); MiCA is a variant.
_INITS_ON_THE_BASE = (True, False, "gaussian", "eva", "orthogonal")


def _check_plain_lora(name: str, folder: Path, config: Any) -> None:
    """GateError unless `config` (a LoraConfig) describes a plain LoRA on the unchanged base."""
    from peft import LoraConfig

    default = LoraConfig()
    for option in dataclasses.fields(LoraConfig):
        value = getattr(config, option.name, None)
        if option.name not in _PLAIN_LORA_FIELDS and value != getattr(default, option.name) \
                and value not in (None, False, [], {}):
            raise GateError(f"adapter {name!r} at {folder} uses {option.name}={value!r}, which moe_gate does not "
                            f"implement (it composes plain LoRA); retrain it without {option.name}")
    if config.bias != "none":
        raise GateError(f"adapter {name!r} at {folder} trains biases (bias={config.bias!r}); retrain with bias='none'")
    if config.init_lora_weights not in _INITS_ON_THE_BASE:
        raise GateError(f"adapter {name!r} at {folder} was initialised with init_lora_weights="
                        f"{config.init_lora_weights!r}, which changes the base weights it was trained on; save it "
                        "with PEFT's path_initial_model_for_weight_conversion (a plain LoRA of the unchanged base), "
                        "or retrain it with the default initialisation")


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

    @property
    def scaling_sha256(self) -> str:
        """sha256 of what adapter_config.json decides of the forward: each module's rank and resolved scaling
        (lora_alpha, alpha_pattern, use_rslora), in module order. With `sha256` (the weights) it fixes what the
        adapter computes; a gate trained against another scaling is refused, while edits that change nothing
        computed (metadata, inference_mode) are not."""
        digest = hashlib.sha256()
        for module, lora in sorted(self.modules.items()):
            digest.update(f"{module}:{lora.A.shape[0]}:{float(lora.scaling).hex()};".encode())
        return digest.hexdigest()


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
    _check_plain_lora(name, folder, config)
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

    Either `weights` [M, S] (M = tokens of the pass, flattened), used by the dense path, or a hard top-1
    choice: `slots` [M] (one slot per token) or `groups` (slot -> token indices [m]). With `slots`, each
    module takes the masked path when its extra multiply-adds, M * sum_r * (in + out), are at most
    `masked_max_macs`, and the grouped path otherwise (groups made from `slots` once per layer, on the first
    module that needs them); see the module docstring.
    """

    weights: torch.Tensor | None = None  # [M, S] gate values (straight-through 0/1, Gumbel one-hot or soft)
    groups: dict[int, torch.Tensor] | None = None  # slot -> [m] flat token indices routed to it
    slots: torch.Tensor | None = None  # [M] slot per token
    masked_max_macs: float = math.inf  # a hand-made Route(slots=...) always takes the masked path

    def slot_groups(self) -> dict[int, torch.Tensor]:
        """slot -> [m] flat token indices routed to it, from `slots` (computed once, shared by the layer's modules)."""
        if self.groups is None:
            if self.slots is None:
                raise RuntimeError("a dense Route (weights) has no groups")
            order = torch.argsort(self.slots, stable=True)  # [M] token indices grouped by slot
            counts = torch.bincount(self.slots).tolist()  # one host sync per layer
            self.groups = {slot: part for slot, part in enumerate(torch.split(order, counts)) if counts[slot]}
        return self.groups


class LayerRoute:
    """Holder shared by the gated modules of one decoder layer; the model writes `current` before the layer runs."""

    def __init__(self, layer: int):
        self.layer = layer
        self.current: Route | None = None


class MultiLoRAGatedLinear(nn.Module):
    """`base(x) + sum_i g_i s_i B_i A_i x` over the slots that have a LoRA on this module (base frozen).

    The LoRAs of this module are kept concatenated: `cat_a` [sum r, in] stacks every slot's A, `cat_b`
    [sum r, out] its s * B^T, and `col_mask` [S, sum r] (bool) marks which rank columns belong to which slot.
    """

    def __init__(self, base: nn.Linear, slot_weights: list[LoRAWeights | None], route: LayerRoute):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise GateError(f"can only gate nn.Linear modules, got {type(base).__name__}")
        self.base = base
        self.route = route
        self.n_slots = len(slot_weights)
        self.slots: list[int] = []  # slots with a LoRA here
        self.spans: list[tuple[int, int]] = []  # their rank columns [start, end) in cat_a / cat_b
        a_parts, b_parts = [], []
        for slot, lora in enumerate(slot_weights):
            if lora is None:
                continue
            if lora.A.shape[1] != base.in_features or lora.B.shape[0] != base.out_features:
                raise GateError(f"LoRA for slot {slot} has shapes A{tuple(lora.A.shape)} B{tuple(lora.B.shape)}, "
                                f"which do not fit Linear({base.in_features}, {base.out_features}): the adapter "
                                "was trained on another base model")
            start = sum(part.shape[0] for part in a_parts)
            self.slots.append(slot)
            self.spans.append((start, start + lora.A.shape[0]))
            a_parts.append(lora.A)  # [r, in]
            b_parts.append(lora.B.T * lora.scaling)  # [r, out]
        param = base.weight
        cat_a = torch.cat(a_parts) if a_parts else torch.zeros(0, base.in_features)  # [sum r, in]
        cat_b = torch.cat(b_parts) if b_parts else torch.zeros(0, base.out_features)  # [sum r, out]
        col_mask = torch.zeros(self.n_slots, cat_a.shape[0], dtype=torch.bool)  # [S, sum r]
        for slot, (start, end) in zip(self.slots, self.spans):
            col_mask[slot, start:end] = True
        self.register_buffer("cat_a", cat_a.to(param.device, param.dtype), persistent=False)
        self.register_buffer("cat_b", cat_b.to(param.device, param.dtype), persistent=False)
        self.register_buffer("col_mask", col_mask.to(param.device), persistent=False)
        # The masked path reads every slot's B: a non-finite B (or A) of an unchosen slot would reach the output
        # as 0 * inf = NaN, so a module holding one takes the grouped path instead (checked once: frozen weights).
        self.finite = bool(torch.isfinite(self.cat_a).all() and torch.isfinite(self.cat_b).all())
        # Multiply-adds per token of every adapter's low-rank product here: what the masked path pays.
        self.masked_macs_per_token = cat_a.shape[0] * (base.in_features + base.out_features)

    def extra_repr(self) -> str:
        return f"in={self.base.in_features}, out={self.base.out_features}, lora_slots={self.slots}/{self.n_slots}"

    def _delta(self, span: tuple[int, int], x: torch.Tensor) -> torch.Tensor:
        start, end = span
        return (x @ self.cat_a[start:end].T) @ self.cat_b[start:end]  # [m, out]

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
            for slot, span in zip(self.slots, self.spans):
                flat_y = flat_y + route.weights[:, slot : slot + 1].to(flat_y.dtype) * self._delta(span, flat_x)
            return flat_y.view(y.shape)
        masked = route.slots is not None and self.finite and (
            flat_x.shape[0] * self.masked_macs_per_token <= route.masked_max_macs)
        if masked:  # all adapters' factors, other slots' columns selected away
            keep = self.col_mask.index_select(0, route.slots)  # [M, sum r] the token's own slot's columns
            low = torch.where(keep, flat_x @ self.cat_a.T, 0.0)  # [M, sum r]; select, not x0: an overflow stays out
            return torch.addmm(flat_y, low, self.cat_b).view(y.shape)  # y + s B A x of each token's slot
        groups = route.slot_groups()  # grouped: each token's own adapter only (also where one is non-finite)
        for slot, span in zip(self.slots, self.spans):
            index = groups.get(slot)
            if index is None:
                continue
            flat_y = flat_y.index_add(0, index, self._delta(span, flat_x.index_select(0, index)))
        return flat_y.view(y.shape)
