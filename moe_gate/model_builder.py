"""`build_capability_model`: a frozen base causal LM + N capability LoRAs + learned gates.

The base model is changed in place: every Linear that some adapter targets inside a decoder layer becomes
a `MultiLoRAGatedLinear`, and forward pre-hooks make the routing decision once per decoder layer (from
the layer's input hidden state) before its modules run. The result is still the Hugging Face model
underneath, so `generate` (KV cache included), `train.logprobs.token_logprobs` and the in-process
rollout backend all work unchanged; `CapabilityModel` only adds the gates and the routing bookkeeping.

Modes:
- `token`: a `LayerCapabilityGater` per layer routes every token.
- `trajectory`: a gate per layer routes the whole sequence from its mean hidden state over the conversation's
  first prompt; decided on the first (prefill) pass and kept while the KV cache grows.
- `global`: one `TrajectoryGlobalRouter` for all layers, from the first prompt's mean input embedding.

Trajectory and global routing are decided once per episode (TRACE: "determined once from the initial task
prompt and held fixed throughout the interaction"). The key is the conversation's *first prompt*: its tokens
up to and including its first assistant header (the chat template's generation prompt, e.g.
`<|im_start|>assistant\n`), the window router SFT trains on (`LabeledSequence.prompt_only`: the tokens before
the first assistant token). Every pass that starts a sequence (empty KV cache) finds that window in each row's
own tokens (`first_prompt_ends`), so turn k of an episode, whose tokens start with turn 1's prompt, routes as
turn 1 did, whether it is generated with or without a KV cache or scored whole (`train.logprobs`). The model
learns the header from the tokenizer (`set_assistant_header(assistant_header_ids(tokenizer))`;
`load_capability_model` does it); without one, or in a row where it does not occur, the window is the whole
pass. `prompt_window(n)` bounds the window by hand (its first n columns) and `generate` bounds it by its
input, so an uncached generation keeps the prefill's decision whatever the prompt.

Only gate parameters are trainable. `save_gate` writes `gate.safetensors` + `gate_config.json` (slot order,
adapter names, absolute paths and weight hashes, the base model's path (absolute for a local folder), its
architecture and a hash of all its weights); `load_gate` refuses a gate whose adapters or base model do not
match, and `build_capability_model` checks what it can before changing the base, and restores the base when
loading the gate fails. A gate folder names everything needed
to rebuild the routed model, so `load_capability_model(folder)` is the whole loader.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from common.io import publish_staged, staging_folder, tensor_bytes
from common.run_folder import follow_umask
from moe_gate.gater import LayerCapabilityGater, Selection, TrajectoryGlobalRouter
from moe_gate.multi_lora import AdapterFile, GateError, LayerRoute, MultiLoRAGatedLinear, Route, read_peft_adapter

MODES = ("token", "trajectory", "global")
GATE_WEIGHTS = "gate.safetensors"
GATE_CONFIG = "gate_config.json"
GATE_FORMAT = "trace-moe-gate/1"
# A gated module takes the masked hard path while its extra low-rank multiply-adds for the pass, tokens x sum of
# its adapters' ranks x (in + out), stay at or under this; the grouped path above it (multi_lora.py says why).
MASKED_MAX_MACS = 2**21
BASE_SLOT = "base"


def assistant_header_text(tokenizer: Any) -> str:
    """The text the tokenizer's chat template appends for `add_generation_prompt` (e.g. `<|im_start|>assistant\n`):
    what opens an assistant turn, so a conversation's first prompt ends with its first occurrence. "" when the
    tokenizer has no chat template, or the template appends nothing (or rewrites the turn before it)."""
    from jinja2 import TemplateError

    if not getattr(tokenizer, "chat_template", None):
        return ""
    probe = [{"role": "user", "content": "x"}]
    try:
        without = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
        with_header = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    except (TemplateError, TypeError, ValueError, KeyError):  # a template that cannot render a lone user turn
        return ""
    if not isinstance(with_header, str) or not with_header.startswith(without):
        return ""
    return with_header[len(without) :]


def assistant_header_ids(tokenizer: Any) -> list[int]:
    """`assistant_header_text` as token ids (what `CapabilityModel.set_assistant_header` takes); [] without one."""
    text = assistant_header_text(tokenizer)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def first_prompt_text(text: str, header_text: str) -> str:
    """A rendered conversation's first prompt: `text` up to and including the first `header_text` (the whole
    text when the header does not occur or is ""). Turn k's prompt starts with turn 1's, so every turn gives
    the same first prompt."""
    at = text.find(header_text) if header_text else -1
    return text if at < 0 else text[: at + len(header_text)]


def first_prompt_ends(input_ids: torch.Tensor, attention_mask: torch.Tensor, header: torch.Tensor) -> torch.Tensor:
    """Per row, the column just after the first occurrence of `header` [L] among real tokens (mask 1): where
    the conversation's first prompt ends. Rows without it end at T. input_ids, attention_mask [B, T] -> [B]."""
    batch, length = input_ids.shape
    width = header.shape[0]
    if width == 0 or width > length:
        return torch.full((batch,), length, dtype=torch.long, device=input_ids.device)  # [B]
    windows = input_ids.unfold(1, width, 1)  # [B, T - L + 1, L]
    real = attention_mask.unfold(1, width, 1).bool().all(-1)  # [B, T - L + 1]
    hits = (windows == header).all(-1) & real  # [B, T - L + 1]
    first = hits.int().argmax(-1)  # [B]: the first hit (0 where there is none)
    return torch.where(hits.any(-1), first + width, torch.full_like(first, length))  # [B]


def gate_parameter_count(num_layers: int, hidden_size: int, n_slots: int, mode: str = "token") -> int:
    """Trainable parameters of the gates: layers x (hidden + 1) x slots (one router for `global`)."""
    return (1 if mode == "global" else num_layers) * (hidden_size + 1) * n_slots


@dataclass
class RoutingEvent:
    """What one decoder layer decided in one forward pass (passed to routing hooks)."""

    layer: int
    slots: torch.Tensor  # [B, T] chosen slot per token of this pass
    logits: torch.Tensor | None  # [B, T, S] (token) or [B, S] (trajectory/global, on the pass that decided)


class RoutingRecord:
    """Events collected by `CapabilityModel.record_routing()`; slots are kept on the CPU, logits as computed."""

    def __init__(self, keep_logits: bool):
        self.keep_logits = keep_logits
        self.events: list[RoutingEvent] = []

    def __call__(self, event: RoutingEvent) -> None:
        logits = event.logits if self.keep_logits else None
        self.events.append(RoutingEvent(event.layer, event.slots.detach().cpu(), logits))

    def slots(self) -> dict[int, torch.Tensor]:
        """Per layer, the chosen slot of every token seen, passes concatenated along time: {layer: [B, T_total]}.
        Needs every pass to have the same rows (one conversation, or a batch run to the end); a sampler that packs
        or drops rows between passes (train.backends.HFBackend) is read with `all_slots()` instead."""
        per_layer: dict[int, list[torch.Tensor]] = {}
        for event in self.events:
            per_layer.setdefault(event.layer, []).append(event.slots)
        if any(len({part.shape[0] for part in parts}) > 1 for parts in per_layer.values()):
            raise ValueError("the recorded passes have different numbers of rows (packed or dropped by the sampler): "
                             "they cannot be laid out per row; use all_slots() for the chosen slots of all tokens")
        return {layer: torch.cat(parts, dim=1) for layer, parts in per_layer.items()}

    def all_slots(self) -> torch.Tensor:
        """The chosen slot of every token of every pass and layer, flattened: [N]."""
        return torch.cat([event.slots.flatten() for event in self.events]) if self.events else torch.zeros(0, dtype=torch.long)


def _decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    layers = [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise GateError(f"found no *DecoderLayer modules in {type(model).__name__}; moe_gate needs a decoder-only "
                        "transformers model (Qwen, Llama, ...)")
    return layers


def base_weights_sha256(base: nn.Module) -> str:
    """sha256 over every tensor of the base model's state dict, in name order (name, shape, values).

    Floating-point tensors are hashed as bfloat16, so the same checkpoint loaded in float32 or bfloat16 hashes
    alike (a bf16 checkpoint read as fp32 rounds back exactly; an fp32 one rounds as a bf16 load does); a
    change below bf16 precision goes unseen, any larger one in any weight changes the hash. Modules wrapped by
    `MultiLoRAGatedLinear` hash under their original names (without the inserted `.base`).
    """
    wrapped = {name for name, module in base.named_modules() if isinstance(module, MultiLoRAGatedLinear)}
    digest = hashlib.sha256()
    for key, tensor in sorted(_original_names(base.state_dict(), wrapped).items()):
        value = tensor.detach()
        if value.is_floating_point():
            value = value.to(torch.bfloat16).view(torch.int16)  # numpy has no bfloat16: hash its bits
        digest.update(f"{key}:{tuple(value.shape)};".encode())
        digest.update(value.contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def embedding_sha256(embedding: torch.Tensor) -> str:
    """sha256 of an input embedding matrix [V, H] (shape and values), hashed as bfloat16 like
    `base_weights_sha256`, so the serving front (moe_gate/serve.py, which reads only this matrix from the base's
    safetensors) can check that it has the gate's base whatever dtype either side loaded."""
    value = embedding.detach().to(torch.bfloat16).view(torch.int16)  # numpy has no bfloat16: hash its bits
    digest = hashlib.sha256(f"{tuple(value.shape)};".encode())
    digest.update(value.contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _original_names(state: Mapping[str, torch.Tensor], wrapped: set[str]) -> dict[str, torch.Tensor]:
    """`layer.q_proj.base.weight` -> `layer.q_proj.weight` for the wrapped module paths in `wrapped`."""
    renamed = {}
    for key, tensor in state.items():
        prefix, _, leaf = key.rpartition(".")
        if prefix.endswith(".base") and prefix[: -len(".base")] in wrapped:
            key = f"{prefix[: -len('.base')]}.{leaf}"
        renamed[key] = tensor
    return renamed


def recorded_name_or_path(base: nn.Module) -> str:
    """The base model's `name_or_path` as a gate records it: a local folder as an absolute path, so that
    `load_capability_model(gate)`, moe_gate.serve and `--agent hf:GATE_DIR` find it from any working directory;
    anything else (a hub name such as `Qwen/Qwen3-0.6B`, or "") as given."""
    name = str(getattr(base.config, "_name_or_path", "") or "")
    if name and Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    return name


ARCHITECTURE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def _base_identity(base: nn.Module, weights_sha256: str, name_or_path: str, embedding_hash: str) -> dict[str, Any]:
    """What a gate must match: architecture numbers and the hash of every weight (`base_weights_sha256`).
    The embedding's hash (`embedding_sha256`) is for the serving router (moe_gate/serve.py), which loads the
    embedding only; the probe (a 4 x 8 patch of it) is what a gate saved before that hash is checked on."""
    config = base.config
    probe = base.get_input_embeddings().weight[:4, :8].detach().float().cpu()
    return {
        "name_or_path": name_or_path,
        "model_type": config.model_type,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "vocab_size": config.vocab_size,
        "weights_sha256": weights_sha256,
        "embedding_sha256": embedding_hash,
        "embedding_probe": probe.tolist(),
    }


def check_adapter_names(names: Sequence[str]) -> None:
    """Adapter (slot) names must be unique and never "base": that name means the base model to the serving front
    (moe_gate/serve.py sends slot "base" to the base model) and to the KL reference (train/gate_policy.py), with
    or without a base slot, so an adapter under it would be taken for the base."""
    names = list(names)
    if len(set(names)) != len(names) or BASE_SLOT in names:
        raise GateError(f"adapter names must be unique and not {BASE_SLOT!r} (the name of the base model, reserved "
                        f"even with include_base_slot false); got {names}: rename the adapter")


class CapabilityModel(nn.Module):
    """The routed model. Call it like the base causal LM; `generate` delegates to the base model's."""

    def __init__(self, base: nn.Module, adapters: list[AdapterFile], *, mode: str = "token",
                 include_base_slot: bool = True, estimator: str = "straight_through", tau: float = 1.0,
                 soft: bool = False):
        super().__init__()
        if mode not in MODES:
            raise GateError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if not adapters:
            raise GateError("build_capability_model needs at least one adapter: {name: peft_adapter_dir}")
        names = [a.name for a in adapters]
        check_adapter_names(names)
        if soft and mode != "global":
            raise GateError("soft routing is only for mode='global' (layer gates are top-1)")
        if any(isinstance(module, MultiLoRAGatedLinear) for module in base.modules()):
            raise GateError("this base model is already routed (an earlier build_capability_model wrapped its Linears "
                            "in place); load a fresh base model for each routed model")
        self.mode, self.include_base_slot, self.soft = mode, include_base_slot, soft
        self.adapters = adapters
        self.slot_names = ([BASE_SLOT] if include_base_slot else []) + names
        first = 1 if include_base_slot else 0
        hidden = base.config.hidden_size
        n_slots = len(self.slot_names)

        # Everything that can refuse the inputs runs before the base is touched: the gates (options, slot count),
        # where each LoRA goes, and the gated modules (shapes); only then are the Linears swapped in place.
        layers = _decoder_layers(base)
        if mode == "global":
            gate: nn.Module = TrajectoryGlobalRouter(hidden, n_slots, soft=soft, estimator=estimator, tau=tau)
        else:
            gate = nn.ModuleList(LayerCapabilityGater(hidden, n_slots, granularity=mode, estimator=estimator, tau=tau)
                                 for _ in layers)
        self.routes = [LayerRoute(index) for index in range(len(layers))]
        wanted = {module for adapter in adapters for module in adapter.modules}
        swaps: list[tuple[nn.Module, str, nn.Module, MultiLoRAGatedLinear]] = []  # (parent, attribute, old, new)
        placed: set[str] = set()
        for index, (prefix, layer) in enumerate(layers):
            for name, module in layer.named_modules():
                path = f"{prefix}.{name}"
                if path not in wanted:
                    continue
                slot_weights = [None] * first + [adapter.modules.get(path) for adapter in adapters]
                parent = layer.get_submodule(name.rsplit(".", 1)[0]) if "." in name else layer
                swaps.append((parent, name.rsplit(".", 1)[-1], module,
                              MultiLoRAGatedLinear(module, slot_weights, self.routes[index])))
                placed.add(path)
        outside = sorted(wanted - placed)
        if outside:
            raise GateError(f"LoRA weights on {outside[:4]}{'...' if len(outside) > 4 else ''} are not inside a "
                            "decoder layer (or not in this model); gates route per layer, so train the capability "
                            "adapters on decoder-layer modules only (e.g. q_proj, v_proj, down_proj), not lm_head")

        # From here on the base is changed in place; `_restore_base` undoes all of it.
        self.base = base
        self.base_name_or_path = recorded_name_or_path(base)  # before any wrapping: as the caller loaded it
        self._requires_grad = [(parameter, parameter.requires_grad) for parameter in base.parameters()]
        for parameter in base.parameters():
            parameter.requires_grad_(False)
        self._swapped: list[tuple[nn.Module, str, nn.Module]] = []
        for parent, attribute, old, new in swaps:
            setattr(parent, attribute, new)
            self._swapped.append((parent, attribute, old))
        self.gate = gate
        device = next(base.parameters()).device
        self.gate.to(device)

        # Where the masked hard path stops and the grouped one (each token's own adapter only) starts, per module:
        # 0 = always grouped, math.inf = always masked (see multi_lora.py).
        self.masked_max_macs: float = MASKED_MAX_MACS
        self._hooks: dict[int, Callable[[RoutingEvent], None]] = {}
        self._next_hook = 0
        self._prompt_len: int | None = None
        self.assistant_header: tuple[int, ...] = ()  # token ids that open an assistant turn (set_assistant_header)
        self._forced_slot: int | None = None
        self._pool_mask: torch.Tensor | None = None  # [B, T] of the current pass
        self._new_sequence = True
        self._stored: dict[int, tuple[Selection, torch.Tensor]] = {}  # trajectory/global decisions, per layer key
        self._base_sha256: str | None = None  # base_weights_sha256, computed on first use (the base is frozen)
        self._embedding_sha256: str | None = None  # embedding_sha256 of its input embedding, likewise
        self._hook_handles = [base.register_forward_pre_hook(self._before_model, with_kwargs=True)]
        for index, (_, layer) in enumerate(layers):
            self._hook_handles.append(layer.register_forward_pre_hook(self._before_layer(index), with_kwargs=True))

    def _restore_base(self) -> None:
        """Undo what building did to the base model: the original Linears back in place, the routing hooks
        removed, each parameter's requires_grad as it was. The routed model cannot be used afterwards; the base can
        be routed again (build_capability_model does this when loading a gate fails)."""
        for handle in self._hook_handles:
            handle.remove()
        for parent, attribute, original in reversed(self._swapped):
            setattr(parent, attribute, original)
        for parameter, flag in self._requires_grad:
            parameter.requires_grad_(flag)
        self._hook_handles, self._swapped, self._requires_grad = [], [], []

    # -- Hugging Face surface ------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.base(*args, **kwargs)

    def generate(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """`base.generate`. Trajectory/global routing key: each row's first prompt (its tokens through the first
        assistant header, see the module docstring), within the input (the prompt window is at most the input
        width, so generated tokens never move the decision, with or without the KV cache). A multi-turn
        conversation is passed whole, turn after turn, and routes as its first turn did."""
        window = input_ids.shape[1] if input_ids is not None else None
        if window is not None and self._prompt_len is not None:
            window = min(window, self._prompt_len)  # an outer prompt_window(n) still holds
        with self.prompt_window(window):
            return self.base.generate(input_ids=input_ids, **kwargs)

    def get_base_model(self) -> nn.Module:
        return self.base

    @property
    def config(self) -> Any:
        return self.base.config

    @property
    def supports_prefix_cache(self) -> bool:
        """Whether keys/values cached by one pass may be continued by a later one (the prefix cache of
        train.backends.HFBackend). Token routing decides each token from its own hidden state, so a cached
        prefix is what a full pass computes; trajectory/global routing decides per sequence on the prefill
        pass, and a forced slot changes what every token computes, so those prefill everything."""
        return self.mode == "token" and self._forced_slot is None

    @property
    def supports_row_dropping(self) -> bool:
        """Whether a sampler may drop finished rows from a batch between decoding passes (train.backends.
        HFBackend). Trajectory/global routing keeps each row's decision from the prefill pass, by batch row."""
        return self.mode == "token"

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)

    @property
    def base_sha256(self) -> str:
        """`base_weights_sha256` of the (frozen) base, computed once."""
        if self._base_sha256 is None:
            self._base_sha256 = base_weights_sha256(self.base)
        return self._base_sha256

    @property
    def embedding_sha256(self) -> str:
        """`embedding_sha256` of the (frozen) base's input embedding, computed once."""
        if self._embedding_sha256 is None:
            self._embedding_sha256 = embedding_sha256(self.base.get_input_embeddings().weight)
        return self._embedding_sha256

    def gate_parameters(self) -> list[nn.Parameter]:
        return list(self.gate.parameters())

    # -- routing controls ------------------------------------------------------------------------------
    def set_assistant_header(self, token_ids: Sequence[int]) -> None:
        """The token ids that open an assistant turn (`assistant_header_ids(tokenizer)`): trajectory/global
        routing pools over each sequence's tokens through their first occurrence, its first prompt, so every
        turn of a conversation routes as the first did. Empty: no header, every pass pools over all its tokens."""
        ids = tuple(token_ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise GateError(f"the assistant header must be token ids (ints >= 0), got {list(ids)[:8]}")
        self.assistant_header = ids

    @contextlib.contextmanager
    def prompt_window(self, prompt_len: int | None) -> Iterator[None]:
        """Trajectory/global routing of a pass that starts a sequence pools over its first `prompt_len`
        columns at most (the first prompt, when the caller knows where it ends and the model has no header)."""
        previous, self._prompt_len = self._prompt_len, prompt_len
        try:
            yield
        finally:
            self._prompt_len = previous

    @contextlib.contextmanager
    def force_slot(self, slot: int | str) -> Iterator[None]:
        """Route every token to one slot (index or name): slot "base" is the base model itself."""
        index = self.slot_names.index(slot) if isinstance(slot, str) and slot in self.slot_names else slot
        if not isinstance(index, int) or not 0 <= index < self.n_slots:
            raise GateError(f"no slot {slot!r}; slots are {self.slot_names}")
        previous, self._forced_slot = self._forced_slot, index
        try:
            yield
        finally:
            self._forced_slot = previous

    def add_routing_hook(self, hook: Callable[[RoutingEvent], None]) -> Callable[[], None]:
        """Call `hook(event)` for every layer decision; returns a function that removes the hook."""
        key = self._next_hook
        self._next_hook += 1
        self._hooks[key] = hook
        return lambda: self._hooks.pop(key, None)

    @contextlib.contextmanager
    def record_routing(self, keep_logits: bool = False) -> Iterator[RoutingRecord]:
        """Collect the chosen slot per token and layer (and the gate logits, with gradients, if asked)."""
        record = RoutingRecord(keep_logits)
        remove = self.add_routing_hook(record)
        try:
            yield record
        finally:
            remove()

    # -- hooks -----------------------------------------------------------------------------------------
    def _before_model(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.mode == "token":  # every token routes on its own: nothing about the sequence to track
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        shape = ids.shape if ids is not None else embeds.shape[:2]
        batch, length = int(shape[0]), int(shape[1])
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        device = next(self.gate.parameters()).device
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            current = mask[:, -length:].to(device)  # [B, T]
        else:
            current = torch.ones((batch, length), dtype=torch.long, device=device)  # [B, T]
        self._new_sequence = past == 0
        if self._new_sequence:
            current = self._first_prompt_mask(ids, current)
            self._stored = {}
        self._pool_mask = current

    def _first_prompt_mask(self, ids: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        """The pooling mask [B, T] of a pass that starts sequences: the real tokens of each row's first prompt
        (through its first assistant header, within the prompt window)."""
        length = mask.shape[1]
        ends = torch.full((mask.shape[0],), length, dtype=torch.long, device=mask.device)  # [B]
        if self._prompt_len is not None:
            ends.clamp_(max=self._prompt_len)
        if ids is not None and self.assistant_header:
            header = torch.tensor(self.assistant_header, dtype=torch.long, device=mask.device)  # [L]
            ends = torch.minimum(ends, first_prompt_ends(ids.to(mask.device), mask, header))  # [B]
        columns = torch.arange(length, device=mask.device)  # [T]
        return mask * (columns[None, :] < ends[:, None]).to(mask.dtype)  # [B, T]

    def _before_layer(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]  # [B, T, H]
            self.routes[index].current = self._decide(index, hidden)
        return hook

    def _trajectory_selection(self, index: int, hidden: torch.Tensor) -> tuple[Selection, torch.Tensor | None]:
        """Per-sequence decision [B, S] for layer `index`: made on the prefill pass, reused while decoding."""
        key = 0 if self.mode == "global" else index
        batch = hidden.shape[0]
        if key in self._stored:
            selection, _ = self._stored[key]
            if selection.slots.shape[0] == batch:
                return selection, None
            if selection.slots.shape[0] == 1:  # a shared prefix run once, then continued per row
                weights = selection.weights.expand(batch, -1) if selection.weights is not None else None
                return Selection(weights, selection.slots.expand(batch)), None
            raise GateError(f"trajectory routing was decided for {selection.slots.shape[0]} rows, but this pass "
                            f"continues {batch}; start a new sequence (empty KV cache) to change the batch")
        if not self._new_sequence:
            raise GateError("trajectory/global routing needs the prompt: this pass continues a KV cache that was "
                            "filled without routing; run the prompt through the routed model first")
        gate = self.gate if self.mode == "global" else self.gate[index]
        logits = gate(hidden, self._pool_mask)  # [B, S]
        selection = gate.select(logits)
        self._stored[key] = (selection, logits)
        return selection, logits

    def _decide(self, index: int, hidden: torch.Tensor) -> Route:
        batch, length = hidden.shape[:2]
        logits: torch.Tensor | None
        if self._forced_slot is not None:
            slots = torch.full((batch, length), self._forced_slot, dtype=torch.long, device=hidden.device)
            weights, logits = None, None
        elif self.mode == "token":
            logits = self.gate[index](hidden)  # [B, T, S]
            selection = self.gate[index].select(logits)
            weights, slots = selection.weights, selection.slots  # [B, T, S], [B, T]
        else:
            selection, logits = self._trajectory_selection(index, hidden)  # [B, S], [B]
            weights = None
            if selection.weights is not None:
                weights = selection.weights[:, None, :].expand(batch, length, -1)  # [B, T, S]
            slots = selection.slots[:, None].expand(batch, length)  # [B, T]
        if self._hooks:
            event = RoutingEvent(index, slots, logits)
            for hook in list(self._hooks.values()):
                hook(event)
        if weights is not None and (weights.requires_grad or self.soft):
            return Route(weights=weights.reshape(batch * length, -1))  # dense: gradient reaches every slot
        return Route(slots=slots.reshape(-1), masked_max_macs=self.masked_max_macs)  # each module picks its path


# ----------------------------------------------------------------------------------------------------
# Building, saving, loading
# ----------------------------------------------------------------------------------------------------
def build_capability_model(base: nn.Module, adapters: Mapping[str, str | os.PathLike], gate: str | os.PathLike | None = None,
                           mode: str | None = None, include_base_slot: bool | None = None, *,
                           estimator: str | None = None, tau: float | None = None,
                           soft: bool | None = None) -> CapabilityModel:
    """Compose `base` (changed in place, frozen) with the PEFT LoRA adapters `{name: folder}` (slot order =
    mapping order, after slot 0 "base" when `include_base_slot`) under fresh zero-init gates, or the gate
    saved in `gate`.

    An option left None takes the saved gate's value, or without a gate the default: mode "token",
    include_base_slot True, estimator "straight_through", tau 1.0, soft False. With a saved gate:
    - mode, include_base_slot and soft (and the adapter list) are part of what the gate learned: an explicit
      value that differs from the saved one is refused (GateError), as are other adapters or another order;
    - estimator and tau only say how the gates are trained (moe_gate/gater.py), not what they learned: an
      explicit value is used even where the gate was saved with another, and is what the next `save_gate`
      records. So a caller that insists on straight-through updates (train/grpo_gater.py) gets them whatever
      estimator warm-started the gate, and loading a gate for inference needs no options at all.

    The model comes back in eval mode (hard top-1 routing, no dropout), as `from_pretrained` models do; a training
    loop calls `model.train()` itself.

    The saved gate's slots, mode, adapter weights and base architecture are checked before the base is touched;
    should a later check fail (the hash of the base's weights, the gate weights), the base is restored as it was
    (original Linears, no hooks, requires_grad unchanged), so the same base object can be routed again.
    """
    saved = read_gate_config(gate) if gate is not None else None
    if saved is not None:
        if mode is not None and mode != saved["mode"]:
            raise GateError(f"{gate}: the gate was trained for mode {saved['mode']!r}, not {mode!r}")
        if include_base_slot is not None and include_base_slot != saved["include_base_slot"]:
            raise GateError(f"{gate}: the gate has include_base_slot={saved['include_base_slot']}")
        if soft is not None and soft != saved.get("soft", False):
            raise GateError(f"{gate}: the gate was trained with soft={saved.get('soft', False)}, not soft={soft}; "
                            "leave soft unset to load it as saved, or train a new gate")
        mode, include_base_slot, soft = saved["mode"], saved["include_base_slot"], saved.get("soft", False)
        estimator = saved.get("estimator", "straight_through") if estimator is None else estimator
        tau = saved.get("tau", 1.0) if tau is None else tau
        requested = ([BASE_SLOT] if include_base_slot else []) + [str(name) for name in adapters]
        if saved["slots"] != requested:
            raise GateError(f"{gate}: the gate routes slots {saved['slots']} but this model has {requested}; "
                            "pass the same adapters in the same order")
    check_adapter_names([str(name) for name in adapters])  # before any adapter file is read
    files = [read_peft_adapter(name, path) for name, path in adapters.items()]
    if saved is not None:  # cheap checks of the saved gate, before the base is changed
        _check_adapter_weights(gate, saved, files)
        _check_architecture(gate, saved, base)
    model = CapabilityModel(base, files, mode=mode or "token",
                            include_base_slot=True if include_base_slot is None else include_base_slot,
                            estimator="straight_through" if estimator is None else estimator,
                            tau=1.0 if tau is None else tau, soft=bool(soft))
    if gate is not None:
        loaded = False
        try:
            load_gate(model, gate)
            loaded = True
        finally:
            if not loaded:  # refused (or interrupted): leave the caller's base as it was given
                model._restore_base()
    return model.eval()  # a new nn.Module starts in train mode; a trainer asks for it (model.train()) when it trains


def _check_adapter_weights(directory: str | os.PathLike, saved: Mapping[str, Any],
                           adapters: Sequence[AdapterFile]) -> None:
    """Each adapter's weights (sha256 of adapter_model.safetensors) and, for a gate that recorded it, the rank and
    scaling its adapter_config.json gives every module (`AdapterFile.scaling_sha256`) must be the trained ones."""
    for old, new in zip(saved["adapters"], adapters):
        if old["sha256"] != new.sha256:
            raise GateError(f"{directory}: adapter {new.name!r} at {Path(new.path).resolve()} is not the one the gate "
                            f"was trained with ({old['path']}, different weights); retrain the gate or pass that adapter")
        if "scaling_sha256" in old and old["scaling_sha256"] != new.scaling_sha256:  # a gate saved before: weights only
            raise GateError(f"{directory}: adapter {new.name!r} at {Path(new.path).resolve()} has the gate's weights but "
                            "another LoRA scaling (lora_alpha, alpha_pattern or use_rslora in its adapter_config.json "
                            f"changed since the gate was trained with {old['path']}); restore that adapter_config.json "
                            "or retrain the gate")


def _check_architecture(directory: str | os.PathLike, saved: Mapping[str, Any], base: nn.Module) -> None:
    for key in ARCHITECTURE_KEYS:
        mine = getattr(base.config, key, None)
        if saved["base_model"][key] != mine:
            raise GateError(f"{directory}: the gate was trained on base model {saved['base_model']['name_or_path']!r} "
                            f"({key}={saved['base_model'][key]}), this base has {key}={mine}")


def gate_config(model: CapabilityModel) -> dict[str, Any]:
    gate = model.gate if model.mode == "global" else model.gate[0]
    return {
        "format": GATE_FORMAT,
        "mode": model.mode,
        "include_base_slot": model.include_base_slot,
        "soft": model.soft,
        "estimator": gate.estimator,
        "tau": gate.tau,
        "slots": list(model.slot_names),
        "adapters": [{"name": a.name, "path": str(Path(a.path).resolve()), "sha256": a.sha256,
                      "scaling_sha256": a.scaling_sha256, "target_modules": a.target_modules} for a in model.adapters],
        "base_model": _base_identity(model.base, model.base_sha256, model.base_name_or_path, model.embedding_sha256),
        "num_parameters": sum(p.numel() for p in model.gate_parameters()),
    }


def gate_state(model: CapabilityModel) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().contiguous().cpu() for name, tensor in model.gate.state_dict().items()}


def save_gate(model: CapabilityModel, directory: str | os.PathLike, state: dict[str, torch.Tensor] | None = None,
              extra: dict[str, Any] | None = None) -> Path:
    """Write gate.safetensors + gate_config.json into `directory` (staged and fsynced, then renamed file by file)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = state if state is not None else gate_state(model)
    with staging_folder(directory, ".gate-", tensor_bytes(state.values()),
                        "the gate files there are unchanged") as staging:
        config = gate_config(model)
        if extra:
            config["training"] = extra
        save_file(state, str(staging / GATE_WEIGHTS), metadata={"format": GATE_FORMAT})
        (staging / GATE_CONFIG).write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        follow_umask(staging)  # safetensors writes 0600 files: give the gate the user's usual modes
        publish_staged(staging, directory, (GATE_WEIGHTS, GATE_CONFIG))  # config last: with a config, its weights
    return directory


def read_gate_config(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / GATE_CONFIG
    if not path.is_file() or not (Path(directory) / GATE_WEIGHTS).is_file():
        raise GateError(f"{directory}: not a gate folder (needs {GATE_CONFIG} and {GATE_WEIGHTS}; write one with "
                        "save_gate or `python -m train.train_router_sft`)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise GateError(f"{path}: not valid JSON ({err})") from None
    if config.get("format") != GATE_FORMAT:
        raise GateError(f"{path}: format {config.get('format')!r} is not {GATE_FORMAT!r}")
    return config


def read_gate_weights(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a gate folder's gate.safetensors; a file that is not safetensors raises GateError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(directory) / GATE_WEIGHTS
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise GateError(f"{path}: not a readable safetensors file ({err}); write the gate again with save_gate or "
                        "`python -m train.train_router_sft`") from None


def load_gate(model: CapabilityModel, directory: str | os.PathLike) -> None:
    """Load a saved gate into `model`, refusing one trained for other adapters, slots or another base model."""
    saved = read_gate_config(directory)
    if saved["slots"] != model.slot_names:
        raise GateError(f"{directory}: the gate routes slots {saved['slots']} but this model has {model.slot_names}; "
                        "pass the same adapters in the same order")
    _check_adapter_weights(directory, saved, model.adapters)
    _check_architecture(directory, saved, model.base)
    mine = gate_config(model)  # hashes the base's weights (once per model)
    differ = (f"{directory}: the base model's weights differ from {saved['base_model']['name_or_path']!r}, "
              "which the gate was trained on; load that base model")
    if "weights_sha256" in saved["base_model"]:
        if saved["base_model"]["weights_sha256"] != mine["base_model"]["weights_sha256"]:
            raise GateError(differ + " (the hash of its weights differs)")
    else:  # a gate saved before the hash: only its embedding probe can be compared
        if not torch.allclose(torch.tensor(saved["base_model"]["embedding_probe"]),
                              torch.tensor(mine["base_model"]["embedding_probe"]), rtol=1e-2, atol=1e-3):
            raise GateError(differ)
        warnings.warn(f"{directory}: saved without the hash of its base model's weights, so only a patch of the "
                      "embedding was compared; save the gate again (save_gate) on the right base to record it",
                      stacklevel=2)
    for key in ("mode", "include_base_slot", "soft"):
        if saved.get(key) != mine[key]:
            raise GateError(f"{directory}: the gate has {key}={saved.get(key)!r}, this model {mine[key]!r}")
    state = read_gate_weights(directory)
    device = next(model.gate.parameters()).device
    try:
        model.gate.load_state_dict({k: v.to(device) for k, v in state.items()})
    except RuntimeError as err:
        raise GateError(f"{directory}: gate weights do not fit this model: {err}") from None


def load_capability_model(directory: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu",
                          base_model: str | None = None) -> tuple[CapabilityModel, Any]:
    """(routed model, tokenizer) from a gate folder alone: it names the base model and the adapter folders.
    The model takes the tokenizer's assistant header, so trajectory/global routing keys on each conversation's
    first prompt (see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = read_gate_config(directory)
    source = base_model or saved["base_model"]["name_or_path"]
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise GateError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        base = AutoModelForCausalLM.from_pretrained(source, dtype=dtypes[dtype])
    except OSError as err:
        raise GateError(f"{directory}: cannot load its base model {source!r} ({err}); pass base_model=...") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    adapters = {entry["name"]: entry["path"] for entry in saved["adapters"]}
    model = build_capability_model(base.to(device), adapters, gate=directory)
    model.set_assistant_header(assistant_header_ids(tokenizer))  # trajectory/global: route once per conversation
    return model.eval(), tokenizer
