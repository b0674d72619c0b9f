"""The shared-prefix sampler's forward pass for Llama-family models, as plain tensor calls.

Why: a decoding step of the CPU demo's agent (4 layers, 192 wide) costs less in arithmetic than in transformers'
per-module Python: each layer runs ~15 module calls (projections, two RMSNorm modules plus Qwen3's per-head ones,
rotary helpers, the attention interface's dispatch) through hooks, kwargs checks and output records, ~40,000
module calls and ~10,000 RMSNorm modules of 4-5 tensor ops each in one 64-episode GRPO batch. Here a step is the
same computation as transformers' `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` /
`MistralForCausalLM` forward in inference, written against the modules' own weights (read at each call, so an
optimizer step or a re-merged LoRA copy is seen), with one fused RMSNorm per norm and the rotary embedding
applied to queries and keys together. With the compiled kernels (the sampler passes its `PackedLinears`), the
projections run on packed copies of the weights (train/small_linear.py: held by the sampler with its keys/values,
re-packed when a weight changes in place; as much memory again as the projections' weights) and the norms by
train/csrc/rms_norm.cpp (layers that read the same input, queries/keys/values and gate/up, as one projection);
without, by torch's `F.linear` and `torch.rms_norm`. Keys/values and attention go through the step as before
(`SharedPrefixStep.update` / `attend`), so the layout, the kernel and the merge are shared with the transformers
path. Equal to it up to float rounding: tests compare logits and sampled episodes on every family above.

A decoding step (one new token a row) runs, with the compiled kernels, as one call of train/csrc/decode_step.cpp
(`decode`): the same computation over the same packs, norms, attention kernel and slots, with the ~30 tensor calls
a layer that were left in Python (views, the rotary embedding, the key/value writes, SiLU, residual adds) done on
its own buffers. Measured on the demo's agent: ~2 ms of a 3.3 ms step at 4 rows was that Python, paid ~700 times
in a 64-episode GRPO batch. Tests compare it with the op-by-op path on every family (logits and keys/values).

Used only where that equality is what the code checks: float32 weights, a model of one of those types (exactly,
not a subclass) with plain `nn.Linear` projections (no LoRA layer: a PEFT policy is sampled through its merged
copy), SiLU MLPs and no sliding window. Anything else (a gated capability model, an unmerged adapter, bf16) runs
transformers' forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from train import cpu_kernels
from train.decode_attention import HEAD_DIMS
from train.small_linear import PackedLinears


class AttentionStep(Protocol):
    """Where a pass's keys/values go and how its queries attend (train/shared_prefix.py's SharedPrefixStep)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store key/value states [Bq, Hkv, Lq, D] of layer `layer_idx`."""

    def attend(self, layer_idx: int, query: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention output [Bq, Lq, Hq, D] of query [Bq, Hq, Lq, D] over what the layer holds."""

# model_type -> (transformers' causal-LM class, whether its attention normalises each head's queries and keys:
# Qwen3's q_norm / k_norm)
FAMILIES = {"llama": ("LlamaForCausalLM", False), "mistral": ("MistralForCausalLM", False),
            "qwen2": ("Qwen2ForCausalLM", False), "qwen3": ("Qwen3ForCausalLM", True)}


@dataclass(frozen=True)
class _Layer:
    attention: torch.nn.Module  # its q/k/v/o projections, q_norm/k_norm (Qwen3) and `scaling`
    mlp: torch.nn.Module  # gate/up/down projections
    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module


class SlotStore(Protocol):
    """The keys/values a decoding step reads and writes (train/shared_prefix.py's SharedPrefixStore)."""

    prefix: list[tuple[torch.Tensor, torch.Tensor]]  # per layer [1, Hkv, P, D]; empty: no prefix
    pool: list[tuple[torch.Tensor, torch.Tensor]]  # per layer [S, Hkv, C, D]

    @property
    def prefix_len(self) -> int: ...


class LeanForward:
    """`forward(step, input_ids, position_ids, keep)` -> logits of the kept positions, for a model `of(model)`
    accepted; `decode(store, slots, starts, tokens)` -> logits of one decoding step, every layer in one compiled
    call, where `fused`. Holds the modules, never copies of their weights (packed copies live in the
    `PackedLinears`)."""

    def __init__(self, model: torch.nn.Module, linears: PackedLinears | None = None, fuse_decoding: bool = True):
        body = model.model
        # with `linears` and the kernels built (decided once, for the call this forward serves): projections by
        # train/small_linear.py's loop (few rows; layers that read the same input as one) and RMSNorm by
        # train/csrc/rms_norm.cpp; else torch's ops
        self.linears = linears if linears is not None and cpu_kernels.available() else None
        self.model, self.body = model, body
        self.head_norms = FAMILIES[model.config.model_type][1]
        self.layers = [_Layer(layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)
                       for layer in body.layers]
        self.head_dim = self.layers[0].attention.head_dim
        self.fused = fuse_decoding and self._fusable()
        self._fused_weights: list[torch.Tensor] | None = None  # packed at the first decoding step

    @property
    def compiled(self) -> bool:
        return self.linears is not None

    @classmethod
    def of(cls, model: torch.nn.Module, linears: PackedLinears | None = None, fuse_decoding: bool = True
           ) -> "LeanForward | None":
        """A lean forward for `model`, or None where it does not apply (see the module docstring). With `linears`
        (the sampler's packs), the compiled kernels: projections by train/small_linear.py, RMSNorm by
        train/csrc/rms_norm.cpp, and with `fuse_decoding` whole decoding steps by train/csrc/decode_step.cpp;
        without, torch's ops."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in FAMILIES:
            return None
        family = config.model_type
        if (type(model).__name__, type(model).__module__) != (
                FAMILIES[family][0], f"transformers.models.{family}.modeling_{family}"):
            return None
        if getattr(config, "hidden_act", None) != "silu":  # (full attention only: the sampler checks that)
            return None
        if next(model.parameters()).dtype != torch.float32:
            return None
        projections = [model.lm_head] + [getattr(layer.self_attn, name) for layer in model.model.layers
                                         for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(layer.mlp, name) for layer in model.model.layers
                        for name in ("gate_proj", "up_proj", "down_proj")]
        if any(type(projection) is not torch.nn.Linear for projection in projections):
            return None
        return cls(model, linears, fuse_decoding)

    def _fusable(self) -> bool:
        """The fused decoding step computes what `forward` does for this model: compiled kernels, a CPU model,
        one epsilon for every norm and one attention scale (it takes one of each), a head size the attention
        kernel is built for, and a rotary embedding over whole heads."""
        if not self.compiled or self.model.lm_head.weight.device.type != "cpu" or self.head_dim not in HEAD_DIMS:
            return False
        norms = [self.body.norm] + [norm for layer in self.layers for norm in (layer.input_norm,
                                                                                 layer.post_attention_norm)]
        if self.head_norms:
            norms += [norm for layer in self.layers for norm in (layer.attention.q_norm, layer.attention.k_norm)]
        if len({norm.variance_epsilon for norm in norms}) != 1 or len({layer.attention.scaling
                                                                       for layer in self.layers}) != 1:
            return False
        probe = self.body.embed_tokens.weight[:1, None]  # [1, 1, E]
        cos, _ = self.body.rotary_emb(probe, torch.zeros((1, 1), dtype=torch.long, device=probe.device))
        return cos.shape[-1] == self.head_dim and cos.dtype == torch.float32

    def _project(self, modules: tuple[torch.nn.Linear, ...], hidden: torch.Tensor) -> list[torch.Tensor]:
        """Each module's linear map of hidden (layers that read the same input as one compiled call)."""
        if self.linears is not None:
            return self.linears.project(modules, hidden)
        return [F.linear(hidden, module.weight, module.bias) for module in modules]

    def _norm(self, module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """transformers' RMSNorm modules (weight * x / rms(x)) over hidden's last dimension, as one op: the
        compiled one (train/csrc/rms_norm.cpp) with the compiled kernels, else torch's."""
        if self.compiled:
            rows = hidden.reshape(-1, hidden.shape[-1]).contiguous()  # [N, D]
            return cpu_kernels.extension().rms_norm(rows, module.weight, module.variance_epsilon).view(hidden.shape)
        return torch.rms_norm(hidden, (hidden.shape[-1],), module.weight, module.variance_epsilon)

    @staticmethod
    def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (rotate-half convention): states [Bq, Lq, H, D], cos/sin [Bq, Lq, 1, D]."""
        first, second = states.chunk(2, dim=-1)
        return states * cos + torch.cat((-second, first), dim=-1) * sin

    def forward(self, step: AttentionStep, input_ids: torch.Tensor, position_ids: torch.Tensor,
                keep: int | torch.Tensor) -> torch.Tensor:
        """Logits [Bq, K, V] of input_ids [Bq, Lq] at position_ids [Bq, Lq]; `keep` as transformers'
        `logits_to_keep` (an int: the last so many positions; a tensor: those positions)."""
        hidden = self.body.embed_tokens(input_ids)  # [Bq, Lq, E]
        cos, sin = self.body.rotary_emb(hidden, position_ids)  # [Bq, Lq, D] each
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [Bq, Lq, 1, D]
        batch, width = input_ids.shape
        for index, layer in enumerate(self.layers):
            attention = layer.attention
            normed = self._norm(layer.input_norm, hidden)  # [Bq, Lq, E]
            query, key, value = (states.view(batch, width, -1, self.head_dim) for states in self._project(
                (attention.q_proj, attention.k_proj, attention.v_proj), normed))  # [Bq, Lq, H, D] each
            if self.head_norms:
                query, key = self._norm(attention.q_norm, query), self._norm(attention.k_norm, key)
            n_heads = query.shape[2]
            rotated = self._rotate(torch.cat((query, key), dim=2), cos, sin)  # [Bq, Lq, Hq+Hkv, D]
            query, key = rotated[:, :, :n_heads], rotated[:, :, n_heads:]
            step.update(key.transpose(1, 2), value.transpose(1, 2), index)  # [Bq, Hkv, Lq, D]
            attended = step.attend(index, query.transpose(1, 2), attention.scaling)  # [Bq, Lq, Hq, D]
            hidden = hidden + self._project((attention.o_proj,), attended.reshape(batch, width, -1))[0]
            normed = self._norm(layer.post_attention_norm, hidden)
            gate, up = self._project((layer.mlp.gate_proj, layer.mlp.up_proj), normed)
            hidden = hidden + self._project((layer.mlp.down_proj,), F.silu(gate) * up)[0]
        kept = hidden[:, -keep:] if isinstance(keep, int) else hidden[:, keep]  # [Bq, K, E]
        return self._project((self.model.lm_head,), self._norm(self.body.norm, kept))[0]  # [Bq, K, V]

    def decode(self, store: SlotStore, slots: list[int], starts: list[int], tokens: list[int]) -> torch.Tensor:
        """Logits [A, V] of one decoding step where `fused`: row a runs token tokens[a], writes its key/value at
        column starts[a] of slot slots[a] (position prefix + starts[a]) and attends to the prefix and its
        columns [0, starts[a]] — what `forward` computes over a SharedPrefixStep of one token a row, every
        layer in one call of train/csrc/decode_step.cpp. The packs are taken once per lean forward (one sampler
        call, during which the weights do not change)."""
        if not self.fused:
            raise ValueError("decode runs only where the fused step applies (LeanForward.fused)")
        if self._fused_weights is None:
            self._fused_weights = self._pack_for_decoding()
        embedding = self.body.embed_tokens.weight
        positions = torch.tensor([[store.prefix_len + start for start in starts]], device=embedding.device)  # [1, A]
        cos, sin = self.body.rotary_emb(embedding, positions)  # [1, A, D] each
        keys, values = zip(*store.pool)  # per layer [S, Hkv, C, D]
        if store.prefix_len:
            prefix_keys, prefix_values = ([part[0] for part in parts] for parts in zip(*store.prefix))  # [Hkv, P, D]
        else:
            prefix_keys = prefix_values = [keys[0].new_empty((keys[0].shape[1], 0, self.head_dim))] * len(keys)
        attention = self.layers[0].attention
        layer_weights, (final_norm, head, head_bias) = self._fused_weights[:-3], self._fused_weights[-3:]
        return cpu_kernels.extension().decode_step(
            tokens, embedding, cos[0], sin[0], layer_weights, final_norm, head, head_bias,
            self.model.lm_head.out_features, list(keys), list(values), prefix_keys, prefix_values, slots, starts,
            self.model.config.num_attention_heads, keys[0].shape[1], self.layers[0].mlp.gate_proj.out_features,
            self.body.norm.variance_epsilon, attention.scaling)  # [A, V]

    def _pack_for_decoding(self) -> list[torch.Tensor]:
        """decode_step.cpp's weights: per layer (input norm, q/k/v packed and bias, q norm, k norm, o packed and
        bias, post-attention norm, gate/up packed and bias, down packed and bias), then the final norm and the
        head packed and bias; empty tensors for norms a family has not."""
        none = self.model.lm_head.weight.new_empty(0)
        weights: list[torch.Tensor] = []
        for layer in self.layers:
            attention, mlp = layer.attention, layer.mlp
            weights += [layer.input_norm.weight.detach(),
                        *self.linears.packed(attention.q_proj, attention.k_proj, attention.v_proj),
                        attention.q_norm.weight.detach() if self.head_norms else none,
                        attention.k_norm.weight.detach() if self.head_norms else none,
                        *self.linears.packed(attention.o_proj), layer.post_attention_norm.weight.detach(),
                        *self.linears.packed(mlp.gate_proj, mlp.up_proj), *self.linears.packed(mlp.down_proj)]
        return weights + [self.body.norm.weight.detach(), *self.linears.packed(self.model.lm_head)]
